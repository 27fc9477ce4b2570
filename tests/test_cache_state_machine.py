"""Property test of the cache manager: random request streams over a small pool, with
`check_invariants()` after every step, for every registered online policy.

The stream draws prompts from a few shared prefixes (system prompts, multi-turn history) plus
short random suffixes, and interleaves allocate, decode growth, commit, finish, preempt, lookup,
pin/unpin, manual and background eviction, preemption choice, hot swaps, queue-aware
protection (a request queued with its cached prefix protected, then admitted or leaving the
queue) and pool reservations (an embedding batch's workspace, taken and released). Failed
calls must be clear errors that change nothing.
"""

from __future__ import annotations

import os

import pytest
from cache_snapshot import snapshot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import (
    NoEvictableBlocksError,
    PinLimitError,
    RequestTooLargeError,
)
from engine_adapter.cache.records import PinnedPrefix
from engine_adapter.cache.request import CacheRequest
from sage_eviction import available_policies

pytestmark = pytest.mark.slow  # real processes or long searches: out of the quick loop

ONLINE = available_policies(include_offline=False)

# At least 200 examples per policy in CI; the dev profile keeps its quick loop.
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
EXAMPLES = settings().max_examples if _PROFILE == "dev" else max(200, settings().max_examples)
STEPS = 25


class CacheMachine(RuleBasedStateMachine):
    """One manager, a set of running sequences and the tokens each has computed."""

    policy_name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.m: CacheManager
        self.tokens: dict[int, list[int]] = {}  # running sequence -> tokens with K/V
        self.tenants: dict[int, str | None] = {}
        self.pinned: list[PinnedPrefix] = []
        self.queued: dict[int, tuple[list[int], str | None]] = {}  # waiting request -> prompt, tenant
        self.next_id = 0
        self.now = 0.0
        self.prefixes: list[list[int]] = []
        self.reserved: dict[int, int] = {}  # reservation owner -> blocks

    def _clock(self) -> float:
        self.now += 1.0
        return self.now

    @initialize(
        num_blocks=st.integers(16, 32),
        block_size=st.integers(2, 4),
        ratio=st.sampled_from([0.0, 0.25, 0.5]),
        threshold=st.sampled_from([None, 0.5, 0.75]),
        protect=st.sampled_from([0.0, 0.25, 0.5]),
    )
    def setup(
        self, num_blocks: int, block_size: int, ratio: float, threshold: float | None, protect: float
    ) -> None:
        self.m = CacheManager(
            BlockAllocator(num_blocks, block_size),
            policy=self.policy_name,
            max_pinned_ratio=ratio,
            eviction_threshold=threshold,
            clock=self._clock,
            isolate_tenants=True,
            protect_queued=protect,
        )
        bs = block_size
        # shared prefixes: none, a system prompt of 2 blocks, a longer one, an unaligned one
        self.prefixes = [[], [1] * (2 * bs), [2] * (3 * bs) + [3] * bs, [4] * (bs + 1)]

    def _prompt(self, prefix: int, suffix: list[int]) -> list[int]:
        return self.prefixes[prefix] + suffix

    # ---- request lifecycle ----------------------------------------------------------------

    @rule(
        prefix=st.integers(0, 3),
        suffix=st.lists(st.integers(0, 3), max_size=10),
        tenant=st.sampled_from([None, "a", "b"]),
        priority=st.integers(0, 2),
    )
    def allocate(self, prefix: int, suffix: list[int], tenant: str | None, priority: int) -> None:
        prompt = self._prompt(prefix, suffix)
        if not prompt:
            return
        seq = self.next_id
        self.next_id += 1
        m = self.m
        request = CacheRequest(seq, prompt, tenant=tenant, priority=priority)
        expected = m.lookup(request)
        before = None if expected.fits else snapshot(m)
        try:
            alloc = m.allocate(request)
        except (NoEvictableBlocksError, RequestTooLargeError):
            assert not expected.fits
            assert snapshot(m) == before
            return
        assert expected.fits
        assert alloc.num_cached_blocks == expected.num_cached_blocks
        assert alloc.num_new_blocks == expected.num_new_blocks
        bs = m.block_size
        assert len(alloc.block_table) == -(-len(prompt) // bs)
        # the hit is the longest cached prefix (within the last-token cap)
        keys = m.sequence(seq).keys
        hit = alloc.num_cached_blocks
        if hit < min((len(prompt) - 1) // bs, len(keys)):
            assert len(m.radix.match(keys[: hit + 1])) == hit
        self.tokens[seq] = list(prompt)
        self.tenants[seq] = tenant

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 5))
    def decode(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens[seq]
        m = self.m
        for _ in range(n):
            needed = -(-(len(toks) + 1) // m.block_size) - len(m.sequence(seq).block_table)
            too_large = len(m.sequence(seq).block_table) + needed > m.num_blocks
            fails = too_large or needed > m.num_available_blocks
            before = snapshot(m) if fails else None
            try:
                got = m.reserve_tokens(seq, len(toks) + 1)
            except RequestTooLargeError:
                assert too_large and snapshot(m) == before
                return
            if got is None:
                assert fails and snapshot(m) == before
                return
            assert not fails
            toks.append(len(toks) % 4)
            self.m.touch_sequence(seq)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.commit_blocks(seq, self.tokens[seq])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), cache=st.booleans())
    def finish(self, data: st.DataObject, cache: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        used = self.m.allocator.num_used
        added = self.m.free_sequence(seq, toks, cache=cache)
        assert self.m.allocator.num_used <= used
        if cache:  # every full block it computed is now cached
            n_full = len(toks) // self.m.block_size
            found = self.m.lookup(
                CacheRequest(seq, [*toks, 0], tenant=self.tenants.pop(seq), recompute_last_token=False)
            )
            assert found.num_cached_blocks >= n_full
        else:
            assert added == 0

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), computed_frac=st.floats(0.0, 1.0))
    def preempt(self, data: st.DataObject, computed_frac: float) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        preemptions = self.m.preemptions
        computed = int(len(toks) * computed_frac)
        self.m.preempt(seq, toks, num_computed_tokens=computed)
        assert self.m.preemptions == preemptions + 1
        n_full = computed // self.m.block_size
        found = self.m.lookup(
            CacheRequest(seq, [*toks, 0], tenant=self.tenants.pop(seq), recompute_last_token=False)
        )
        assert found.num_cached_blocks >= n_full

    @rule(prefix=st.integers(0, 3), suffix=st.lists(st.integers(0, 3), max_size=6))
    def lookup(self, prefix: int, suffix: list[int]) -> None:
        m = self.m
        before = (m.allocator.num_free, len(m.radix), m.radix.num_evictable, m.stats().hit_rate)
        m.lookup(CacheRequest(self.next_id, self._prompt(prefix, suffix) or [0]))
        assert (m.allocator.num_free, len(m.radix), m.radix.num_evictable, m.stats().hit_rate) == before

    # ---- queue-aware protection ----------------------------------------------------------------

    @rule(
        prefix=st.integers(0, 3),
        suffix=st.lists(st.integers(0, 3), max_size=10),
        tenant=st.sampled_from([None, "a", "b"]),
    )
    def enqueue(self, prefix: int, suffix: list[int], tenant: str | None) -> None:
        prompt = self._prompt(prefix, suffix)
        if not prompt:
            return
        rid = self.next_id
        self.next_id += 1
        m = self.m
        request = CacheRequest(rid, prompt, tenant=tenant)
        hit = m.lookup(request).num_cached_blocks
        hits = m.stats().prefix_cache_hits_tokens
        protected = m.protect_queued_prefix(request)
        assert protected <= hit  # its cached head only
        assert protected == 0 or m.protect_queued > 0
        assert m.num_protected_blocks <= m.max_protected
        assert m.stats().prefix_cache_hits_tokens == hits  # protecting is no hit
        self.queued[rid] = (prompt, tenant)

    @invariant()
    def protected_prefixes_stay_cached(self) -> None:
        for path in self.m.protected_paths():
            assert all(self.m.radix.get(b.key) is b and not b.evictable for b in path)

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def admit_queued(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.queued)))
        prompt, tenant = self.queued[rid]
        m = self.m
        request = CacheRequest(rid, prompt, tenant=tenant)
        expected = m.lookup(request)
        before = None if expected.fits else snapshot(m)
        try:
            alloc = m.allocate(request)
        except (NoEvictableBlocksError, RequestTooLargeError):
            assert not expected.fits  # protections yield to any allocation that could succeed
            assert snapshot(m) == before
            return
        assert expected.fits
        assert alloc.num_cached_blocks == expected.num_cached_blocks
        assert m.release_queued(rid) == 0  # running: its protection ended at admission
        del self.queued[rid]
        self.tokens[rid] = list(prompt)
        self.tenants[rid] = tenant

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def leave_queue(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.queued)))
        del self.queued[rid]
        protected = self.m.num_protected_blocks
        released = self.m.release_queued(rid)
        assert self.m.num_protected_blocks <= protected
        assert self.m.release_queued(rid) == 0 <= released  # a second release is a no-op

    # ---- pins --------------------------------------------------------------------------------

    @rule(prefix=st.integers(1, 3))
    def pin(self, prefix: int) -> None:
        before = snapshot(self.m)
        try:
            handle = self.m.pin(self.prefixes[prefix])
        except PinLimitError:
            assert snapshot(self.m) == before
            return
        if handle.num_blocks:
            self.pinned.append(handle)

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        handle = self.pinned.pop(data.draw(st.integers(0, len(self.pinned) - 1)))
        self.m.unpin(handle)

    @invariant()
    def pinned_blocks_stay_cached(self) -> None:
        for handle in self.pinned:
            assert len(self.m.radix.match(handle.keys)) == handle.num_blocks

    # ---- eviction, preemption choice, swap -----------------------------------------------------

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        reclaimable = self.m.radix.num_reclaimable
        free = self.m.allocator.num_free
        got = self.m.evict(n)
        assert got == min(n, reclaimable)
        assert self.m.allocator.num_free == free + got

    @rule()
    def background_eviction(self) -> None:
        self.m.evict_to_threshold()
        threshold = self.m.eviction_threshold
        if threshold is not None and self.m.radix.num_reclaimable:
            assert self.m.allocator.num_used <= int(threshold * self.m.num_blocks)

    @precondition(lambda self: self.tokens)
    @rule(required=st.integers(0, 10))
    def choose_preemption_victims(self, required: int) -> None:
        victims = self.m.select_preemption_victims(required)
        assert set(victims) <= set(self.tokens)
        assert len(victims) == len(set(victims))
        if required > 0:
            freed = sum(len(self.m.sequence(s).block_table) for s in victims)
            assert freed >= required or len(victims) == len(self.tokens)
        else:
            assert victims == []

    @rule(n=st.integers(1, 12))
    def reserve(self, n: int) -> None:
        """A reservation evicts to make room and fails, changing nothing, only when free and
        reclaimable blocks together fall short."""
        m = self.m
        available = m.num_available_blocks
        before = snapshot(m)
        owner = self.next_id
        self.next_id += 1
        ids = m.reserve_blocks(owner, n)
        if ids is None:
            assert n > available
            assert snapshot(m) == before
            return
        assert n <= available and len(ids) == len(set(ids)) == n
        assert not any(m.allocator.is_free(b) for b in ids)
        self.reserved[owner] = n

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def release_reservation(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(self.reserved)))
        free = self.m.allocator.num_free
        assert self.m.release_reservation(owner) == self.reserved.pop(owner)
        assert self.m.release_reservation(owner) == 0
        assert self.m.allocator.num_free > free

    @invariant()
    def reservations_are_counted(self) -> None:
        assert self.m.num_reserved_blocks == sum(self.reserved.values())
        assert self.m.stats().reserved_blocks == sum(self.reserved.values())

    @rule(name=st.sampled_from(ONLINE))
    def swap(self, name: str) -> None:
        cached = {b.key: (b.block_id, b.ref_count, b.pin_count) for b in self.m.radix.blocks()}
        result = self.m.swap_policy(name)
        assert result.entries == len(cached)
        assert {b.key: (b.block_id, b.ref_count, b.pin_count) for b in self.m.radix.blocks()} == cached

    # ---- after every step ----------------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.m.check_invariants()
        assert set(self.m.sequence_ids()) == set(self.tokens)
        for seq, toks in self.tokens.items():
            assert len(self.m.sequence(seq).block_table) * self.m.block_size >= len(toks)

    @invariant()
    def stats_are_sane(self) -> None:
        stats = self.m.stats()
        assert 0.0 <= stats.hit_rate <= 1.0
        assert 0.0 <= stats.re_prefill_rate <= 1.0
        assert 0.0 <= stats.fairness_score <= 1.0 + 1e-9
        assert 0.0 <= stats.memory_utilization <= 1.0
        assert stats.used_blocks + stats.free_blocks == stats.total_blocks
        assert stats.pinned_blocks <= stats.cached_blocks

    def teardown(self) -> None:
        # drain: every running sequence can be released, and then nothing is referenced
        if not hasattr(self, "m"):
            return
        for rid in list(self.queued):
            self.m.release_queued(rid)
        for owner in list(self.reserved):
            self.m.release_reservation(owner)
        assert self.m.num_protected_blocks == 0
        for seq, toks in list(self.tokens.items()):
            self.m.free_sequence(seq, toks)
        self.m.check_invariants()
        assert all(b.ref_count == 0 for b in self.m.radix.blocks())
        assert self.m.num_available_blocks == self.m.num_blocks - self.m.radix.num_pinned


def _machine_for(policy: str) -> type[RuleBasedStateMachine]:
    return type(f"CacheMachine_{policy}", (CacheMachine,), {"policy_name": policy})


@pytest.mark.parametrize("policy", ONLINE)
def test_cache_state_machine(policy: str) -> None:
    machine = _machine_for(policy)
    machine.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()
