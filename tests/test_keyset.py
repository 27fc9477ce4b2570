"""The compact set of evicted keys (`sage_eviction.keyset`, the compiled `_core.KeySet`) against a
Python set: the same answers for every sequence of add, discard, in, len, remove_present and
clear, ints near the table's edges (0, negatives, int64's ends, beyond int64) and other keys."""

from __future__ import annotations

import copy
import pickle
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sage_eviction import get_policy_class, native
from sage_eviction.keyset import EvictedWindow, PyKeySet, new_key_set

_core = native.load(native.CORE)
IMPLEMENTATIONS = [PyKeySet] + ([_core.KeySet] if _core is not None else [])

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DENSE = 2**27  # the compiled set's bitmap holds [0, DENSE) (checked below: KEYSET_DENSE_LIMIT)
keys = st.one_of(
    st.integers(0, 40),  # few distinct keys: the same ones added and discarded again
    st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MAX, -1, 2**63, -(2**63) - 1, True, False]),
    st.sampled_from([63, 64, 65, 127, 128, 1023, 1024, 1025, DENSE - 1, DENSE, DENSE + 1]),  # bitmap edges
    st.integers(INT64_MIN, INT64_MAX),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.text(max_size=2),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), keys),
        st.tuples(st.just("discard"), keys),
        st.tuples(st.just("in"), keys),
        st.tuples(st.just("remove_present"), st.lists(keys, max_size=6)),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=300,
)


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__module__)
@settings(max_examples=150, deadline=None)
@given(ops=operations)
def test_same_answers_as_a_set(cls: type, ops: list[tuple[str, object]]) -> None:
    held = cls()
    reference: set[object] = set()
    for op, arg in ops:
        if op == "add":
            held.add(arg)
            reference.add(arg)
        elif op == "discard":
            held.discard(arg)
            reference.discard(arg)
        elif op == "in":
            assert (arg in held) == (arg in reference)
        elif op == "remove_present":
            back = reference.intersection(arg)  # type: ignore[call-overload]
            reference.difference_update(back)
            assert held.remove_present(arg) == len(back)
        else:
            held.clear()
            reference.clear()
        assert len(held) == len(reference)
        assert bool(held) == bool(reference)
    assert held == reference
    assert pickle.loads(pickle.dumps(held)) == reference
    assert copy.deepcopy(held) == reference


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
def test_many_consecutive_ids_grow_and_shrink() -> None:
    """Consecutive ids past the bitmap (in the table) through several doublings, then discarded
    in another order: the backward-shift deletion keeps every remaining key findable."""
    held = _core.KeySet()
    n = 50_000
    ids = range(DENSE, DENSE + n)
    held.update(ids)
    assert len(held) == n and all(k in held for k in ids[::7])
    assert held.remove_present(ids[::2]) == n // 2
    assert all((k in held) == (k % 2 == 1) for k in ids)
    assert held.table_bytes() <= 32 * n  # 8 bytes a slot, load above a quarter


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
def test_dense_ids_take_a_bit_each() -> None:
    """A trace's ids, dense from 0, are bits (the 10^8-lookup trace's 15 M evicted ids: 2 MB, not
    a 256 MB table); a hashed key beside them still goes to the table, and both are found."""
    assert _core.KEYSET_DENSE_LIMIT == DENSE
    held = _core.KeySet()
    n = 1_000_000
    held.update(range(n))
    assert held.table_bytes() <= n // 8 * 2  # bits, doubled at most
    held.add(DENSE)  # the first key past the bitmap: the table's
    held.add(-5)
    assert held.table_bytes() <= n // 8 * 2 + 16 * 8
    assert len(held) == n + 2 and DENSE in held and -5 in held and n - 1 in held and n not in held
    assert held.remove_present([0, 0, n - 1, DENSE, DENSE + 1]) == 3
    assert len(held) == n - 1 and 0 not in held and 1 in held and DENSE not in held
    assert sorted(held)[:3] == [-5, 1, 2]


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
def test_deletions_in_probe_runs_that_wrap_around_the_table() -> None:
    """Up to 7 keys in the first table (16 slots, so runs of probes often wrap from the last
    slot to the first), discarded one at a time in random orders: every other key stays found."""
    rng = random.Random(0)
    for _ in range(3000):
        keys = rng.sample(range(DENSE - 50, DENSE + 200), rng.randint(2, 7))  # mostly the table's
        held = _core.KeySet(keys)
        left = set(keys)
        for key in rng.sample(keys, len(keys)):
            held.discard(key)
            left.discard(key)
            assert all((k in held) == (k in left) for k in keys), (keys, key)
        assert len(held) == 0


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
def test_compact_where_the_core_is_used() -> None:
    assert type(new_key_set()) is _core.KeySet
    assert type(new_key_set(8)) is _core.KeySet and new_key_set(8).window == 8
    with native.pure_python():
        assert type(new_key_set()) is PyKeySet
        assert type(new_key_set(8)) is EvictedWindow


few_keys = st.one_of(  # few, so that a key is often evicted again while its older slot is still in the ring
    st.integers(0, 5), st.sampled_from(["a", (1, 2), INT64_MIN, DENSE, 2**63, True])
)
window_operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), few_keys),
        st.tuples(st.just("add"), few_keys),
        st.tuples(st.just("discard"), few_keys),
        st.tuples(st.just("in"), few_keys),
        st.tuples(st.just("remove_present"), st.lists(few_keys, max_size=3)),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=120,
)


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 6), ops=st.one_of(operations, window_operations))
# stale slots (key 0 added three times) must survive a pickle: the copy drops key 1 first too
@example(window=4, ops=[("add", 1), ("add", 0), ("add", 0), ("add", 0)])
def test_the_compiled_window_answers_as_the_reference(window: int, ops: list[tuple[str, object]]) -> None:
    """`KeySet(window=n)` against `EvictedWindow(n)`: the same ring, so the same keys held after
    every add (the oldest eviction dropped unless discarded or evicted again since), discard, in,
    remove_present and clear, ints and other keys mixed; the same slots in use (`held`)."""
    held, reference = _core.KeySet(window=window), EvictedWindow(window)
    for op, arg in ops:
        if op == "add":
            held.add(arg)
            reference.add(arg)
        elif op == "discard":
            held.discard(arg)
            reference.discard(arg)
        elif op == "in":
            assert (arg in held) == (arg in reference)
        elif op == "remove_present":
            assert held.remove_present(arg) == reference.remove_present(arg)  # type: ignore[arg-type]
        else:
            held.clear()
            reference.clear()
        assert len(held) == len(reference) <= window
        assert held.held == reference.held <= window
        assert set(held) == set(reference)
    copied = pickle.loads(pickle.dumps(held))
    assert copied.window == window and set(copied) == set(reference)
    copied.add("after")  # the copy's ring keeps the held keys' order: it drops the same one first
    reference.add("after")
    assert set(copied) == set(reference)


@pytest.mark.skipif(_core is None, reason="the compiled core is not built")
def test_the_compiled_window_is_bounded_by_its_size() -> None:
    """10^6 unique keys (dense ids, hashed ints, strings) through a window of 1,000: 1,000 held,
    the table and the ring sized for 1,000, not for the keys seen."""
    held = _core.KeySet(window=1000)
    for key in range(1_000_000):
        held.add(key if key % 3 else (key * 0x9E3779B97F4A7C15) % 2**62 if key % 2 else f"k{key}")
    assert len(held) == 1000 and held.held == 1000
    assert held.table_bytes() <= 1000 * 8 + 2048 * 16 * 2
    with pytest.raises(ValueError, match="window=0"):
        _core.KeySet(window=0)


@pytest.mark.parametrize("path", ["python", "c_table"])
def test_a_policy_that_stops_recording_evicted_keys_evicts_the_same(path: str) -> None:
    """The simulator's radix rows count re-prefills in the cache's tracker and stop the
    policy's own record: same victims, no keys held, no re-prefills counted by the policy."""
    if path == "c_table" and _core is None:
        pytest.skip("the compiled core is not built")
    policies = [get_policy_class("lru")(), get_policy_class("lru")()]
    policies[1].stop_recording_evicted()
    victims = []
    for policy in policies:
        calls = _core.PolicyOpsCaller(policy) if path == "c_table" else policy
        for key in (1, 2, 3):
            calls.insert(key)
        first = calls.evict(2)
        calls.insert(1)  # evicted, requested again
        victims.append((first, calls.evict(1)))
    assert victims[0] == victims[1] == ([1, 2], [3])
    assert policies[0]._re_prefills == 1 and set(policies[0]._evicted) == {2, 3}
    assert policies[1]._re_prefills == 0 and policies[1]._evicted is None


def test_a_radix_row_keeps_the_evicted_keys_once() -> None:
    from engine_adapter.sim.capacity import min_capacity
    from engine_adapter.sim.simulator import Simulator
    from engine_adapter.sim.synthetic import synthetic

    workload = synthetic(requests=50, seed=1)
    sim = Simulator(workload, "lru", min_capacity(workload))
    st = sim.start_run()
    sim.advance(st, float("inf"))
    assert st.cache is not None and st.cache.manager.policy._evicted is None
    assert len(st.cache.manager._metrics.reprefill._evicted) > 0
    # over the whole run, as the compiled radix loop counts (its KeySet gets the same window):
    # the engine's bounded window here split the Python rows from the compiled ones on long traces
    assert st.cache.manager._metrics.reprefill.window is None
    assert st.cache.manager.stats().re_prefill_window == 0
