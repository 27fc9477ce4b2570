"""Regret (engine_adapter.cache.ghosts, accounting): a loop one block larger than the cache, where
LRU regrets every miss and Belady none; and the ghost set's properties."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.ghosts import Ghost, GhostSet, ReuseClock, ReuseTimes
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.cache_models import RadixBelady
from engine_adapter.sim.workloads import SimRequest

BS = 4


def _loop(policy: str, capacity: int, rounds: int) -> CacheManager:
    """Single-block requests cycling over ``capacity + 1`` keys, each freed (cached) after it."""
    keys: list[Hashable] = [f"k{i % (capacity + 1)}" for i in range(rounds * (capacity + 1))]
    manager = CacheManager(BlockAllocator(capacity, BS), policy=policy, record_events=False)
    belady = None
    if policy == "belady":  # the loop's future, one single-block request per key
        belady = RadixBelady([SimRequest(i, float(i), (key,), BS, 1) for i, key in enumerate(keys)])
        manager.radix.set_policy(belady)
    for position, key in enumerate(keys):
        if belady is not None:
            belady.serve([key], position + 1)
        request = CacheRequest(position, num_tokens=BS, block_keys=[key], recompute_last_token=False)
        manager.allocate(request)
        manager.free_sequence(position, block_keys=[key])
    return manager


def test_lru_regrets_every_miss_on_a_loop_one_block_larger_than_the_cache() -> None:
    capacity = 8
    stats = _loop("lru", capacity, rounds=6).stats()
    # every lookup misses; the first round's were never evicted (nor cached)
    assert stats.missed_blocks == 6 * (capacity + 1)
    assert stats.ghost_hits == stats.missed_blocks - (capacity + 1)
    assert stats.regrets == stats.ghost_hits
    assert stats.regret_ratio > 0.8
    assert stats.thrashing is False  # the window (256 missed blocks) is not full yet


def test_belady_never_regrets_on_the_same_loop() -> None:
    capacity = 8
    stats = _loop("belady", capacity, rounds=6).stats()
    assert 0 < stats.missed_blocks < 6 * (capacity + 1)  # it hits, unlike LRU
    assert stats.ghost_hits > 0  # it misses evicted blocks too, but none avoidably
    assert stats.regrets == 0
    assert stats.regret_ratio == 0.0


def test_a_long_lru_loop_is_thrashing() -> None:
    with capture_logs() as logs:  # 720 missed blocks: two full windows of 256, both thrashing
        stats = _loop("lru", 8, rounds=80).stats()
    warnings = [e for e in logs if e["event"] == "thrashing"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"  # once, when it turns on
    assert warnings[0]["threshold"] == 0.5 and warnings[0]["regret_ratio"] >= 0.5
    assert stats.thrashing is True
    assert stats.window_regret_ratio is not None and stats.window_regret_ratio >= stats.thrashing_threshold
    regret_ages = [h for h in stats.age_histograms if h.kind == "regret_age_seconds"]
    assert regret_ages and regret_ages[0].count == stats.regrets


def _ghost(i: int) -> Ghost:
    return Ghost(eviction_id=i, evicted_at=float(i), stamp=0, kept=1, policy="lru", tenant=None)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 6),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=80),
)
def test_the_ghost_set_is_bounded_and_hits_only_evicted_keys(
    capacity: int, ops: list[tuple[bool, int]]
) -> None:
    ghosts = GhostSet(capacity, horizon=4)
    evicted: set[int] = set()  # evicted and not yet asked for again
    for n, (evict, key) in enumerate(ops):
        if evict:
            ghosts.add(key, _ghost(n))
            evicted.add(key)
        else:
            _, found = ghosts.lookup([key], 0)  # a miss
            for _, ghost, _ in found:
                assert key in evicted  # a ghost hit only after an eviction of that key
                assert ghost.eviction_id == max(i for i, (e, k) in enumerate(ops[:n]) if e and k == key)
            evicted.discard(key)
            assert key not in ghosts
        assert len(ghosts) <= capacity


@settings(max_examples=60, deadline=None)
@given(horizon=st.integers(1, 5), keys=st.lists(st.integers(0, 7), max_size=200))
def test_the_reuse_clock_counts_distinct_keys_exactly_below_its_horizon(
    horizon: int, keys: list[int]
) -> None:
    clock = ReuseClock(horizon)
    stamps: list[int] = []
    for key in keys:
        if clock.full:
            remap = clock.compact()
            stamps = [remap(s) for s in stamps]
        stamps.append(clock.stamp())
        clock.access(key)
    for i, stamp in enumerate(stamps):
        assert clock.distinct_since(stamp) == min(horizon, len(set(keys[i:])))


@settings(max_examples=60, deadline=None)
@given(horizon=st.integers(1, 5), keys=st.lists(st.integers(0, 12), max_size=200))
def test_reuse_times_count_the_lookups_in_between(horizon: int, keys: list[int]) -> None:
    times = ReuseTimes(horizon)
    for i, key in enumerate(keys):
        got = times.access(key)
        before = [j for j in range(i) if keys[j] == key]
        if got is not None:  # a remembered key: exactly the lookups since its last one
            assert before and got == i - before[-1] - 1
        elif before:  # forgotten only when more than 2 * horizon other keys came since
            assert len(set(keys[before[-1] + 1 : i])) >= horizon


@pytest.mark.parametrize("horizon", [300, 1500])
def test_the_reuse_clock_is_exact_across_runs_and_compactions(horizon: int) -> None:
    """Past one run of positions (1024) and through compactions, against a brute-force count."""
    rng = random.Random(horizon)
    clock = ReuseClock(horizon)
    keys: list[int] = []
    stamps: list[int] = []
    while len(keys) < 12 * horizon:  # more than its 8 * horizon + 64 positions: compactions
        batch = rng.sample(range(3 * horizon), rng.randint(1, 40))  # one prompt's distinct keys
        if not clock.room(len(batch)):
            remap = clock.compact()
            stamps = [remap(s) for s in stamps]
        stamps += range(clock.stamp(), clock.stamp() + len(batch))
        clock.access_many(batch)
        keys += batch
    seen: set[int] = set()
    distinct_from = [0] * len(keys)  # distinct keys in keys[i:], by one pass from the end
    for i in range(len(keys) - 1, -1, -1):
        seen.add(keys[i])
        distinct_from[i] = len(seen)
    for i in range(0, len(keys), 7):
        assert clock.distinct_since(stamps[i]) == min(horizon, distinct_from[i])


def test_new_content_between_an_eviction_and_the_return_does_not_hide_a_regret() -> None:
    """Blocks never cached (a new prompt's) cannot be among the kept ones: they do not count."""
    ghosts = GhostSet(16, horizon=32)
    ghosts.lookup(["a", "b", "c", "x"], 4)  # four cached blocks hit
    ghosts.add(
        "x", Ghost(eviction_id=1, evicted_at=0.0, stamp=ghosts.stamp(), kept=3, policy="lru", tenant=None)
    )
    ghosts.lookup([f"new{i}" for i in range(10)], 0)  # ten fresh blocks, all missed
    _, found = ghosts.lookup(["a", "x"], 1)  # a hit, then the ghost: a, b, c were kept; only a came first
    assert [(i, ghost.eviction_id, regret) for i, ghost, regret in found] == [(1, 1, True)]
    ghosts.add(
        "y", Ghost(eviction_id=2, evicted_at=0.0, stamp=ghosts.stamp(), kept=2, policy="lru", tenant=None)
    )
    _, found = ghosts.lookup(["b", "c", "y"], 2)  # both kept blocks were needed first: no regret
    assert [(ghost.eviction_id, regret) for _, ghost, regret in found] == [(2, False)]
