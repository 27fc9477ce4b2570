"""Property test of the KV tiers: random request streams over tiny device, host and disk
capacities, with `check_invariants()` (the tier slots allocated exactly once, the capacities
never exceeded, the tree property, the policies' evictable sets) and the slot oracle
(`tier_oracle.SlotEngine`: every cached block holds its own K/V once the moves ran) after every
step. Steps: admit, finish, preempt, prefetch a queued request, cancel it, hot swap the host
policy, and disk reads that fail (a corrupt file) for a while."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tier_oracle import SlotEngine

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.cache.tiers import TierConfig

BS = 2
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [17, 18]]


class TierMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.e: SlotEngine
        self.m: CacheManager
        self.running: dict[int, list[int]] = {}
        self.queued: dict[int, list[int]] = {}
        self.ids = itertools.count(1)
        self.ticks = itertools.count()
        self.corrupt = False

    @initialize(
        num_blocks=st.integers(4, 8),
        host=st.integers(1, 6),
        disk=st.sampled_from([0, 0, 2, 5]),
        write=st.sampled_from(["write_back", "write_through"]),
        host_policy=st.sampled_from(["lru", "arc", "lfu", "fifo"]),
        prefetch=st.sampled_from([0, 2, 4]),
    )
    def setup(
        self, num_blocks: int, host: int, disk: int, write: str, host_policy: str, prefetch: int
    ) -> None:
        config = TierConfig(
            host_blocks=host,
            disk_blocks=disk,
            host_policy=host_policy,
            write_policy=write,
            prefetch_blocks=prefetch,
        )
        self.m = CacheManager(
            BlockAllocator(num_blocks, BS),
            tiers=config,
            clock=lambda: float(next(self.ticks)),
            record_events=False,
        )
        self.e = SlotEngine(self.m, fail=lambda move: self.corrupt and move.src_tier is Tier.DISK)

    def _prompt(self, prefix: int, suffix: int) -> list[int]:
        return PREFIXES[prefix] + [100 + suffix] * (suffix % 3) + [0]

    @rule(prefix=st.integers(0, len(PREFIXES) - 1), suffix=st.integers(0, 5))
    def admit(self, prefix: int, suffix: int) -> None:
        sid = next(self.ids)
        tokens = self._prompt(prefix, suffix)
        try:
            self.e.allocate(CacheRequest(sid, tokens))
        except (NoEvictableBlocksError, RequestTooLargeError):
            return
        self.running[sid] = tokens

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def finish(self, data: st.DataObject, preempt: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.running)))
        tokens = self.running.pop(sid)
        if preempt:
            self.m.preempt(sid, tokens)
            self.e.run_moves()
        else:
            self.e.free(sid, tokens)

    @rule(prefix=st.integers(0, len(PREFIXES) - 1))
    def queue_and_prefetch(self, prefix: int) -> None:
        sid = next(self.ids)
        self.queued[sid] = self._prompt(prefix, 0)
        self.m.prefetch(CacheRequest(sid, self.queued[sid]))
        self.e.run_moves()

    @precondition(lambda self: self.queued)
    @rule(data=st.data(), admit=st.booleans())
    def leave_queue(self, data: st.DataObject, admit: bool) -> None:
        sid = data.draw(st.sampled_from(sorted(self.queued)))
        tokens = self.queued.pop(sid)
        if not admit:
            self.m.cancel_prefetch(sid)
            return
        try:
            self.e.allocate(CacheRequest(sid, tokens))
        except (NoEvictableBlocksError, RequestTooLargeError):
            self.m.cancel_prefetch(sid)
            return
        self.running[sid] = tokens

    @rule(policy=st.sampled_from(["lru", "arc", "s3fifo", "lfu"]))
    def swap_host(self, policy: str) -> None:
        self.m.swap_host_policy(policy)

    @rule()
    def toggle_corrupt_disk(self) -> None:
        self.corrupt = not self.corrupt

    @rule(data=st.data())
    def lose_a_host_copy(self, data: st.DataObject) -> None:
        tiers = self.m.tiers
        assert tiers is not None
        if not tiers.host.entries:
            return
        key = data.draw(st.sampled_from(sorted(tiers.host.entries, key=repr)))
        slot = tiers.host.entries[key].slot
        self.m.moves_failed([TierMove(Tier.DEVICE, 0, Tier.HOST, slot, key)])

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "m"):
            self.m.check_invariants()
            self.e.check()
            for level in self.m.stats().tiers:
                assert level.used_blocks <= level.capacity_blocks


TestTierMachine = TierMachine.TestCase
