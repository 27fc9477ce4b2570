"""The cache manager: allocation with prefix hits, decode growth, caching on finish, eviction,
preemption choice, hot swap, metrics and clear errors that change nothing."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

import pytest
import torch
from cache_snapshot import snapshot

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import (
    BlockStateError,
    NoEvictableBlocksError,
    PinLimitError,
    RequestTooLargeError,
    SequenceExistsError,
    UnknownSequenceError,
)
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.records import PinnedPrefix
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.stats import CacheStats
from engine_adapter.model.kv_pool import PagedKVPool
from sage_eviction import PolicyParamError, UnknownPolicyError, available_policies

ONLINE = available_policies(include_offline=False)


class Clock:
    """A virtual clock: each read is one tick later."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def make(num_blocks: int = 16, block_size: int = 4, policy: str = "lru", **kw: Any) -> CacheManager:
    """A manager over a bare block allocator: the cache core needs no tensors."""
    return CacheManager(
        BlockAllocator(num_blocks, block_size), policy=policy, clock=kw.pop("clock", Clock()), **kw
    )


def tokens(seed: int, n: int) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


# ---- allocation and prefix hits ------------------------------------------------------------------


def test_allocate_fresh_then_hit_after_finish() -> None:
    m = make()
    prompt = tokens(1, 10)  # 2 full blocks and a partial one
    a = m.allocate(CacheRequest(1, prompt))
    assert (a.num_cached_blocks, a.num_cached_tokens, a.num_new_blocks) == (0, 0, 3)
    assert len(a.block_table) == 3 and m.allocator.num_used == 3
    assert m.free_sequence(1, prompt) == 2  # the two full blocks are cached
    assert m.allocator.num_used == 2 and m.num_cached_blocks == 2
    b = m.allocate(CacheRequest(2, [*prompt[:8], 7, 7, 7]))
    assert (b.num_cached_blocks, b.num_cached_tokens, b.num_new_blocks) == (2, 8, 1)
    assert b.block_table[:2] == a.block_table[:2]
    assert m.stats().hit_rate == pytest.approx(8 / 21)
    m.check_invariants()


def test_the_last_prompt_token_is_recomputed_unless_asked_not_to() -> None:
    m = make()
    prompt = tokens(1, 8)
    m.allocate(CacheRequest(1, prompt))
    m.free_sequence(1, prompt)
    hit = m.allocate(CacheRequest(2, prompt))
    assert hit.num_cached_blocks == 1  # the second block holds the last token: private
    m.free_sequence(2)
    full = m.allocate(CacheRequest(3, prompt, recompute_last_token=False))
    assert full.num_cached_blocks == 2 and full.num_new_blocks == 0
    m.check_invariants()


def test_lookup_predicts_allocate_and_changes_nothing() -> None:
    m = make(num_blocks=8)
    prompt = tokens(1, 12)
    m.allocate(CacheRequest(1, prompt))
    m.free_sequence(1, prompt)
    before = snapshot(m)
    request = CacheRequest(2, [*prompt, 1, 2])
    res = m.lookup(request)
    assert snapshot(m) == before
    assert (res.num_cached_blocks, res.num_cached_tokens, res.num_new_blocks) == (3, 12, 1)
    assert res.fits and res.num_available_blocks == 8 - 3
    got = m.allocate(request)
    assert got.num_cached_blocks == res.num_cached_blocks


def test_block_keys_instead_of_tokens() -> None:
    m = make(block_size=512, num_blocks=8)
    a = m.allocate(CacheRequest(1, block_keys=[11, 12, 13], num_tokens=1300, recompute_last_token=False))
    assert a.num_new_blocks == 3
    m.free_sequence(1)  # keys of full blocks known from the request: 11, 12
    b = m.allocate(CacheRequest(2, block_keys=[11, 12, 99], num_tokens=1536, recompute_last_token=False))
    assert (b.num_cached_blocks, b.num_cached_tokens) == (2, 1024)
    m.check_invariants()


def test_cache_salt_and_tenant_isolation() -> None:
    m = make()
    prompt = tokens(1, 9)
    m.allocate(CacheRequest(1, prompt, cache_salt="a"))
    m.free_sequence(1, prompt)
    assert m.lookup(CacheRequest(2, prompt, cache_salt="b")).num_cached_blocks == 0
    assert m.lookup(CacheRequest(2, prompt, cache_salt="a")).num_cached_blocks == 2
    assert m.lookup(CacheRequest(2, prompt, tenant="t")).num_cached_blocks == 0  # salt 'a' is not the default
    iso = make(isolate_tenants=True)
    iso.allocate(CacheRequest(1, prompt, tenant="t1"))
    iso.free_sequence(1, prompt)
    assert iso.lookup(CacheRequest(2, prompt, tenant="t2")).num_cached_blocks == 0
    assert iso.lookup(CacheRequest(2, prompt, tenant="t1")).num_cached_blocks == 2


def test_allocate_evicts_exactly_the_deficit() -> None:
    m = make(num_blocks=8)
    for seq in range(4):  # 4 cached chains of 2 blocks: the pool is full of cache
        m.allocate(CacheRequest(seq, tokens(seq, 8)))
        m.free_sequence(seq, tokens(seq, 8))
    assert m.allocator.num_free == 0 and m.num_cached_blocks == 8
    a = m.allocate(CacheRequest(10, tokens(10, 12)))
    assert a.num_evicted_blocks == 3 and m.allocator.num_free == 0
    assert m.num_cached_blocks == 5
    stats = m.stats()
    assert stats.total_evictions == 3 and stats.eviction_calls == 1
    assert stats.evictions_by_reason == {"alloc": 3}
    assert stats.evictions_by_policy == {"lru": 3}
    assert stats.memory_utilization == 1.0
    m.check_invariants()


def test_a_request_larger_than_the_pool_is_a_clear_error_that_changes_nothing() -> None:
    m = make(num_blocks=4)
    m.allocate(CacheRequest(1, tokens(1, 6)))
    m.free_sequence(1, tokens(1, 6))
    before = snapshot(m)
    with pytest.raises(RequestTooLargeError, match=r"needs 5 blocks .* pool has 4"):
        m.allocate(CacheRequest(2, tokens(2, 17)))
    assert snapshot(m) == before
    assert not m.has_sequence(2)
    m.check_invariants()


def test_no_evictable_blocks_is_distinct_and_changes_nothing() -> None:
    m = make(num_blocks=6)
    m.allocate(CacheRequest(1, tokens(1, 8)))
    m.free_sequence(1, tokens(1, 8))
    m.allocate(CacheRequest(2, [*tokens(1, 8), 5]))  # holds the cached path and one block
    m.allocate(CacheRequest(3, tokens(3, 4)))
    before = snapshot(m)
    with pytest.raises(NoEvictableBlocksError, match="needs 3 new blocks"):
        m.allocate(CacheRequest(4, tokens(4, 12)))
    assert snapshot(m) == before
    assert isinstance(NoEvictableBlocksError("x"), MemoryError)
    m.check_invariants()


def test_duplicate_and_unknown_sequence_ids() -> None:
    m = make()
    m.allocate(CacheRequest(1, tokens(1, 3)))
    with pytest.raises(SequenceExistsError):
        m.allocate(CacheRequest(1, tokens(2, 3)))
    with pytest.raises(UnknownSequenceError, match="no running sequence 9"):
        m.free_sequence(9)
    with pytest.raises(ValueError):
        m.allocate(CacheRequest(2))


# ---- decode growth ------------------------------------------------------------------------------------


def test_reserve_tokens_grows_one_block_at_a_time() -> None:
    m = make(num_blocks=8)
    m.allocate(CacheRequest(1, tokens(1, 4)))
    assert m.reserve_tokens(1, 4) == []
    new = m.reserve_tokens(1, 5)
    assert new is not None and len(new) == 1
    assert m.reserve_tokens(1, 8) == []
    assert m.sequence(1).num_tokens == 8
    assert len(m.block_table(1)) == 2
    m.check_invariants()


def test_extend_evicts_when_short_and_returns_none_when_nothing_can_be_freed() -> None:
    m = make(num_blocks=6)
    m.allocate(CacheRequest(1, tokens(1, 8)))
    m.free_sequence(1, tokens(1, 8))
    m.allocate(CacheRequest(2, tokens(2, 8)))
    m.allocate(CacheRequest(3, tokens(3, 8)))
    assert m.allocator.num_free == 0
    got = m.extend(2, 2)  # evicts the two cached blocks of sequence 1
    assert got is not None and len(got) == 2 and m.num_cached_blocks == 0
    before = snapshot(m)
    assert m.extend(2, 1) is None  # the pool holds running sequences only: preempt someone
    assert m.reserve_tokens(3, 9) is None
    assert snapshot(m) == before
    m.check_invariants()


def test_extend_beyond_the_pool_is_too_large() -> None:
    m = make(num_blocks=4)
    m.allocate(CacheRequest(1, tokens(1, 12)))
    with pytest.raises(RequestTooLargeError):
        m.extend(1, 2)


# ---- finishing, commit, duplicates -----------------------------------------------------------------


def test_generated_tokens_are_cached_on_finish() -> None:
    m = make()
    prompt = tokens(1, 6)
    m.allocate(CacheRequest(1, prompt))
    seq = [*prompt, 500, 501, 502]  # 9 tokens with K/V: 2 full blocks
    m.reserve_tokens(1, len(seq))
    assert m.free_sequence(1, seq) == 2
    assert m.lookup(CacheRequest(2, [*seq, 1])).num_cached_blocks == 2
    m.check_invariants()


def test_preempted_mid_prefill_caches_only_computed_blocks() -> None:
    m = make()
    prompt = tokens(1, 16)
    m.allocate(CacheRequest(1, prompt))
    assert m.preempt(1, prompt, num_computed_tokens=9) == 2
    assert m.stats().preemptions == 1
    assert m.lookup(CacheRequest(2, prompt)).num_cached_blocks == 2
    m.check_invariants()


def test_commit_blocks_shares_a_running_prefix() -> None:
    m = make()
    prompt = tokens(1, 9)
    m.allocate(CacheRequest(1, prompt))
    assert m.commit_blocks(1, prompt) == 2
    m.check_invariants()
    other = m.allocate(CacheRequest(2, [*prompt[:8], 4, 4]))
    assert other.num_cached_blocks == 2
    assert other.block_table[:2] == m.block_table(1)[:2]
    assert m.radix.get(m.sequence(1).keys[0]).ref_count == 2  # type: ignore[union-attr]
    m.free_sequence(1, prompt)
    m.free_sequence(2)
    m.check_invariants()
    assert m.allocator.num_used == 2 and m.num_cached_blocks == 2


def test_concurrent_duplicates_keep_one_copy() -> None:
    m = make()
    prompt = tokens(1, 8)
    m.allocate(CacheRequest(1, prompt))
    m.allocate(CacheRequest(2, prompt))  # both miss: nothing cached yet
    m.free_sequence(1, prompt)
    m.free_sequence(2, prompt)  # the second copy's blocks are freed, not cached twice
    assert m.num_cached_blocks == 2 and m.allocator.num_used == 2
    m.check_invariants()


def test_free_without_caching() -> None:
    m = make()
    m.allocate(CacheRequest(1, tokens(1, 8)))
    assert m.free_sequence(1, tokens(1, 8), cache=False) == 0
    assert m.allocator.num_used == 0
    m.check_invariants()


# ---- pins ------------------------------------------------------------------------------------------------


def test_pinned_prefix_is_never_evicted() -> None:
    m = make(num_blocks=6, max_pinned_ratio=0.5)
    system = tokens(9, 8)
    m.allocate(CacheRequest(1, [*system, 1]))
    m.free_sequence(1, [*system, 1])
    handle = m.pin(system)
    assert isinstance(handle, PinnedPrefix) and handle.num_blocks == 2
    assert m.stats().pinned_blocks == 2
    for seq in range(2, 8):
        m.allocate(CacheRequest(seq, tokens(seq, 12)))
        m.free_sequence(seq, tokens(seq, 12))
        assert m.lookup(CacheRequest(99, [*system, 1])).num_cached_blocks == 2
        m.check_invariants()
    assert m.unpin(handle) == 2
    m.allocate(CacheRequest(20, tokens(20, 24)))  # now the whole pool is needed
    assert m.lookup(CacheRequest(99, [*system, 1])).num_cached_blocks == 0
    m.check_invariants()


def test_pin_beyond_the_ratio_is_a_clear_error_that_changes_nothing() -> None:
    m = make(num_blocks=8, max_pinned_ratio=0.25)
    long = tokens(1, 12)
    m.allocate(CacheRequest(1, [*long, 0]))
    m.free_sequence(1, [*long, 0])
    before = snapshot(m)
    with pytest.raises(PinLimitError, match=r"max_pinned_ratio=0\.25"):
        m.pin(long)
    assert snapshot(m) == before
    m.pin(long[:8])
    m.check_invariants()


def test_unpin_by_tokens_and_unpin_errors() -> None:
    m = make(num_blocks=8)
    p = tokens(1, 8)
    m.allocate(CacheRequest(1, [*p, 0]))
    m.free_sequence(1, [*p, 0])
    m.pin(p[:4])
    assert m.unpin(p) == 1  # the leading pinned run
    with pytest.raises(BlockStateError):
        m.unpin(PinnedPrefix(tuple(m.sequence_ids()), 1, 0))


# ---- background eviction and manual eviction --------------------------------------------------------------


def test_evict_to_threshold() -> None:
    m = make(num_blocks=10, eviction_threshold=0.5)
    for seq in range(4):
        m.allocate(CacheRequest(seq, tokens(seq, 8)))
        m.free_sequence(seq, tokens(seq, 8))
    assert m.allocator.num_used == 8
    assert m.evict_to_threshold() == 3
    assert m.allocator.num_used == 5
    assert m.evict_to_threshold() == 0
    assert m.stats().evictions_by_reason == {"watermark": 3}
    assert make(eviction_threshold=None).evict_to_threshold() == 0
    with pytest.raises(ValueError):
        make(eviction_threshold=1.5)
    m.check_invariants()


def test_reset_prefix_cache_is_not_an_eviction() -> None:
    m = make()
    m.allocate(CacheRequest(1, tokens(1, 8)))
    m.free_sequence(1, tokens(1, 8))
    m.allocate(CacheRequest(2, tokens(2, 5)))
    assert m.reset_prefix_cache() == 2
    assert m.stats().total_evictions == 0 and m.allocator.num_used == 2
    m.check_invariants()


def test_reset_prefix_cache_forgets_earlier_evictions_for_the_re_prefill_rate() -> None:
    m = make(num_blocks=4)
    m.allocate(CacheRequest(1, tokens(1, 8)))
    m.free_sequence(1, tokens(1, 8))  # two cached blocks
    m.allocate(CacheRequest(2, tokens(2, 16)))  # needs all four: evicts both
    m.free_sequence(2, tokens(2, 16))
    assert m.stats().total_evictions == 2
    m.reset_prefix_cache()
    m.allocate(CacheRequest(3, tokens(1, 8)))  # blocks evicted before the reset come back
    assert m.stats().re_prefill_blocks == 0
    m.check_invariants()


# ---- preemption ------------------------------------------------------------------------------------------


def test_select_preemption_victims_uses_the_policy_order() -> None:
    m = make(num_blocks=16)
    for seq in range(4):
        m.allocate(CacheRequest(seq, tokens(seq, 8)))
    m.touch_sequence(0)  # now the most recent
    assert m.select_preemption_victims(2) == [1]
    assert m.select_preemption_victims(3) == [1, 2]
    assert m.select_preemption_victims(100, exclude=[2]) == [1, 3, 0]


def test_non_preemptible_sequences_are_never_chosen() -> None:
    m = make(num_blocks=16)
    m.allocate(CacheRequest(1, tokens(1, 4), non_preemptible=True))
    m.allocate(CacheRequest(2, tokens(2, 4)))
    assert m.select_preemption_victims(10) == [2]
    cands = m.preemption_candidates()
    assert {c.sequence_id: c.is_pinned for c in cands} == {1: True, 2: False}


def test_priority_policy_preempts_low_priority_first() -> None:
    m = make(num_blocks=16, policy="priority")
    m.allocate(CacheRequest(1, tokens(1, 4), priority=2))
    m.allocate(CacheRequest(2, tokens(2, 4), priority=0))
    m.allocate(CacheRequest(3, tokens(3, 4), priority=1))
    assert m.select_preemption_victims(1) == [2]


# ---- hot swap -------------------------------------------------------------------------------------------


def drive(m: CacheManager, rounds: range, shared: list[int]) -> None:
    for i in rounds:
        prompt = shared + tokens(i, 4 + i % 7)
        try:
            m.allocate(CacheRequest(i, prompt))
        except NoEvictableBlocksError:
            continue
        if i % 3:
            m.free_sequence(i, prompt)


PAIRS = [("lru", "arc"), ("arc", "s3fifo"), ("s3fifo", "lfu"), ("slru:protected_threshold=3", "priority"),
         ("fifo", "sieve"), ("gdsf", "lru"), ("predictive", "slo")]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), PAIRS)
def test_hot_swap_mid_stream_keeps_every_block(old: str, new: str) -> None:
    m = make(num_blocks=32, policy=old)
    shared = tokens(99, 8)
    drive(m, range(0, 20), shared)
    m.check_invariants()
    cached = {b.key: (b.block_id, b.ref_count, b.pin_count) for b in m.radix.blocks()}
    running = {s: m.block_table(s) for s in m.sequence_ids()}
    free = m.allocator.num_free
    result = m.swap_policy(new)
    assert result.entries == len(cached)
    # A real wall time, the one the stats report.
    assert 0.0 < result.swap_time_s < 60.0
    assert m.stats().last_swap_time_s == result.swap_time_s
    assert {b.key: (b.block_id, b.ref_count, b.pin_count) for b in m.radix.blocks()} == cached
    assert {s: m.block_table(s) for s in m.sequence_ids()} == running
    assert m.allocator.num_free == free
    m.check_invariants()
    drive(m, range(20, 40), shared)
    m.check_invariants()
    stats = m.stats()
    assert stats.policy == result.new_name and stats.policy_swaps == 1
    assert stats.last_swap_time_s == result.swap_time_s


def test_swap_response_shape_and_params() -> None:
    m = make()
    r = m.swap_policy("slru:protected_threshold=3")
    assert r.to_dict()["new"] == {"name": "slru", "params": {"protected_threshold": 3}}
    assert r.to_dict()["old"] == {"name": "lru", "params": {}}
    assert m.stats().params == {"protected_threshold": 3}
    assert m.stats().strategy == "SLRU"
    r2 = m.swap_policy("arc")
    assert r2.new_params == {}  # capacity comes from the pool and is not shown
    assert m.policy.capacity == 16


def test_swap_to_a_bad_spec_changes_nothing() -> None:
    m = make()
    drive(m, range(6), tokens(99, 4))
    before = snapshot(m)
    policy = m.policy
    with pytest.raises(UnknownPolicyError, match="available"):
        m.swap_policy("nope")
    with pytest.raises(PolicyParamError):
        m.swap_policy("lru:bogus=1")
    assert m.policy is policy and snapshot(m) == before


# ---- K/V read-back -----------------------------------------------------------------------------------------


def test_kv_reads_back_bit_identical_after_unrelated_churn() -> None:
    pool = PagedKVPool(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, num_blocks=24, device="cpu")
    m = CacheManager(pool.allocator, policy="lru", clock=Clock())
    gen = torch.Generator().manual_seed(7)
    prompt = tokens(1, 10)
    a = m.allocate(CacheRequest(1, prompt))
    slots = PagedKVPool.slot_mapping(a.block_table, 0, 10, pool.block_size)
    written = []
    for layer in range(pool.num_layers):
        k, v = torch.randn(10, 2, 4, generator=gen), torch.randn(10, 2, 4, generator=gen)
        pool.write(layer, slots, k, v)
        written.append((k, v))
    m.free_sequence(1, prompt)
    m.pin(prompt[:8])  # keep the cached part through the churn

    # unrelated traffic with its own writes, evictions and swaps
    for i, name in zip(range(2, 30), itertools.cycle(["arc", "s3fifo", "lfu", "lru"]), strict=False):
        p = tokens(i, 5 + i % 9)
        alloc = m.allocate(CacheRequest(i, p))
        s = PagedKVPool.slot_mapping(alloc.block_table, 0, len(p), pool.block_size)
        for layer in range(pool.num_layers):
            pool.write(layer, s, torch.full((len(p), 2, 4), float(i)), torch.full((len(p), 2, 4), -float(i)))
        m.free_sequence(i, p)
        if i % 5 == 0:
            m.swap_policy(name)
    assert m.stats().total_evictions > 0
    m.check_invariants()

    hit = m.allocate(CacheRequest(100, prompt))
    assert hit.num_cached_tokens == 8
    for layer, (k, v) in enumerate(written):
        got_k, got_v = pool.gather(layer, hit.block_table, 8)
        assert torch.equal(got_k, k[:8]) and torch.equal(got_v, v[:8])


# ---- metrics and misc ------------------------------------------------------------------------------------


def test_stats_have_the_api_shape() -> None:
    m = make()
    stats = m.stats()
    as_json = stats.to_dict()
    assert list(as_json) == [f.name for f in dataclasses.fields(CacheStats)]
    as_json["params"]["x"] = 1  # the JSON holds copies: the snapshot stays as it was
    assert stats.params == {}
    assert stats.strategy == "LRU" and stats.policy == "lru" and stats.params == {}
    assert stats.total_blocks == 16 and stats.free_blocks == 16 and stats.used_blocks == 0
    assert stats.last_swap_time_s is None
    assert stats.hit_rate == 0.0 and stats.re_prefill_rate == 0.0 and stats.fairness_score == 1.0


def test_re_prefill_rate_counts_evicted_blocks_requested_again() -> None:
    m = make(num_blocks=4)
    a, b = tokens(1, 8), tokens(2, 8)
    m.allocate(CacheRequest(1, [*a, 0]))
    m.free_sequence(1, [*a, 0])  # 2 cached
    m.allocate(CacheRequest(2, [*b, 0]))  # 3 needed, 2 free: evicts 1 block of a
    m.free_sequence(2, [*b, 0])
    assert m.stats().total_evictions == 1
    m.allocate(CacheRequest(3, [*a, 0]))  # a's evicted block is requested again
    stats = m.stats()
    assert stats.re_prefill_rate == pytest.approx(stats.re_prefill_blocks / stats.total_evictions)
    assert stats.re_prefill_blocks >= 1


def test_fairness_over_tenants() -> None:
    m = make(num_blocks=32)
    shared = tokens(1, 8)
    m.allocate(CacheRequest(1, [*shared, 0], tenant="a"))
    m.free_sequence(1, [*shared, 0])
    m.allocate(CacheRequest(2, [*shared, 0], tenant="a"))  # a: hits
    m.allocate(CacheRequest(3, tokens(3, 9), tenant="b"))  # b: misses
    rates = m.tenant_hit_rates()
    assert rates["b"] == 0.0 and rates["a"] > 0.0
    assert m.stats().fairness_score == pytest.approx(0.5)


def test_lock_is_reentrant_and_usable_from_another_thread() -> None:
    m = make()
    assert isinstance(m.lock, HandoffLock)  # reentrant, and handed to waiters between steps
    with m.lock:
        m.allocate(CacheRequest(1, tokens(1, 4)))
        with m.lock:
            m.stats()
    result: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: result.append(m.stats()))
    t.start()
    t.join(5)
    assert result and result[0].used_blocks == 1


def test_block_size_must_match_the_pool() -> None:
    with pytest.raises(ValueError, match="block_size=8"):
        CacheManager(BlockAllocator(4, 4), 8)


def test_policies_that_need_capacity_get_the_pool_size() -> None:
    for name in ONLINE:
        m = make(num_blocks=20, policy=name)
        cap = getattr(m.policy, "capacity", None)
        assert cap in (None, 20), name


def test_check_invariants_catches_a_leak() -> None:
    m = make()
    m.allocate(CacheRequest(1, tokens(1, 4)))
    m.allocator.allocate(1)  # a block nobody owns
    with pytest.raises(AssertionError, match="leak"):
        m.check_invariants()


def test_the_cache_layer_imports_no_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, engine_adapter, engine_adapter.cache.cache_manager, engine_adapter.cache.radix_cache, "
        "engine_adapter.cache.events, engine_adapter.cache.sizes, engine_adapter.cache.errors; "
        "print('torch' in sys.modules)"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"
