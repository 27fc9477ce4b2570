"""Loading blocks back from the host and disk tiers into the device tree, ahead of time too.

`promote_path` caches promoted tier entries in the device radix index under a locked path (the
admission of a request whose lookup ran past the device tree, and a prefetch). `Prefetches`
keeps what queued requests' prefetches hold: a prefetch promotes a waiting request's
host- or disk-resident prefix into fresh device blocks within a budget of blocks (as
CachedAttention's scheduler-aware prefetch). A held prefetch (the simulator's) keeps the whole
path locked until the request is admitted (its own lock then replaces the prefetch's) or leaves
the queue (`cancel`); a loose one (the engine's) locks nothing once loaded. The
promoted blocks then stay cached on the device like any other. Called under the cache manager's
lock (docs/architecture.md, "Tiers"). Imports `block_allocator`, `cached_block`, `eviction`,
`radix_cache`, `tier_level`, `tier_moves` and `tiers`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.tier_level import TierEntry
from engine_adapter.cache.tier_moves import Tier
from engine_adapter.cache.tiers import TierConfig, TierStore

__all__ = ["Prefetches", "load_below", "promote_path"]


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


def load_below(
    radix: RadixCache,
    store: TierStore,
    pool: BlockAllocator,
    eviction: EvictionStep,
    path: list[CachedBlock],
    entries: Sequence[TierEntry],
    owner: int,
    now: float,
    reason: str,
) -> int:
    """Promote held `entries` under the locked `path` one block at a time, each into a free
    device block or one its eviction frees; returns blocks evicted.

    One at a time, because each promotion frees its host slot (write-back) before the next
    eviction demotes into the host: evicting all the room first would demote into a full host
    and drop as many host blocks as are being loaded (with both tiers full, one drop at most).
    The caller checked that the device has the room (`EvictionStep.room_for`).
    """
    evicted = 0
    for entry in entries:
        if pool.num_free == 0:
            evicted += eviction.evict(1, "alloc", pending=1)
        promote_path(radix, store, path, [entry], pool.allocate(1), owner, now, reason)
    return evicted


class Prefetches:
    """Queued requests' prefetches, within `budget` promoted blocks outstanding.

    Two kinds, by who asks (`prefetch`'s `hold`): a *held* prefetch (the simulator's) keeps its
    whole root path locked until the request is admitted or leaves; a *loose* one leaves what it
    loaded cached and evictable like any other block. A held path is pinned pool capacity
    that running sequences cannot reclaim: in the engine, six queued requests' held paths in a
    24-block pool left the running ones nothing to grow into, and the pool stalled. A loose
    prefetch (the engine's) takes free or reclaimable blocks (cold cached ones, evicted as an
    allocation would: demoted), never a queued request's protected prefix, and locks nothing once
    loaded, so it cannot stall the pool; if the pool needs its blocks before the request runs they
    are evicted (demoted again): a wasted copy, never lost progress. The budget bounds such
    waste: blocks a request's prefetches loaded count against it until the request runs or leaves.

    Attributes:
        budget: Promoted blocks all outstanding prefetches may count at once (0: prefetch off).
        held: Request id -> its locked root path (held prefetches only).
        promoted: Request id -> the device blocks its prefetches promoted, with their source tier.
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
        self.promoted: dict[Hashable, list[tuple[CachedBlock, Tier]]] = {}
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
        return sum(len(blocks) for blocks in self.promoted.values())

    def prefetch(
        self,
        request_id: Hashable,
        keys: Sequence[Hashable],
        owner: int,
        now: float,
        *,
        hold: bool = True,
        limit: int | None = None,
    ) -> int:
        """Promote the host/disk run after the device hit of `keys` (the request's matchable block
        keys) as far as the budget, `limit` and the device's room allow; returns blocks promoted.

        Args:
            hold: A held prefetch (the path stays locked; one per request: 0 when it holds one
                already; queued protections may yield room), else a loose one (nothing stays
                locked; protections never yield; a request may add to it each step).
            limit: At most this many blocks now (the caller's share of the free pool).
        """
        if request_id in self.held or self.budget <= 0:
            return 0
        radix, store = self._radix, self._store
        path = radix.match(keys)
        room = self.budget - self.num_promoted
        if limit is not None:
            room = min(room, limit)
        if not hold:  # free blocks and cold cached ones, never a queued request's protection
            reclaimable = radix.num_reclaimable - (radix.reclaimable_in(path) if path else 0)
            room = min(room, self._pool.num_free + reclaimable)
        entries = store.match(keys, len(path))[: max(room, 0)]
        if not entries or (hold and self._eviction.room_for(path, len(entries)) is None):
            return 0
        tiers = [entry.tier for entry in entries]
        store.hold(entries)
        radix.lock(path)
        load_below(radix, store, self._pool, self._eviction, path, entries, owner, now, "prefetch")
        for tier in tiers:
            store.level(tier).prefetched += 1
        loaded = list(zip(path[len(path) - len(entries) :], tiers, strict=True))
        self.promoted.setdefault(request_id, []).extend(loaded)
        if hold:
            self.held[request_id] = path
        else:
            radix.unlock(path)
        self.blocks_prefetched += len(entries)
        return len(entries)

    def admitted(self, request_id: Hashable, hit: Sequence[CachedBlock]) -> None:
        """The request was admitted on `hit` (locked by it now): its prefetch ends; each block it
        promoted and finds in `hit` (the same block: not evicted and loaded again) is a hit."""
        loaded = self.promoted.pop(request_id, None)
        if loaded is None:
            return
        covered = {id(b) for b in hit}
        for block, tier in loaded:
            if id(block) in covered:
                self.prefetch_hits += 1
                self._store.level(tier).prefetch_hits += 1
        path = self.held.pop(request_id, None)
        if path is not None:
            self._radix.unlock(path)

    def cancel(self, request_id: Hashable) -> int:
        """The request left the queue: what its prefetch holds is released (the blocks stay
        cached and evictable); returns blocks it had promoted."""
        path = self.held.pop(request_id, None)
        if path is not None:
            self._radix.unlock(path)
        return len(self.promoted.pop(request_id, ()))

    def counts(self) -> tuple[int, int]:
        """(blocks prefetched, of those found on the device at admission), for the stats."""
        return self.blocks_prefetched, self.prefetch_hits

    def paths(self) -> list[list[CachedBlock]]:
        """The held paths (for the invariants)."""
        return list(self.held.values())
