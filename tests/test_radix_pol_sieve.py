"""SIEVE in the compiled radix loop (sage_eviction/_kind_sieve.pxi) against
`SIEVEPolicy`, its pure-Python reference.

Two levels. Operation by operation: the same hypothesis-drawn sequence (inserts evictable or
not, hits, evictable flips both ways, evictions, keys coming back after their eviction) on the
Python policy and on `PolicyProbe`, every victim and every `num_evictable` equal, then both
drained to the end, so the hand and the bits left behind are compared too
(tests/radix_probe_ops.py). Whole rows: the radix row compiled and in the Python loop
(`radix_rows.assert_same_rows`: every field but timings, the TTFTs bit for bit) on synthetic
conversations at small pools and running limits, where locked chains, preemptions and cascades
of evictions happen, and on the shipped Mooncake conversation trace at 5 % of its distinct
blocks.
"""

from __future__ import annotations

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import given, settings
from radix_probe_ops import Op, probe, probe_agrees, sequences

from engine_adapter.sim import radix_run
from sage_eviction.policies.sieve import SIEVEPolicy

# A missing build skips, which SAGE_REQUIRE_ALL=1 turns into a failure (conftest.py).
pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)


@settings(max_examples=200, deadline=None)
@given(drawn=sequences())
def test_the_probe_evicts_as_the_python_policy(drawn: tuple[list[Op], int]) -> None:
    """Victim for victim; capacities down to one block make the hand wrap and rest on the head."""
    probe_agrees(SIEVEPolicy(), *drawn)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(drawn=sequences())
def test_the_probe_evicts_as_the_python_policy_long(drawn: tuple[list[Op], int]) -> None:
    probe_agrees(SIEVEPolicy(), *drawn)


def test_the_hand_skips_visited_and_locked_blocks() -> None:
    """A golden sweep: keys 0..4 in order, 0 and 2 hit, 3 locked and hit while locked. The hand
    clears 0, takes 1, rests on 2, clears it, passes by 3 (unlinked), takes 4, wraps to the tail
    and takes 0 (clear now), resting on 2. Key 3 unlocked re-enters at the head keeping its bit,
    then 5 is inserted: 2 goes, 3 is spared once (its bit), 5 goes, then 3."""
    reference = SIEVEPolicy()
    compiled = probe(reference, 8)
    for side in (reference, compiled):
        for key in range(5):
            side.insert(key)
        side.access(0)
        side.access(2)
        side.set_evictable(3, False)
        side.access(3)
    assert [compiled.evict() for _ in range(3)] == [1, 4, 0] == [reference.evict(1)[0] for _ in range(3)]
    for side in (reference, compiled):
        side.set_evictable(3, True)
        side.insert(5)
    assert [compiled.evict() for _ in range(3)] == [2, 5, 3] == [reference.evict(1)[0] for _ in range(3)]
    assert compiled.evict() is None and reference.evict(1) == []
