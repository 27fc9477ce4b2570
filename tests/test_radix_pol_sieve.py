"""SIEVE in the compiled radix loop (engine_adapter/sim/_radix_pol_sieve.pxi) against
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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from radix_probe_ops import Op, conversations, pinned_conversations, probe, probe_agrees, sequences
from radix_rows import assert_same_rows

from engine_adapter.sim import radix_run
from engine_adapter.sim.workloads import Workload
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=conversations(), max_running=st.sampled_from([1, 2, 3, 8]), prefill=st.sampled_from([16, 64, 16384])
)
def test_synthetic_rows_compiled_and_in_python(
    drawn: tuple[Workload, int], max_running: int, prefill: int
) -> None:
    workload, capacity = drawn
    row = assert_same_rows(workload, "sieve", capacity, max_running=max_running, max_prefill_tokens=prefill)
    event(f"preemptions: {'some' if row['preemptions'] else 'none'}")


def test_a_synthetic_row_with_preemptions() -> None:
    """The drawn rows above reach preemptions (hypothesis's statistics show it); this one is
    pinned so that a run that stops preempting is noticed."""
    row = assert_same_rows(pinned_conversations(), "sieve", 40, max_running=2)
    assert row["preemptions"] > 0 and row["evictions"] > 100
