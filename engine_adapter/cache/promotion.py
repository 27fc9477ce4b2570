"""Loading blocks back from the host and disk tiers into the device tree, ahead of time too.

`promote_path` caches promoted tier entries in the device radix index under a locked path (the
admission of a request whose lookup ran past the device tree, and a prefetch). `Prefetches`
keeps what queued requests' prefetches hold: a prefetch promotes a waiting request's
host- or disk-resident prefix into fresh device blocks within a budget of blocks (as
CachedAttention's scheduler-aware prefetch), and holds the whole path locked until the request is
admitted (its own lock then replaces the prefetch's) or leaves the queue (`cancel`); the
promoted blocks then stay cached on the device like any other. Called under the cache manager's
lock (docs/architecture.md, "Tiers"). Imports `block_allocator`, `cached_block`, `eviction`,
`radix_cache` and `tiers`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.tier_level import TierEntry
from engine_adapter.cache.tiers import TierConfig, TierStore

__all__ = ["Prefetches", "promote_path"]


def promote_path(
    radix: RadixCache,
    store: TierStore,
    path: list[CachedBlock],
    entries: Sequence[TierEntry],
    block_ids: Sequence[int],
    owner: int,
    now: float,
    reason: str,
) -> None:
    """Cache held `entries` in device blocks `block_ids` under the locked `path` (appended to it,
    locked once more, each a hit for the device policy); the moves go to `store`'s list."""
    metas = store.promote(entries, block_ids, reason)
    parent = path[-1] if path else None
    added: list[CachedBlock] = []
    for entry, block_id, meta in zip(entries, block_ids, metas, strict=True):
        parent = radix.insert(parent, entry.key, block_id, meta, sequence_id=owner, locked=True)
        added.append(parent)
    radix.touch(added, now)
    path.extend(added)


class Prefetches:
    """Queued requests' prefetched paths, each locked once, within `budget` promoted blocks.

    Attributes:
        budget: Promoted blocks all prefetches may hold at once (0: prefetch off).
        held: Request id -> its locked root path (the device part it found and what it promoted).
        promoted: Request id -> blocks its prefetch promoted.
        blocks_prefetched: Blocks promoted ahead of time so far.
        prefetch_hits: Of those, blocks the request found on the device when admitted.
    """

    def __init__(
        self, budget: int, radix: RadixCache, store: TierStore, pool: BlockAllocator, eviction: EvictionStep
    ) -> None:
        if budget < 0:
            raise ValueError(f"prefetch budget={budget} must be 0 (off) or positive")
        self.budget = budget
        self._radix = radix
        self._store = store
        self._pool = pool
        self._eviction = eviction
        self.held: dict[Hashable, list[CachedBlock]] = {}
        self.promoted: dict[Hashable, int] = {}
        self.blocks_prefetched = 0
        self.prefetch_hits = 0

    @classmethod
    def from_config(
        cls,
        config: TierConfig | None,
        radix: RadixCache,
        store: TierStore | None,
        pool: BlockAllocator,
        eviction: EvictionStep,
    ) -> Prefetches | None:
        """The prefetch bookkeeping `config` asks for (tiers and a budget), or None."""
        if store is None or config is None or config.prefetch_blocks <= 0:
            return None
        return cls(config.prefetch_blocks, radix, store, pool, eviction)

    @property
    def num_promoted(self) -> int:
        return sum(self.promoted.values())

    def prefetch(self, request_id: Hashable, keys: Sequence[Hashable], owner: int, now: float) -> int:
        """Promote the host/disk run after the device hit of `keys` (the request's matchable block
        keys) as far as the budget and the device's free and reclaimable blocks allow; returns
        blocks promoted (0 when it holds a prefetch already)."""
        if request_id in self.held or self.budget <= 0:
            return 0
        radix, store = self._radix, self._store
        path = radix.match(keys)
        entries = store.match(keys, len(path))[: self.budget - self.num_promoted]
        if not entries:
            return 0
        deficit = self._eviction.room_for(path, len(entries))
        if deficit is None:
            return 0
        store.hold(entries)
        radix.lock(path)
        if deficit:
            self._eviction.evict(deficit, "prefetch", pending=len(entries))
        promote_path(radix, store, path, entries, self._pool.allocate(len(entries)), owner, now, "prefetch")
        self.held[request_id] = path
        self.promoted[request_id] = len(entries)
        self.blocks_prefetched += len(entries)
        return len(entries)

    def admitted(self, request_id: Hashable, hit: Sequence[CachedBlock]) -> None:
        """The request was admitted on `hit` (locked by it now): its prefetch's lock ends."""
        path = self.held.pop(request_id, None)
        if path is None:
            return
        promoted = self.promoted.pop(request_id)
        covered = {id(b) for b in hit}
        self.prefetch_hits += sum(1 for b in path[len(path) - promoted :] if id(b) in covered)
        self._radix.unlock(path)

    def cancel(self, request_id: Hashable) -> int:
        """The request left the queue: its prefetch's lock ends (the blocks stay cached); returns
        blocks it had promoted."""
        path = self.held.pop(request_id, None)
        if path is None:
            return 0
        self._radix.unlock(path)
        return self.promoted.pop(request_id)

    def paths(self) -> list[list[CachedBlock]]:
        """The held paths (for the invariants)."""
        return list(self.held.values())
