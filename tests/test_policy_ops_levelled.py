"""The C operations of lfu, priority, sieve and slru on the paths the generic sequences miss.

tests/test_policy_ops.py drives every compiled policy, built with its defaults, by sequences over
twelve keys whose evictions and removals keep the policy nearly empty: most hits miss, and a hit
at the same priority level, a key made evictable behind a newer one, or the SIEVE hand on an
entry that stops being evictable are rarely drawn. Dense sequences (four keys, weighted toward
inserts and hits) draw them often. Other paths need more: SLRU bounds its protected segment (and
demotes from it) only when given a capacity; the level heap of lfu/priority is rebuilt only after
17 stale levels, a level's side heap only after 64 stale entries; and the levelled queues call
`_level` only when `level_attr` is None. Each test drives a policy through its C table and its
twin through the Python methods, step by step, as the generic test does, and checks that the
path was taken.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policy_ops import OPERATIONS, _apply, _core, policy_state

from sage_eviction import EntryMeta, EvictionPolicy, create_policy

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)


def run_both(
    make: Callable[[], EvictionPolicy], operations: list[tuple[Any, ...]]
) -> tuple[EvictionPolicy, list[Any]]:
    """Drive `make()` through its C table and its twin through its methods, comparing outcomes
    and state after every step; the C-driven policy and its outcomes back."""
    compiled, reference = make(), make()
    caller = _core().PolicyOpsCaller(compiled)
    outcomes = []
    for step, op in enumerate(operations):
        outcome = _apply(compiled, caller, op)
        assert outcome == _apply(reference, reference, op), (step, op)
        assert policy_state(compiled) == policy_state(reference), (step, op)
        outcomes.append(outcome)
    assert compiled.entries() == reference.entries()
    assert compiled.peek(len(compiled)) == reference.peek(len(reference))
    return compiled, outcomes


DENSE_KEYS = st.integers(min_value=0, max_value=3)
# Weighted toward inserts and hits: drawn uniformly, evictions and removals keep the policy
# nearly empty, and most hits then miss (an unknown key).
DENSE_KINDS = ["insert"] * 3 + ["access"] * 4 + ["set_evictable"] * 2 + ["evict", "remove"]


def _dense_op(kind: str) -> st.SearchStrategy[tuple[Any, ...]]:
    if kind == "insert":
        return st.tuples(
            st.just(kind), DENSE_KEYS, st.builds(EntryMeta, priority=st.integers(0, 1)), st.booleans()
        )
    if kind == "access":
        return st.tuples(st.just(kind), DENSE_KEYS, st.floats(0, 1e6, allow_nan=False))
    if kind == "set_evictable":
        return st.tuples(st.just(kind), DENSE_KEYS, st.booleans())
    if kind == "evict":
        return st.tuples(st.just(kind), st.integers(1, 2))
    return st.tuples(st.just(kind), DENSE_KEYS)


DENSE = st.lists(st.sampled_from(DENSE_KINDS).flatmap(_dense_op), min_size=10, max_size=80)


# the quick loop keeps lfu; the full run all four
@pytest.mark.parametrize(
    "name", ["lfu", *(pytest.param(n, marks=pytest.mark.slow) for n in ("priority", "sieve", "slru"))]
)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=DENSE)
def test_dense_sequences(name: str, operations: list[tuple[Any, ...]]) -> None:
    run_both(lambda: create_policy(name), operations)


def test_sieve_moves_a_hand_whose_entry_is_pinned_in_c() -> None:
    # evicting 0 leaves the hand on 1; pinning 1 moves it on to 2, the next victim
    operations: list[tuple[Any, ...]] = [("insert", key, EntryMeta(), True) for key in range(4)]
    operations += [("evict", 1), ("set_evictable", 1, False)]
    sieve, _ = run_both(lambda: create_policy("sieve"), operations)
    assert sieve.hand == 2
    _, outcomes = run_both(lambda: create_policy("sieve"), [*operations, ("evict", 1)])
    assert outcomes[-1] == ("ok", [2])


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    operations=DENSE,
    threshold=st.integers(1, 3),
    ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
)
def test_slru_with_a_bounded_protected_segment(
    operations: list[tuple[Any, ...]], threshold: int, ratio: float
) -> None:
    run_both(
        lambda: create_policy("slru", capacity=4, protected_threshold=threshold, protected_ratio=ratio),
        operations,
    )


def test_slru_demotes_in_c() -> None:
    # A protected segment of one block. 0 and 1 are promoted while pinned (the segment counts
    # two); freeing 0 demotes it (the balance of set_evictable); promoting 2 demotes 1, the LRU
    # evictable protected block (the balance of access).
    operations: list[tuple[Any, ...]] = [
        ("insert", 0, EntryMeta(), False),
        ("insert", 1, EntryMeta(), False),
        *[("access", key, float(t)) for key in (0, 1) for t in (1, 2)],
        ("set_evictable", 0, True),
        ("set_evictable", 1, True),
        ("insert", 2, EntryMeta(), True),
        ("access", 2, 3.0),
        ("access", 2, 4.0),
    ]
    slru, _ = run_both(lambda: create_policy("slru", capacity=2, protected_ratio=0.5), operations)
    assert [slru.segment_of(key) for key in (0, 1, 2)] == ["probationary", "probationary", "protected"]
    _, outcomes = run_both(
        lambda: create_policy("slru", capacity=2, protected_ratio=0.5), [*operations, ("evict", 3)]
    )
    assert outcomes[-1] == ("ok", [0, 1, 2])


def test_slru_hit_moves_a_protected_block_in_c() -> None:
    # 0 and 1 protected in that order; a hit on 0 makes 1 the protected segment's LRU block
    operations: list[tuple[Any, ...]] = [("insert", key, EntryMeta(), True) for key in (0, 1)]
    operations += [("access", key, float(t)) for key in (0, 1) for t in (1, 2)]
    operations += [("access", 0, 3.0), ("evict", 1)]
    slru, outcomes = run_both(lambda: create_policy("slru"), operations)
    assert outcomes[-1] == ("ok", [1])
    assert slru.segment_of(0) == "protected"


def test_lfu_rebuilds_its_level_heap_in_c() -> None:
    # every hit moves key 0 one level up and leaves its old level stale in the heap
    operations: list[tuple[Any, ...]] = [("insert", 0, EntryMeta(), True), ("insert", 1, EntryMeta(), False)]
    operations += [("access", 0, float(t)) for t in range(40)]
    lfu, _ = run_both(lambda: create_policy("lfu"), operations)
    assert len(lfu._levels) < 20  # 41 without the rebuild
    _, outcomes = run_both(
        lambda: create_policy("lfu"), [*operations, ("set_evictable", 1, True), ("evict", 2)]
    )
    assert outcomes[-1] == ("ok", [1, 0])


def test_priority_rebuilds_a_side_heap_in_c() -> None:
    # key 0 comes back older than key 1 at its level (into the side heap), then leaves it: each
    # round leaves one stale heap entry, and 65 of them rebuild the heap
    operations: list[tuple[Any, ...]] = [("insert", 0, EntryMeta(), True), ("insert", 1, EntryMeta(), True)]
    operations += [("set_evictable", 0, flag) for _ in range(70) for flag in (False, True)]
    priority, _ = run_both(lambda: create_policy("priority"), operations)
    assert len(priority._queues[0].side) < 10  # 70 without the rebuild
    _, outcomes = run_both(lambda: create_policy("priority"), [*operations, ("evict", 2)])
    assert outcomes[-1] == ("ok", [0, 1])


def _lfu_levelled_by(level: Callable[[EntryMeta], Any]) -> Callable[[], EvictionPolicy]:
    def make() -> EvictionPolicy:
        policy = create_policy("lfu")
        # An instance that reads its level through `_level`: `level_attr` None says so, as
        # recency.py's contract asks of any `_level` that is not `getattr(meta, level_attr)`.
        policy.level_attr = None
        policy._level = level
        return policy

    return make


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_a_level_without_level_attr_is_read_through_level(operations: list[tuple[Any, ...]]) -> None:
    run_both(_lfu_levelled_by(operator.attrgetter("priority")), operations)


def test_the_level_method_decides_in_c() -> None:
    # an lfu instance levelled by priority: the block hit most but of low priority goes first
    operations = [
        ("insert", 0, EntryMeta(priority=0), True),
        ("insert", 1, EntryMeta(priority=2), True),
        ("access", 0, 1.0),
        ("access", 0, 2.0),
        ("evict", 1),
    ]
    _, outcomes = run_both(_lfu_levelled_by(operator.attrgetter("priority")), operations)
    assert outcomes[-1] == ("ok", [0])
