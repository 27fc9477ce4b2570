"""Retention (issue 51, item 3): a hypothesis state machine over writes, hits, expiries (the
cache's clock, driven here), demotions and evictions, against the test's own record of which
blocks were granted a lifetime and until when; and examples of explicit writes, generated
tokens, the receipt and the bounds a client may ask.

What the machine holds after every step:
- with a lower tier big enough for every block, no retention is ever broken and every block
  granted a lifetime is resident in some tier until it expires;
- with a smaller one, a break happens only when the unexpired retained blocks could fill the last
  tier (every lower tier full of unexpired blocks);
- without a lower tier, retained blocks stay within `max_retained_fraction` of the pool, and a
  retained block is gone before its expiry only as a counted break or refusal;
- retention never refuses an admission nor a decode block that fits beside the running
  sequences' blocks (so it never causes a preemption);
- the cache's own invariants (`check_invariants`: pins path-closed, counts, tiers).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.retention import Retention, RetentionConfig
from engine_adapter.cache.tiers import TierConfig
from sage_eviction import create_policy

BS = 2
# prompts sharing prefixes, so that hits refresh lifetimes and siblings compete
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16], [1, 2, 3, 4, 17, 18]]
DISTINCT_BLOCKS = 12  # full blocks across PREFIXES (keys differ by parent)


class RetentionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m: CacheManager
        self.now = 0.0
        self.ids = itertools.count(1)
        self.running: dict[int, tuple[list[int], CacheRequest]] = {}
        self.granted: dict[object, float] = {}  # the test's record: key -> expiry
        self.tiered = False
        self.ample = False
        self.last_capacity = 0
        self.cap = 0
        self.broken = 0

    @initialize(
        num_blocks=st.integers(4, 9),
        lower=st.sampled_from(["none", "host", "host+disk", "ample"]),
        host_policy=st.sampled_from(["lru", "fifo", "lfu", "arc"]),
        device_policy=st.sampled_from(["lru", "fifo", "lfu", "s3fifo"]),
        fraction=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    )
    def setup(
        self, num_blocks: int, lower: str, host_policy: str, device_policy: str, fraction: float
    ) -> None:
        tiers = None
        if lower != "none":
            host = DISTINCT_BLOCKS if lower == "ample" else 2
            disk = 2 if lower == "host+disk" else 0
            tiers = TierConfig(host_blocks=host, disk_blocks=disk, host_policy=host_policy, disk_policy="lru")
            self.tiered, self.ample = True, lower == "ample"
            self.last_capacity = disk or host
        self.m = CacheManager(
            BlockAllocator(num_blocks, BS),
            policy=device_policy,
            tiers=tiers,
            clock=lambda: self.now,
            record_events=False,
            retention=RetentionConfig(max_ttl_s=50.0, max_retained_fraction=fraction),
        )
        self.cap = int(fraction * num_blocks)

    # ---- helpers --------------------------------------------------------------------------

    def _resident(self, key: object) -> bool:
        tiers = self.m.tiers
        return key in self.m.radix or (tiers is not None and tiers.entry(key) is not None)

    def _held_by_running(self) -> int:
        return len({b for sid in self.running for b in self.m.block_table(sid)})

    def _grant(self, keys: list[object], contract: CacheContract | None, start: float) -> None:
        """`keys` (in prompt order; None: a position not cached) retained as `contract` asks:
        its lifetime, shorter past its `short_ttl` point, bounded by --max-cache-ttl."""
        if contract is None or contract.ttl_s is None:
            return
        ttl, short = min(contract.ttl_s, 50.0), contract.short_ttl
        for i, key in enumerate(keys):
            if key is not None:
                until = start + (ttl if short is None or i < short[0] // BS else min(short[1], ttl))
                self.granted[key] = max(self.granted.get(key, until), until)

    # ---- steps ----------------------------------------------------------------------------

    @rule(
        prefix=st.integers(0, len(PREFIXES) - 1),
        ttl=st.sampled_from([None, 5.0, 30.0, 500.0]),
        short=st.sampled_from([None, 2, 4]),  # a shorter lifetime (5 s) past this token
    )
    def admit(self, prefix: int, ttl: float | None, short: int | None) -> None:
        sid = next(self.ids)
        tokens = PREFIXES[prefix] + [0]
        short_ttl = None if short is None else (short, 5.0)
        contract = CacheContract(ttl_s=ttl, short_ttl=short_ttl) if ttl is not None else None
        request = CacheRequest(sid, tokens, contract=contract, receipt=CacheReceipt(len(tokens)))
        needed = -(-len(tokens) // BS)
        try:
            self.m.allocate(request)
        except NoEvictableBlocksError:
            # never refused while it fits beside the running sequences' blocks
            assert needed > self.m.num_blocks - self._held_by_running()
            return
        except RequestTooLargeError:
            return
        self.m.take_moves()
        state = self.m.sequence(sid)
        if request.receipt is not None and request.receipt.retention_ttl_s != 0.0:
            self._grant([b.key for b in state.cached_path], contract, self.now)
        self.running[sid] = (tokens, request)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def finish(self, data: st.DataObject, preempt: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.running)))
        tokens, request = self.running.pop(sid)
        state = self.m.sequence(sid)
        keys, start = list(state.keys), state.created_at
        receipt = request.receipt
        assert receipt is not None
        refused_before = self.m.stats().retention_refused_blocks
        if preempt:
            self.m.preempt(sid, tokens)
        else:
            self.m.free_sequence(sid, tokens)
        self.m.take_moves()
        if self.m.stats().retention_refused_blocks == refused_before and receipt.retention_ttl_s != 0.0:
            self._grant([k if k in self.m.radix else None for k in keys], request.contract, start)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        """A decode step needs one more block: never refused while one is free of running ones."""
        sid = data.draw(st.sampled_from(sorted(self.running)))
        if len(self.m.block_table(sid)) >= self.m.num_blocks:
            return
        held = self._held_by_running()
        if self.m.extend(sid, 1) is None:
            assert held + 1 > self.m.num_blocks
        self.m.take_moves()

    @rule(dt=st.sampled_from([1.0, 4.0, 20.0, 60.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(n=st.integers(1, 3))
    def evict(self, n: int) -> None:
        self.m.evict(n)
        self.m.take_moves()

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def cache_is_consistent(self) -> None:
        if hasattr(self, "m"):
            self.m.check_invariants()

    @invariant()
    def each_retained_block_has_one_owner_and_nothing_else_does(self) -> None:
        """The owners (whom a break is billed to) die with their lifetimes: bounded as they are."""
        if hasattr(self, "m"):
            kept = self.m._retention
            assert kept.owners.keys() == kept.expiry.keys()

    @invariant()
    def retained_blocks_stay_until_they_expire(self) -> None:
        if not hasattr(self, "m"):
            return
        stats = self.m.stats()
        # the test's own record, pruned of what expired
        self.granted = {k: t for k, t in self.granted.items() if t > self.now}
        missing = [k for k in self.granted if not self._resident(k)]
        if self.ample:
            assert stats.retention_broken_blocks == 0
            assert not missing, f"{len(missing)} retained blocks dropped before their expiry"
        elif self.tiered:
            if stats.retention_broken_blocks > self.broken:
                # a break only when the unexpired retained blocks could fill the last tier
                assert len(self.granted) + 1 >= self.last_capacity
            assert len(missing) <= stats.retention_broken_blocks
        else:
            assert stats.retained_blocks <= self.cap  # within --max-retained-fraction
            assert len(missing) <= stats.retention_broken_blocks + stats.retention_refused_blocks
        self.broken = stats.retention_broken_blocks


TestRetentionMachine = RetentionMachine.TestCase
TestRetentionMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# ---- examples -------------------------------------------------------------------------------


def _manager(
    num_blocks: int = 8,
    *,
    tiers: TierConfig | None = None,
    max_pinned_ratio: float = 0.5,
    **retention: object,
) -> CacheManager:
    clock = [0.0]
    m = CacheManager(
        BlockAllocator(num_blocks, BS),
        max_pinned_ratio=max_pinned_ratio,
        clock=lambda: clock[0],
        record_events=False,
        tiers=tiers,
        retention=RetentionConfig(**retention),  # type: ignore[arg-type]
    )
    m.test_clock = clock  # type: ignore[attr-defined]
    return m


def test_explicit_writes_cache_only_up_to_the_breakpoint() -> None:
    m = _manager()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    receipt = CacheReceipt(len(prompt))
    m.allocate(CacheRequest(1, prompt, contract=CacheContract(write_tokens=4), receipt=receipt))
    m.free_sequence(1, prompt)
    assert len(m.radix) == 2  # blocks [1, 2] and [3, 4]; the rest freed at finish
    assert receipt.written_tokens == 4
    assert m.num_free_blocks == 8 - 2


def test_generated_tokens_are_freed_at_finish_unless_asked() -> None:
    prompt, output = [1, 2, 3, 4, 5], [6, 7, 8, 9]
    for cache_generated, cached in ((False, 2), (True, 4)):
        m = _manager(cache_generated=cache_generated)
        receipt = CacheReceipt(len(prompt))
        m.allocate(CacheRequest(1, prompt, receipt=receipt))
        assert m.reserve_tokens(1, len(prompt + output)) is not None
        m.commit_blocks(1, prompt + output)
        m.free_sequence(1, prompt + output)
        assert len(m.radix) == cached
        assert receipt.written_tokens == 4  # prompt blocks only, either way


def test_a_preempted_request_keeps_its_blocks_for_its_re_prefill() -> None:
    m = _manager(cache_generated=False)
    prompt, output = [1, 2, 3], [4, 5, 6]
    receipt = CacheReceipt(len(prompt))
    m.allocate(CacheRequest(1, prompt, receipt=receipt))
    m.reserve_tokens(1, 6)
    m.preempt(1, prompt + output)
    assert len(m.radix) == 3  # its generated blocks too, though generated tokens are not cached
    alloc = m.allocate(CacheRequest(1, prompt + output, receipt=receipt))
    assert alloc.num_cached_tokens == 4  # the last block holds the token it recomputes
    m.free_sequence(1, prompt + output)
    assert receipt.written_tokens == 2  # written once, never what it read


def test_usage_adds_up_on_a_hit() -> None:
    m = _manager()
    prompt = [1, 2, 3, 4, 5, 6, 7]
    m.allocate(CacheRequest(1, [*prompt[:4], 0]))
    m.free_sequence(1, [*prompt[:4], 0])
    receipt = CacheReceipt(len(prompt))
    alloc = m.allocate(CacheRequest(2, prompt, receipt=receipt))
    m.free_sequence(2, prompt)
    assert alloc.num_cached_tokens == 4
    assert receipt.written_tokens == 2  # block [5, 6]; the partial [7] is never cached
    assert receipt.written_tokens + alloc.num_cached_tokens <= len(prompt)


def test_a_shorter_lifetime_past_its_point_keeps_each_part_its_own() -> None:
    """Anthropic's "1h" block then a "5m" one: the prompt up to the first keeps the hour, the
    rest five minutes; the receipt counts the written tokens of each."""
    m = _manager(num_blocks=8, max_retained_fraction=1.0)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 0]  # four full blocks of 2 tokens
    receipt = CacheReceipt(len(prompt))
    contract = CacheContract(ttl_s=3600.0, short_ttl=(4, 300.0))
    m.allocate(CacheRequest(1, prompt, contract=contract, receipt=receipt))
    m.free_sequence(1, prompt)
    expiry = m._retention.expiry
    by_depth = {m.radix.get(k).depth: t for k, t in expiry.items()}  # type: ignore[union-attr]
    assert by_depth == {0: 3600.0, 1: 3600.0, 2: 300.0, 3: 300.0}
    assert (receipt.written_tokens, receipt.written_short_tokens) == (8, 4)
    m.test_clock[0] = 301.0  # type: ignore[attr-defined]
    assert m.evict(4) == 2  # the five-minute blocks lapsed; the hour's still held


def test_a_lifetime_is_bounded_by_max_cache_ttl_and_lapses() -> None:
    m = _manager(num_blocks=4, max_ttl_s=10.0, max_retained_fraction=1.0)
    receipt = CacheReceipt(5)
    m.allocate(CacheRequest(1, [1, 2, 3, 4, 0], contract=CacheContract(ttl_s=3600.0), receipt=receipt))
    m.free_sequence(1, [1, 2, 3, 4, 0])
    assert receipt.retention_ttl_s == 10.0
    assert m.stats().retained_blocks == 2 and m.num_pinned_blocks == 2
    assert m.evict(2) == 0  # held until they expire
    m.test_clock[0] = 10.5  # type: ignore[attr-defined]
    assert m.evict(2) == 2
    assert m.stats().retention_expired_blocks == 2 and m.stats().retention_broken_blocks == 0


def test_without_a_lower_tier_the_device_share_is_bounded_and_the_usage_says_so() -> None:
    m = _manager(num_blocks=8, max_retained_fraction=0.25)  # 2 blocks
    receipt = CacheReceipt(7)
    prompt = [1, 2, 3, 4, 5, 6, 0]
    m.allocate(CacheRequest(1, prompt, contract=CacheContract(ttl_s=60.0), receipt=receipt))
    m.free_sequence(1, prompt)
    assert m.stats().retained_blocks == 2
    assert m.stats().retention_refused_blocks == 1
    assert receipt.retention_ttl_s == 0.0


def test_retention_pins_give_way_to_a_request_rather_than_refuse_it() -> None:
    m = _manager(num_blocks=4, max_retained_fraction=1.0, max_pinned_ratio=1.0)
    first = [1, 2, 3, 4, 5, 6, 7, 8]
    m.allocate(CacheRequest(1, first, contract=CacheContract(ttl_s=600.0)))
    m.free_sequence(1, first)
    assert m.stats().retained_blocks == 4
    m.allocate(CacheRequest(2, [9, 10, 11, 12, 13]))  # needs 3 blocks: three pins break
    stats = m.stats()
    assert stats.retention_broken_blocks == 3 and stats.retained_blocks == 1
    m.check_invariants()


def test_with_a_host_tier_a_retained_block_is_demoted_not_dropped() -> None:
    m = _manager(num_blocks=4, tiers=TierConfig(host_blocks=2))
    retained = [1, 2, 3, 4, 0]
    m.allocate(CacheRequest(1, retained, contract=CacheContract(ttl_s=600.0)))
    m.free_sequence(1, retained)
    for sid, base in enumerate((10, 20, 30, 40), start=2):  # plain traffic that turns the pool over
        prompt = [base, base + 1, base + 2, base + 3, 0]
        m.allocate(CacheRequest(sid, prompt))
        m.free_sequence(sid, prompt)
        m.take_moves()
    assert m.stats().retention_broken_blocks == 0
    hit = m.allocate(CacheRequest(9, retained))
    assert hit.num_cached_tokens == 4 and hit.num_host_blocks == 2  # both kept below the device


@pytest.mark.parametrize("ttl", [None, 0.0, -1.0])
def test_no_lifetime_asked_grants_none(ttl: float | None) -> None:
    m = _manager()
    receipt = CacheReceipt(5)
    m.allocate(CacheRequest(1, [1, 2, 3, 4, 0], contract=CacheContract(ttl_s=ttl), receipt=receipt))
    m.free_sequence(1, [1, 2, 3, 4, 0])
    assert receipt.retention_ttl_s is None and m.stats().retained_blocks == 0


def test_a_block_read_then_written_again_after_a_preemption_is_not_a_write() -> None:
    m = _manager()
    m.allocate(CacheRequest(1, [1, 2, 0]))
    m.free_sequence(1, [1, 2, 0])
    prompt = [1, 2, 3]
    receipt = CacheReceipt(len(prompt))
    alloc = m.allocate(CacheRequest(2, prompt, receipt=receipt))
    assert alloc.num_cached_tokens == 2  # read: billed as cached
    m.preempt(2, prompt)
    m.evict(8)  # the block it read is gone; its re-prefill writes it again
    m.allocate(CacheRequest(2, prompt, receipt=receipt))
    m.free_sequence(2, prompt)
    assert len(m.radix) == 1
    assert receipt.written_tokens == 0  # written + cached never exceeds the prompt


# ---- the break's choice: the retention heap walked in order, held to a scan ---------------------


@dataclass(frozen=True)
class _Block:
    """What `Retention.grant` reads of a cached block when a lower tier exists (no pins)."""

    key: int
    depth: int


@settings(max_examples=200)
@given(
    grants=st.lists(
        st.tuples(st.integers(0, 40), st.integers(1, 6), st.integers(1, 50)), min_size=1, max_size=60
    ),
    forgotten=st.sets(st.integers(0, 40), max_size=10),
    eligible=st.sets(st.integers(0, 40)),
    limit=st.integers(0, 60),
)
def test_the_first_to_expire_is_the_scans_choice(
    grants: list[tuple[int, int, int]], forgotten: set[int], eligible: set[int], limit: int
) -> None:
    """`first_to_expire` (tiers' `_break_retention`) walks the heap in expiry order, skipping
    refreshed, forgotten and refused entries; it must pick what a scan of every retained block
    picks: the smallest (expiry, -depth, key) among the eligible, if it expires by `limit`."""
    radix = RadixCache(create_policy("lru", capacity=64), num_blocks=64)
    retention = Retention(RetentionConfig(), radix, lambda: 0.0, tiered=True)
    depth_of: dict[int, int] = {}
    for key, depth, until in grants:
        depth = depth_of.setdefault(key, depth)  # a block's depth is fixed
        retention.grant([_Block(key, depth)], float(until))
    for key in forgotten:
        retention.forget(key)
    live = [(until, -depth_of[key], key) for key, until in retention.expiry.items() if key in eligible]
    expected = min(live)[2] if live and min(live)[0] <= limit else None
    assert retention.first_to_expire(float(limit), eligible.__contains__) == expected
