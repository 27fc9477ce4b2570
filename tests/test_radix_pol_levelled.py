"""LFU in the compiled radix loop (sage_eviction/_kind_levelled.pxi: the levelled
kind, the level the node's hits) against `LFUPolicy`, its pure-Python reference
(`LevelledRecencyPolicy`: a queue per level, a heap of levels).

As for sieve (tests/test_radix_pol_sieve.py): the same hypothesis-drawn operation sequence on
both, victim for victim, then drained (tests/radix_probe_ops.py), a golden order, and whole radix
rows compiled and in the Python loop on synthetic conversations and on the Mooncake conversation
trace at 5 %. Priority, the other levelled policy, stays in the Python loop: the compiled loop
keeps no request priority per node.
"""

from __future__ import annotations

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import given, settings
from radix_probe_ops import (
    HOT,
    Op,
    pinned_conversations,
    probe,
    probe_agrees,
    sequences,
    through_rebuilds,
)
from radix_rows import assert_same_rows

from engine_adapter.sim import radix_run
from sage_eviction.policies.lfu import LFUPolicy

# A missing build skips, which SAGE_REQUIRE_ALL=1 turns into a failure (conftest.py).
pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)


@settings(max_examples=200, deadline=None)
@given(drawn=sequences())
def test_the_probe_evicts_as_the_python_policy(drawn: tuple[list[Op], int]) -> None:
    """Victim for victim: levels rising with hits, blocks hit while locked (their level read
    when they come back), ties within a level by tick."""
    probe_agrees(LFUPolicy(), *drawn)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(drawn=sequences())
def test_the_probe_evicts_as_the_python_policy_long(drawn: tuple[list[Op], int]) -> None:
    probe_agrees(LFUPolicy(), *drawn)


@settings(max_examples=30, deadline=None)
@given(drawn=sequences(max_capacity=30, max_length=1000, ops=HOT, min_length=300))
def test_the_probe_through_heap_rebuilds(drawn: tuple[list[Op], int]) -> None:
    """Every block of a small pool cached, then hundreds of hits and flips without an eviction:
    the heap outgrows twice the evictable blocks (and 64) and is rebuilt from its live entries,
    perhaps several times, then drained in (level, tick) order. Many flips and few hits on up to
    30 blocks: some entries from before a rebuild are still live at the drain."""
    through_rebuilds(LFUPolicy(), *drawn)


def test_levels_then_ticks() -> None:
    """A golden order. Keys 0..5 inserted (ticks 1..6); 1 hit twice (ticks 7, 8: level 2); 0
    locked, hit while locked (tick 9), 4 hit (tick 10: level 1); 2 locked; 0 unlocked (its level
    read now: 1, its tick 9), 2 unlocked (level 0, its insert tick 3); 6 inserted (level 0, tick
    11). Level 0 by tick: 2, 3, 5, 6; level 1: 0, 4; level 2: 1. (Had 0's level not been read
    again, it would go at level 0 between 5 and 6.)"""
    reference = LFUPolicy()
    compiled = probe(reference, 8)
    for side in (reference, compiled):
        for key in range(6):
            side.insert(key)
        side.access(1)
        side.access(1)
        side.set_evictable(0, False)
        side.access(0)
        side.access(4)
        side.set_evictable(2, False)
        side.set_evictable(0, True)
        side.set_evictable(2, True)
        side.insert(6)
    expected = [2, 3, 5, 6, 0, 4, 1]
    assert [compiled.evict() for _ in range(7)] == expected == [reference.evict(1)[0] for _ in range(7)]
    assert compiled.evict() is None


def test_priority_stays_in_the_python_loop() -> None:
    """No request priority per node in the compiled loop: a priority row runs in Python."""
    assert_same_rows(pinned_conversations(), "priority", 40, max_running=2, expect_compiled=False)
