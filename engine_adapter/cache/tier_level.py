"""One lower KV tier (host or disk): its slots, its policy, its entries and its counters.

A `TierLevel` is the bookkeeping of one tier below the device pool (docs/architecture.md,
"Tiers"): which block keys have their K/V in which of its slots (`TierEntry`), the free list of
those slots (a `BlockAllocator`, one implementation of a free list), and the policy that orders
its entries for eviction, bound like the device policy (`PolicyBinding`, so it is any
registered policy and hot-swappable). It moves no bytes and decides nothing about the other
tiers: `tiers.TierStore` does. Called under the cache manager's lock. Imports
`block_allocator`, `policy_binding`, `records`, `stats`, `tier_moves` and the policy library.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.policy_binding import PolicyBinding
from engine_adapter.cache.records import SwapResult
from engine_adapter.cache.stats import TierStats
from engine_adapter.cache.tier_moves import Tier
from sage_eviction import EntryMeta, EvictionPolicy
from sage_eviction.metrics import LatencyRecorder

__all__ = ["TierEntry", "TierLevel"]


class TierEntry:
    """A block whose K/V has a copy in a host or disk slot.

    Attributes:
        key: The block's radix key.
        parent_key: Its parent's key (None: a first block); the parent is cached in some tier.
        tier: Where this copy lives (HOST or DISK).
        slot: Its slot in that tier.
        meta: The tier policy's record of it.
        on_device: The block is also in the device tree (a write-through copy): dropping this
            copy loses nothing.
        holds: Promotions and prefetches in progress that read it: not evictable meanwhile.
    """

    __slots__ = ("holds", "key", "meta", "on_device", "parent_key", "slot", "tier")

    def __init__(
        self,
        key: Hashable,
        parent_key: Hashable | None,
        tier: Tier,
        slot: int,
        meta: EntryMeta,
        on_device: bool,
    ) -> None:
        self.key = key
        self.parent_key = parent_key
        self.tier = tier
        self.slot = slot
        self.meta = meta
        self.on_device = on_device
        self.holds = 0

    def __repr__(self) -> str:
        return (
            f"TierEntry({self.tier.value}, slot={self.slot}, on_device={self.on_device}, holds={self.holds})"
        )


class TierLevel:
    """One tier's entries by key, its free slots and its policy.

    Args:
        tier: HOST or DISK.
        capacity: Slots (blocks); positive.
        policy: Policy spec of this tier (``"lru"``, ``"arc"`` ...).
        policy_params: More params (override the spec's).

    Attributes:
        entries: Key -> entry, every block with a copy here.
        binding: The policy's resolved spec and its swaps.
        policy: The policy over `entries` (evictable: `TierStore` decides and tells it).
        hits, demotions, promotions, drops, moved_in, moved_out: Counters (blocks).
        prefetched, prefetch_hits: Blocks prefetched from here, and of those found at admission.
        load_time: The engine's timed loads from here into the pool (`record_load`).
    """

    def __init__(self, tier: Tier, capacity: int, policy: str, policy_params: dict[str, Any] | None) -> None:
        self.tier = tier
        self.capacity = capacity
        self.slots = BlockAllocator(capacity, 1)
        self.binding = PolicyBinding(policy, capacity, policy_params)
        self.policy: EvictionPolicy = self.binding.new_policy()
        self.entries: dict[Hashable, TierEntry] = {}
        self.hits = 0
        self.demotions = 0
        self.promotions = 0
        self.drops = 0
        self.moved_in = 0
        self.moved_out = 0
        self.prefetched = 0
        self.prefetch_hits = 0
        self.load_time = LatencyRecorder()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def num_free(self) -> int:
        return self.slots.num_free

    def add(self, key: Hashable, parent_key: Hashable | None, meta: EntryMeta, on_device: bool) -> TierEntry:
        """Give `key` a free slot (the caller made room) and tell the policy (not evictable yet:
        `TierStore.refresh` decides)."""
        (slot,) = self.slots.allocate(1)
        entry = TierEntry(key, parent_key, self.tier, slot, meta, on_device)
        self.entries[key] = entry
        self.policy.insert(key, meta, evictable=False)
        return entry

    def discard(self, entry: TierEntry) -> None:
        """Forget `entry` and free its slot (it was moved elsewhere or dropped)."""
        del self.entries[entry.key]
        if entry.key in self.policy:  # not when the policy chose it: `evict` already forgot it
            self.policy.remove(entry.key)
        self.slots.free([entry.slot])

    def set_evictable(self, entry: TierEntry, evictable: bool) -> None:
        self.policy.set_evictable(entry.key, evictable)

    def swap_policy(self, spec: str, **params: Any) -> SwapResult:
        """Hot swap this tier's policy from the old one's entries (as `PolicyBinding.swap`)."""
        result, new, copied = self.binding.swap_policy(self.policy, len(self.entries), spec, **params)
        if copied:
            for entry in self.entries.values():
                entry.meta = new.meta(entry.key)
        self.policy = new
        return result

    def stats(self) -> TierStats:
        p50, p99 = self.load_time.quantiles(0.5, 0.99)
        return TierStats(
            tier=self.tier.value,
            policy=self.binding.name,
            capacity_blocks=self.capacity,
            used_blocks=len(self.entries),
            hits=self.hits,
            demotions=self.demotions,
            promotions=self.promotions,
            drops=self.drops,
            blocks_moved_in=self.moved_in,
            blocks_moved_out=self.moved_out,
            policy_swaps=self.binding.swaps,
            loads=self.load_time.count,
            load_time_p50_ms=p50 * 1e3,
            load_time_p99_ms=p99 * 1e3,
            prefetched_blocks=self.prefetched,
            prefetch_hits=self.prefetch_hits,
        )
