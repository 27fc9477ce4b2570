"""The flat cache with its policy's state in C (`sage_eviction._core.FlatState`) against Python.

`FlatCache(int_keys=True)` runs every policy of the `flat` home (`compiled_kinds`: lru, fifo, mru,
filo, sieve, s3fifo, arc, lfu, gdsf, belady) in C over an int64 hash table and the policies' one C
home (sage_eviction/_kind_*.pxi), the re-prefill tracker's evicted keys in a second table. Its twin is
the pure-Python `FlatCache` (built inside `native.pure_python()`: the Python loop and the
policy's own methods): on hypothesis-drawn int key streams (negative keys, int64's ends, repeats;
given in chunks as the simulator gives a request's blocks) and on long seeded skewed streams,
both must give the same hits per chunk, the same victims in the same order, the same held keys,
counts and re-prefills, and the latency record's count and ring shape; the write of the decision
times into the record is held to `LatencyRecorder.record` value for value. The simulator's flat
rows on that path are the pure-Python rows, and `simulate_flat` takes it for int keys.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks
from sage_eviction import native
from sage_eviction.compiled_kinds import compiled_in
from sage_eviction.errors import PolicyStateError
from sage_eviction.flat import FlatCache, simulate_flat
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker
from sage_eviction.policies.lru import LRUPolicy
from sage_eviction.registry import create_policy

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

STATE_POLICIES = tuple(compiled_in("flat"))  # every policy of the flat home, each held to Python
LOW, HIGH = -(2**63), 2**63 - 1
KEYS = st.one_of(st.integers(-3, 30), st.sampled_from([LOW, LOW + 1, HIGH, HIGH - 1, 0]))
STREAMS = st.lists(st.lists(KEYS, min_size=0, max_size=12), min_size=1, max_size=30)
TIMINGS = ("wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us")


def _core() -> Any:
    core = native.load(native.CORE)
    assert core is not None
    return core


def test_the_core_runs_the_policies_this_file_tests() -> None:
    assert _core().flat_state_policies() == sorted(STATE_POLICIES)
    assert {"lru", "s3fifo", "arc", "lfu", "gdsf", "belady"} <= set(STATE_POLICIES)


def _state_cache(policy: str, capacity: int, future: list[int], window: int | None = None) -> FlatCache:
    cache = FlatCache(
        policy,
        capacity,
        future=future,  # belady's (the others ignore it)
        reprefill=ReprefillTracker(window),
        latency=LatencyRecorder(window=4),
        int_keys=True,
    )
    assert cache.policy_calls == "c-state"
    cache._state = _core().FlatState(
        cache.policy, capacity, reprefill=cache.reprefill, latency=cache.latency, record_victims=True
    )  # the same cache, its victims recorded
    return cache


def _python_cache(
    policy: str, capacity: int, future: list[int], window: int | None = None
) -> tuple[FlatCache, list[Any]]:
    victims: list[Any] = []
    with native.pure_python():
        cache = FlatCache(
            policy,
            capacity,
            future=future,
            reprefill=ReprefillTracker(window),
            latency=LatencyRecorder(window=4),
            on_evict=lambda victim, seconds: victims.append(victim),
        )
    assert cache.policy_calls == "python"
    return cache, victims


def _picture(cache: FlatCache, victims: list[Any]) -> dict[str, Any]:
    assert cache.reprefill is not None and cache.latency is not None
    return {
        "result": cache.result(),
        "len": len(cache),
        "keys": cache.keys(),
        "victims": victims,
        "re_prefilled": cache.reprefill.re_prefilled,
        "evictions": cache.reprefill.evictions,
        "latency_count": cache.latency.count,
        "ring": len(cache.latency._ring),
        "next": cache.latency._next,
    }


@pytest.mark.parametrize("policy", STATE_POLICIES)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=STREAMS, capacity=st.integers(1, 12), by_key=st.booleans(), window=st.sampled_from([None, 1, 3, 8])
)
def test_the_state_in_c_is_the_python_policy(
    policy: str, chunks: list[list[int]], capacity: int, by_key: bool, window: int | None
) -> None:
    """Line for line, the re-prefill counts included: over the whole run (a simulator row's
    tracker) or a window of the last evictions (the state keeps the tracker's window)."""
    future = [key for chunk in chunks for key in chunk]
    state = _state_cache(policy, capacity, future, window)
    reference, reference_victims = _python_cache(policy, capacity, future, window)
    for chunk in chunks:
        if by_key:  # `request` one key at a time, as `lookup` does inside
            assert [state.request(k) for k in chunk] == [reference.request(k) for k in chunk]
        else:  # a tuple (the simulator's block keys) or a list
            given_keys = tuple(chunk) if len(chunk) % 2 else chunk
            assert state.lookup(given_keys) == reference.lookup(chunk)
        for key in chunk:
            assert (key in state) == (key in reference)
    assert state._state.victims is not None
    assert _picture(state, state._state.victims) == _picture(reference, reference_victims)
    assert state._state.evicted_waiting == len(reference.reprefill._evicted)  # type: ignore[union-attr]


@pytest.mark.parametrize("policy", STATE_POLICIES)
@pytest.mark.parametrize("capacity", [3, 20, 64])
def test_long_skewed_streams_agree(policy: str, capacity: int) -> None:
    """Seeded streams long and wide enough for what small ones rarely reach: S3-FIFO's small
    queue above one block and its warm-up after the first eviction, ARC's target moving both
    ways with full ghost lists, sieve's hand going round many times."""
    rng = random.Random(capacity)
    hot = [rng.randrange(-(2**40), 2**40) for _ in range(capacity * 2)]  # reused keys
    keys = [rng.choice(hot) if rng.random() < 0.6 else rng.randrange(10 * capacity) for _ in range(6000)]
    state = _state_cache(policy, capacity, keys)
    reference, reference_victims = _python_cache(policy, capacity, keys)
    for at in range(0, len(keys), 17):
        chunk = keys[at : at + 17]
        assert state.lookup(tuple(chunk)) == reference.lookup(chunk)
    assert state._state.victims is not None
    assert _picture(state, state._state.victims) == _picture(reference, reference_victims)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.integers(1, 6),
    before=st.lists(st.floats(0, 1), max_size=14),
    calls=st.lists(st.lists(st.floats(0, 1), max_size=14), max_size=5),
)
def test_the_decision_times_are_written_as_record_writes_them(
    window: int, before: list[float], calls: list[list[float]]
) -> None:
    recorded, replayed = LatencyRecorder(window), LatencyRecorder(window)
    for seconds in before:  # a record already partly or wholly filled, its next slot anywhere
        recorded.record(seconds)
        replayed.record(seconds)
    state = _core().FlatState(LRUPolicy(), 4, latency=replayed)
    for times in calls:
        for seconds in times:
            recorded.record(seconds)
        state.replay_latency(times)
        assert (replayed._ring, replayed._next) == (recorded._ring, recorded._next)
        assert replayed.count == recorded.count
        assert replayed.total == recorded.total  # added one by one, in order: the same float


def test_keys_that_are_not_int64_are_refused_and_nothing_is_lost() -> None:
    cache = FlatCache("lru", 2, reprefill=ReprefillTracker(), int_keys=True)
    assert cache.lookup((5, 6)) == (0, False)
    with pytest.raises(TypeError):
        cache.request("a block")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.lookup([5, 1.5])  # the 5 is looked up before the float stops the call
    with pytest.raises(OverflowError):
        cache.lookup([2**63])
    assert (cache.requests, cache.hits, len(cache), cache.keys()) == (3, 1, 2, frozenset({5, 6}))
    assert cache.request(True) is False  # an int-like key is its index, as a dict finds it
    assert 1 in cache and cache.keys() == frozenset({5, 1})


def test_which_caches_keep_the_policys_state_in_c() -> None:
    assert FlatCache("lru", 4).policy_calls == "compiled"  # the keys were not said to be ints
    assert FlatCache("slru", 4, int_keys=True).policy_calls == "compiled"  # no state in C for slru
    hooked = FlatCache("lru", 4, int_keys=True, on_evict=lambda key, seconds: None)
    assert hooked.policy_calls == "compiled"  # a hook per block wants the Python loop
    plugin = type("PluginLRU", (LRUPolicy,), {"name": "plugin-lru"})()
    assert FlatCache(plugin, 4, int_keys=True).policy_calls == "python"  # a subclass: its own methods
    with native.pure_python():
        assert FlatCache("lru", 4, int_keys=True).policy_calls == "python"
    with pytest.raises(ValueError, match="fresh re-prefill tracker"):
        counted = ReprefillTracker()
        counted.on_evict(3)
        FlatCache("lru", 4, int_keys=True, reprefill=counted)
    assert FlatCache("belady", 4, int_keys=True).policy_calls == "compiled"  # no future: no state in C
    strayed = FlatCache("belady", 2, future=[1, 2, 3], int_keys=True)
    assert strayed.policy_calls == "c-state"
    assert strayed.lookup((1, 2)) == (0, False)
    with pytest.raises(PolicyStateError, match="diverge from the future at position 2: expected key 3"):
        strayed.request(4)
    assert strayed.request(3) is False
    with pytest.raises(PolicyStateError, match="past the end of the future"):
        strayed.request(3)
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(_core().FlatState(create_policy("lru"), 4))


@pytest.mark.parametrize("policy", STATE_POLICIES)
def test_simulate_flat_takes_the_state_in_c_for_int_keys(policy: str) -> None:
    keys = [(i * 7919) % 97 for i in range(3000)] + [-(2**63), 2**63 - 1] * 3
    fast = simulate_flat(keys, policy, 20)
    with native.pure_python():
        reference = simulate_flat(keys, policy, 20)
    assert fast == reference
    assert simulate_flat([str(k) for k in keys], policy, 20) == reference  # not ints: the other path


@pytest.mark.parametrize("policy", STATE_POLICIES)
@pytest.mark.parametrize("seed", [3, 11])
def test_the_flat_rows_are_the_pure_python_rows(policy: str, seed: int) -> None:
    workload = synthetic(requests=80, rate=20.0, seed=seed)
    capacity = max(1, unique_blocks(workload) // 10)
    fast = Simulator(workload, policy, capacity, cache_model="flat", cost_model=CostModel())
    fast_row = fast.run().to_dict()
    with native.pure_python():  # the policy built for the row and its cache: pure Python
        pure = Simulator(workload, policy, capacity, cache_model="flat", cost_model=CostModel())
        pure_row = pure.run().to_dict()
    assert (fast.policy_calls, pure.policy_calls) == ("c-state", "python")
    assert {k: v for k, v in fast_row.items() if k not in TIMINGS} == {
        k: v for k, v in pure_row.items() if k not in TIMINGS
    }


def test_a_workload_with_other_keys_runs_the_flat_row_through_the_table() -> None:
    requests = [SimRequest(i, i * 0.1, (f"k{i % 3}", f"x{i}"), input_len=32, output_len=2) for i in range(12)]
    workload = Workload(requests, block_size=16, source="synthetic")
    simulator = Simulator(workload, "lru", 3, cache_model="flat", cost_model=CostModel())
    simulator.run()
    assert simulator.policy_calls == "compiled"
