"""Per-salt quotas at the cache-manager level (issue 51, item 4; docs/architecture.md,
"Per-salt quotas").

A hypothesis state machine of admissions, commits, finishes, preemptions, evictions and quota
changes over two salts and none, on a small device pool with and without a host tier. The
test keeps its own record of which block keys are salt ``a``'s (its prompts hashed with its
salt), so the counts it checks are the tree's and the tiers', not the quota books'."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import block_hashes, format_block_key
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.quotas import MAX_QUOTA_SALTS, QuotaLimitError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig

BS = 2
POOL = 16
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7],
    [1, 2, 3, 4, 9, 9, 9],
    [7, 8, 7, 8, 0],
    [1, 2, 0],
    [5, 5, 6, 6, 7, 7, 8],
    [3, 3, 4, 4, 0],
]
SALTS = [None, "a", "b"]
MAX_RUNNING = 3  # 3 prompts of at most 4 blocks each, grown by 1: always fits the pool of 16


def grown(prompt: list[int]) -> list[int]:
    """`prompt` with every token the test's decode steps can append (40 + its position)."""
    return prompt + [40 + i for i in range(len(prompt), 10)]


def keys_of(salt: str) -> set[object]:
    """Every block key a sequence of `salt` can have, prompt or decoded (the test's own record
    of the salt's blocks)."""
    return {k for p in PROMPTS for k in block_hashes(grown(p)[:10], BS, salt=salt)}


A_KEYS = keys_of("a")
B_KEYS = keys_of("b")

Op = tuple[str, int, int]
ops = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, len(PROMPTS) - 1), st.integers(0, len(SALTS) - 1)),
    st.tuples(st.just("finish"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("preempt"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("commit"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("grow"), st.integers(0, 9), st.just(0)),
    st.tuples(st.just("evict"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("requota"), st.integers(0, 5), st.integers(0, 4)),
)


def device_blocks(m: CacheManager, keys: set[object]) -> int:
    return sum(1 for b in m.radix.blocks() if b.key in keys)


def host_only_blocks(m: CacheManager, keys: set[object]) -> int:
    store = m._tiers
    if store is None:
        return 0
    return sum(1 for k, e in store.host.entries.items() if k in keys and not e.on_device)


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(ops, max_size=50),
    device_quota=st.integers(0, 5),
    host_quota=st.sampled_from([None, 0, 1, 3]),
    host=st.sampled_from([0, 6]),
    compiled=st.booleans(),
)
def test_a_salt_never_holds_more_than_its_quota_and_no_request_is_refused(
    stream: list[Op], device_quota: int, host_quota: int | None, host: int, compiled: bool
) -> None:
    from engine_adapter.cache.radix_cache import CompiledRadixCache

    if compiled and CompiledRadixCache is None:
        compiled = False
    events = EvictionEventLog()
    m = CacheManager(
        BlockAllocator(POOL, BS),
        tiers=TierConfig(host_blocks=host) if host else None,
        event_log=events,
        compiled=compiled,
        clock=itertools.count().__next__,
    )
    m.set_quota("a", device_blocks=device_quota, host_blocks=host_quota)
    bound = device_quota  # the most salt a may hold: its quota, or what it held when lowered
    running: dict[int, list[int]] = {}
    next_id = itertools.count(1)
    for kind, x, y in stream:
        ids = sorted(running)
        if kind == "admit" and len(running) < MAX_RUNNING:
            sid, prompt = next(next_id), PROMPTS[x]
            # never refused: the running sequences' needs fit the pool, and a quota locks nothing
            m.allocate(CacheRequest(sid, prompt, cache_salt=SALTS[y]))
            running[sid] = list(prompt)
        elif kind in ("finish", "preempt", "commit", "grow") and ids:
            sid = ids[x % len(ids)]
            tokens = running[sid]
            if kind == "finish":
                m.free_sequence(sid, tokens)
                del running[sid]
            elif kind == "preempt":
                m.preempt(sid, tokens)
                del running[sid]
            elif kind == "commit":
                m.commit_blocks(sid, tokens)
            elif len(tokens) < 9:  # a decode step: one more token, never refused a block
                assert m.reserve_tokens(sid, len(tokens) + 1) is not None
                tokens.append(40 + len(tokens))
        elif kind == "evict":
            m.evict(x)
        elif kind == "requota":
            device_quota = x
            m.set_quota("a", device_blocks=device_quota, host_blocks=host_quota)
        m.take_moves()
        m.check_invariants()
        # a lowered quota is reached at the salt's own writes (its own blocks go first): until
        # then what it holds never grows, and once within the quota it stays within it
        held = device_blocks(m, A_KEYS)
        assert held <= max(bound, device_quota)
        bound = max(held, device_quota) if kind != "requota" else held
        if host_quota is not None:
            assert host_only_blocks(m, A_KEYS) <= host_quota
        # the quota's own evictions and host drops only ever touch salt a's blocks
        for event in events.tail():
            if event.get("reason") == "quota" and "block" in event:
                assert any(format_block_key(k) == event["block"] for k in A_KEYS), event


def test_the_quota_evicts_the_salts_own_blocks_and_another_salts_prefix_still_hits() -> None:
    m = CacheManager(BlockAllocator(64, BS), record_events=False)
    m.set_quota("a", device_blocks=3)
    b_prompt = [9, 9, 8, 8, 7, 7, 0]
    m.allocate(CacheRequest(1, b_prompt, cache_salt="b"))
    m.free_sequence(1, b_prompt)
    for sid in range(2, 12):  # salt a floods with distinct prompts
        prompt = [sid, sid, sid + 100, sid + 100, sid + 200, sid + 200, 0]
        m.allocate(CacheRequest(sid, prompt, cache_salt="a"))
        m.free_sequence(sid, prompt)
        assert device_blocks(m, keys_of_prompts("a", [prompt])) <= 3
        assert m.quota("a")["device_blocks_used"] <= 3  # type: ignore[index]
    view = m.quota("a")
    assert view is not None and view["device_evictions"] > 0
    again = m.allocate(CacheRequest(20, b_prompt, cache_salt="b"))
    assert again.num_cached_blocks == 3  # b's whole prefix, untouched by a's flood
    # the pool had room for everything: only the quota evicted
    assert m.stats().evictions_by_reason.get("quota", 0) == view["device_evictions"]


def keys_of_prompts(salt: str, prompts: list[list[int]]) -> set[object]:
    return {k for p in prompts for k in block_hashes(p[: len(p) // BS * BS], BS, salt=salt)}


def test_a_salt_with_nothing_evictable_does_not_cache_and_is_not_refused() -> None:
    m = CacheManager(BlockAllocator(32, BS), record_events=False)
    m.set_quota("a", device_blocks=1)
    first = [1, 1, 2, 2, 3, 3, 0]
    m.allocate(CacheRequest(1, first, cache_salt="a"))
    m.commit_blocks(1, first)  # one block cached (locked by it), the rest stays private
    assert device_blocks(m, A_KEYS | keys_of_prompts("a", [first])) == 1
    second = [4, 4, 5, 5, 0]
    m.allocate(CacheRequest(2, second, cache_salt="a"))  # admitted though a is at its quota
    m.free_sequence(2, second)  # its blocks are freed, not cached: a's only block is in use
    assert m.quota("a")["not_cached_blocks"] >= 2  # type: ignore[index]
    assert device_blocks(m, keys_of_prompts("a", [first, second])) == 1
    m.free_sequence(1, first)
    m.check_invariants()


def test_the_host_quota_drops_the_salts_own_oldest_host_blocks() -> None:
    m = CacheManager(BlockAllocator(8, BS), tiers=TierConfig(host_blocks=32), record_events=False)
    m.set_quota("a", host_blocks=2)
    prompts = [[s, s, s + 50, s + 50, 0] for s in range(1, 9)]
    for sid, prompt in enumerate(prompts, start=1):  # 2 blocks each: the pool of 8 turns over
        m.allocate(CacheRequest(sid, prompt, cache_salt="a"))
        m.free_sequence(sid, prompt)
        m.take_moves()
        assert host_only_blocks(m, keys_of_prompts("a", prompts)) <= 2
    view = m.quota("a")
    assert view is not None and view["host_drops"] > 0 and view["host_blocks_used"] == 2


def test_quotas_are_bounded_and_deleted() -> None:
    m = CacheManager(BlockAllocator(8, BS), record_events=False)
    for i in range(MAX_QUOTA_SALTS):
        m.set_quota(f"s{i}", device_blocks=1)
    with pytest.raises(QuotaLimitError, match="1024 salts"):
        m.set_quota("one-more", device_blocks=1)
    m.set_quota("s0", device_blocks=2)  # replacing an existing one is fine
    assert m.delete_quota("s0") and not m.delete_quota("s0")
    m.set_quota("one-more", host_blocks=3)
    assert m.quota("one-more") is not None and m.quota("s0") is None
    with pytest.raises(ValueError, match="device_blocks=-1"):
        m.set_quota("x", device_blocks=-1)


def test_every_policy_orders_the_salts_own_victims(policy_name: str, implementation: str) -> None:
    """With each registered policy (compiled and pure Python): the quota holds and its victims
    are the salt's own, one per block over."""
    m = CacheManager(BlockAllocator(64, BS), policy=policy_name, record_events=False)
    m.set_quota("a", device_blocks=4)
    b_prompt = [9, 9, 8, 8, 0]
    m.allocate(CacheRequest(1, b_prompt, cache_salt="b"))
    m.free_sequence(1, b_prompt)
    prompts = [[s, s, s + 100, s + 100, 0] for s in range(2, 10)]
    for sid, prompt in enumerate(prompts, start=2):
        m.allocate(CacheRequest(sid, prompt, cache_salt="a"))
        m.free_sequence(sid, prompt)
        assert device_blocks(m, keys_of_prompts("a", prompts)) <= 4
        m.check_invariants()
    assert device_blocks(m, keys_of_prompts("b", [b_prompt])) == 2  # b untouched
    view = m.quota("a")
    assert view is not None and view["device_evictions"] == 2 * len(prompts) - 4


def test_the_policy_chooses_among_the_salts_own_blocks() -> None:
    """LRU: the salt's least recently used blocks go, not the ones it just hit again."""
    m = CacheManager(BlockAllocator(64, BS), policy="lru", record_events=False)
    m.set_quota("a", device_blocks=4)
    first, second, third = [1, 1, 2, 2, 0], [3, 3, 4, 4, 0], [5, 5, 6, 6, 0]
    for sid, prompt in enumerate([first, second], start=1):
        m.allocate(CacheRequest(sid, prompt, cache_salt="a"))
        m.free_sequence(sid, prompt)
    again = m.allocate(CacheRequest(3, first, cache_salt="a"))  # first is used again: hot
    assert again.num_cached_blocks == 2
    m.free_sequence(3, first)
    m.allocate(CacheRequest(4, third, cache_salt="a"))
    m.free_sequence(4, third)
    assert device_blocks(m, keys_of_prompts("a", [first])) == 2  # kept: recently used
    assert device_blocks(m, keys_of_prompts("a", [second])) == 0  # the salt's LRU blocks went
    assert device_blocks(m, keys_of_prompts("a", [third])) == 2
