"""The ``sglang`` cache model against SGLang 0.5.23's own `RadixCache`, operation by operation.

Hypothesis draws sequences of inserts (with priorities and an ``inserted_len``; a request's
second insert of its key grown by its output), matches (of new keys and of inserted ones; some
locking the matched node), unlocks and evictions over a four-token alphabet (many shared
prefixes, many splits); each runs on SGLang's `RadixCache` (CPU, the real KV pool and allocator
of SGLang's test kit) and on `SGLangRadixTree`, and after every step both must agree on the
matched length, the evicted nodes (paths and token count), every node (path, lock count, hit
count, priority) and the evictable, protected and total sizes; SGLang's allocator must hold
every token the tree does not (nothing leaked, nothing freed twice).

SGLang stamps nodes with ``time.monotonic()``; two reads can tie on a coarse clock, and then its
heap orders the tied leaves by set iteration (object ids), which nothing can reproduce. The
hypothesis runs give `radix_cache` a clock that moves on by one at every read (the order SGLang
assumes); one plain test keeps SGLang's own clock.

Run (SGLang's venv; CI does not install SGLang):
    PYTHONPATH=$PWD ~/.cache/sage-kv/integrations/sglang-0.5.23/bin/python -m pytest -q \
        tests_integration/sglang/test_twin.py
"""

from __future__ import annotations

import itertools
import time
import types
from array import array
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache import radix_cache
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig

from engine_adapter.sim.twins.sglang_radix import SGLangRadixTree

KV_SIZE = 4096
POLICIES = [
    ("lru", None),
    ("lfu", None),
    ("fifo", None),
    ("mru", None),
    ("filo", None),
    ("priority", None),
    ("slru", {"protected_threshold": 2}),
]


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")


def tick_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """`radix_cache`'s clock: one tick per read (module docstring)."""
    ticks = itertools.count(1)
    clock = types.SimpleNamespace(monotonic=lambda: float(next(ticks)), perf_counter=time.perf_counter)
    monkeypatch.setattr(radix_cache, "time", clock)


def build(policy: str, config: dict[str, Any] | None, page_size: int) -> tuple[RadixCache, Any]:
    _, allocator, req_to_token_pool = fixtures.build_fixture(CacheConfig(kv_size=KV_SIZE))[:3]
    params = CacheInitParams(
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        disable=False,
        eviction_policy=policy,
        eviction_policy_config=config,
    )
    return RadixCache(params), allocator


def snapshot(cache: RadixCache) -> dict[tuple[int, ...], tuple[int, int, int]]:
    """SGLang's tree in `SGLangRadixTree.snapshot`'s form."""
    out = {}
    stack = [(child, ()) for child in cache.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + tuple(node.key.token_ids)
        out[path] = (node.lock_ref, node.hit_count, node.priority)
        stack.extend((child, path) for child in node.children.values())
    return out


class Pair:
    """SGLang's cache and the model, driven together; `check` compares them."""

    frees_duplicates = False  # RadixCache leaves the KV it already held to the caller to free

    def __init__(self, policy: str, config: dict[str, Any] | None, page_size: int) -> None:
        self.real, self.allocator = build(policy, config, page_size)
        self.model = SGLangRadixTree(page_size, policy, config)
        self.locks: list[tuple[Any, Any]] = []  # (SGLang's node, the model's node) per lock
        self.last: list[int] = []  # the last insert's tokens
        self.inserted: list[list[int]] = []

    def insert(self, tokens: list[int], priority: int, inserted_len: int) -> None:
        key = RadixKey(array("q", tokens)).page_aligned(self.real.page_size)
        value = self.allocator.alloc(len(key)) if len(key) else torch.empty(0, dtype=torch.int64)
        result = self.real.insert(
            InsertParams(key=key, value=value, priority=priority, inserted_len=inserted_len)
        )
        if result.prefix_len and not self.frees_duplicates:
            self.allocator.free(value[: result.prefix_len])  # the tree already held these
        assert result.prefix_len == self.model.insert(tokens, priority, inserted_len)
        self.last = tokens
        self.inserted.append(tokens)

    def again(self, which: int, lock: bool) -> None:
        """A later request with an earlier one's prompt: its whole path is hit and refreshed."""
        if self.inserted:
            self.match(self.inserted[which % len(self.inserted)], lock)

    def extend(self, more: list[int], priority: int) -> None:
        """The last request inserts again with its output appended (SGLang's checkpoint at
        release): what it inserted before counts no new hit."""
        done = len(self.last) // self.real.page_size * self.real.page_size
        self.insert(self.last + more, priority, done)

    def match(self, tokens: list[int], lock: bool) -> None:
        real = self.real.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        mine = self.model.match_prefix(tokens)
        assert real.device_prefix_len == mine.length
        if lock:
            assert self.real.inc_lock_ref(real.last_device_node).delta == self.model.inc_lock_ref(mine.node)
            self.locks.append((real.last_device_node, mine.node))

    def unlock(self, which: int) -> None:
        if self.locks:
            real, mine = self.locks.pop(which % len(self.locks))
            assert self.real.dec_lock_ref(real).delta == self.model.dec_lock_ref(mine)

    def evict(self, num_tokens: int) -> None:
        before = self.real_snapshot()
        freed = self.real.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
        victims = self.model.evict(num_tokens)
        assert freed == sum(len(node.key) for node in victims)
        gone = set(before) - set(self.real_snapshot())
        assert gone == {node.path() for node in victims}

    def real_snapshot(self) -> dict[tuple[int, ...], tuple[int, int, int]]:
        return snapshot(self.real)

    def check(self) -> None:
        assert self.real_snapshot() == self.model.snapshot()
        assert self.real.evictable_size() == self.model.evictable_size
        assert self.real.protected_size() == self.model.protected_size
        assert self.real.total_size() == self.model.total_size()
        assert self.allocator.available_size() + self.real.total_size() == KV_SIZE


class UnifiedPair(Pair):
    """The same against `UnifiedRadixCache` (Python TreeCore), the cache SGLang 0.5.23 serves
    with by default: its nodes are addressed by id, its lock deltas count the protected side, its
    sizes come as (device, host), it frees the KV it already held itself, and its clock is its
    own counter."""

    frees_duplicates = True

    def __init__(self, policy: str, config: dict[str, Any] | None, page_size: int) -> None:
        cfg = CacheConfig(kv_size=KV_SIZE, eviction_policy=policy, page_size=page_size)
        self.real, self.allocator = fixtures.build_fixture(cfg)[:2]
        self.model = SGLangRadixTree(page_size, policy, config)
        self.locks = []
        self.last = []
        self.inserted = []

    def match(self, tokens: list[int], lock: bool) -> None:
        real = self.real.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        mine = self.model.match_prefix(tokens)
        assert real.device_prefix_len == mine.length
        if lock:
            receipt = self.real.inc_lock_ref(real.last_device_node)
            assert receipt.delta == -self.model.inc_lock_ref(mine.node)
            self.locks.append((receipt, mine.node))

    def unlock(self, which: int) -> None:
        if self.locks:
            receipt, mine = self.locks.pop(which % len(self.locks))
            self.real.dec_lock_ref(receipt.node_id, receipt.to_dec_params())
            self.model.dec_lock_ref(mine)

    def real_snapshot(self) -> dict[tuple[int, ...], tuple[int, int, int]]:
        return unified_snapshot(self.real)

    def check(self) -> None:
        assert self.real_snapshot() == self.model.snapshot()
        assert self.real.evictable_size() == self.model.evictable_size
        assert self.real.protected_size() == self.model.protected_size
        assert self.real.total_size()[0] == self.model.total_size()
        assert self.allocator.available_size() + self.model.total_size() == KV_SIZE


def unified_snapshot(cache: Any) -> dict[tuple[int, ...], tuple[int, int, int]]:
    out = {}
    stack = [(child, ()) for child in cache.root_node.children.values()]
    while stack:
        node, prefix = stack.pop()
        path = prefix + tuple(node.key.token_ids)
        out[path] = (node.component_data[ComponentType.FULL].lock_ref, node.hit_count, node.priority)
        stack.extend((child, path) for child in node.children.values())
    return out


tokens = st.lists(st.integers(0, 3), max_size=24)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), tokens, st.integers(0, 3), st.sampled_from([0, 0, 4, 9])),
        st.tuples(st.just("extend"), tokens, st.integers(0, 3)),
        st.tuples(st.just("match"), tokens, st.booleans()),
        st.tuples(st.just("again"), st.integers(0, 50), st.booleans()),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(1, 6)),
        st.tuples(st.just("evict"), st.integers(1, 20)),
    ),
    min_size=1,
    max_size=60,
)


def run(pair: Pair, ops: list[tuple[Any, ...]]) -> None:
    for op, *args in ops:
        getattr(pair, op)(*args)
        pair.check()


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize(("policy", "config"), POLICIES, ids=[p for p, _ in POLICIES])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_model_is_sglangs_radix_cache(
    monkeypatch: pytest.MonkeyPatch, policy: str, config: dict[str, Any] | None, page_size: int, ops: list
) -> None:
    tick_clock(monkeypatch)
    run(Pair(policy, config, page_size), ops)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_model_is_sglangs_default_unified_radix_cache(
    monkeypatch: pytest.MonkeyPatch, policy: str, page_size: int, ops: list
) -> None:
    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    run(UnifiedPair(policy, None, page_size), ops)


def test_with_sglangs_own_clock_too() -> None:
    """No clock of ours: a multi-turn pattern (shared system prompt, chats growing turn by turn,
    locks held across evictions) under LRU, SGLang reading time.monotonic()."""
    pair = Pair("lru", None, 1)
    system = [7, 7, 1, 2, 3, 4]
    chats = {c: [*system, 10 + c] for c in range(6)}
    for turn in range(5):
        for c, chat in chats.items():
            pair.match(chat, lock=turn % 2 == 0)
            chat.extend([20 + turn, 30 + c, turn])
            pair.insert(chat, priority=0, inserted_len=0)
            if c == 5:
                pair.evict(12)  # a whole chat's leaf at least, under the locks of even turns
            pair.check()
        while pair.locks:
            pair.unlock(0)
            pair.check()
    assert pair.model.total_size() > 0
