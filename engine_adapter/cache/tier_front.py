"""The cache manager's KV-tier methods: what the engine calls to run the tiers' moves, prefetch
for queued requests, swap the host policy and read where a block lives.

A mixin of `CacheManager` (kept apart so that the front stays one screenful per concern), as the
policy base keeps its handover in `sage_eviction.handover`. Every method takes the manager's
lock. Without tiers (``TierConfig.host_blocks == 0``) each is a cheap no-op: `take_moves`
returns [] (docs/architecture.md, "Tiers"; the contract with the engine in `tier_moves`).
Imports `block_allocator`, `eviction`, `handoff_lock`, `promotion`, `prompt_keys`,
`queue_protection`, `radix_cache`, `records`, `request`, `sequences`, `tier_failures`,
`tier_moves` and `tiers`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.promotion import Prefetches
from engine_adapter.cache.prompt_keys import PromptKeys
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SwapResult
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.sequences import RunningSequences
from engine_adapter.cache.tier_failures import handle_failed_moves
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.cache.tiers import TierStore

__all__ = ["TierFront"]


class TierFront:
    """The tier methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    radix: RadixCache
    allocator: BlockAllocator
    clock: Callable[[], float]
    _tiers: TierStore | None
    _prefetches: Prefetches | None
    _eviction: EvictionStep
    _running: RunningSequences
    _protection: QueueProtection
    _keys: PromptKeys

    @property
    def tiers(self) -> TierStore | None:
        """The host/disk tiers, or None (read-only use: checks, the tree view, the simulator)."""
        return self._tiers

    def take_moves(self) -> list[TierMove]:
        """The block copies decided since the last call, in the order the engine must run them,
        before the forward pass of the step that scheduled them ([] without tiers)."""
        with self.lock:
            return [] if self._tiers is None else self._tiers.take_moves()

    def moves_failed(self, failed: Sequence[TierMove]) -> dict[int, int]:
        """The engine could not run `failed` (an unreadable source): those blocks are misses.

        Returns:
            For each running sequence whose cached prefix shrank, the cached blocks it keeps:
            it recomputes from that block on (`tier_failures`).
        """
        with self.lock:
            if self._tiers is None or not failed:
                return {}
            return handle_failed_moves(
                failed,
                radix=self.radix,
                store=self._tiers,
                pool=self.allocator,
                eviction=self._eviction,
                sequences=self._running.states(),
                protection=self._protection,
                prefetches=self._prefetches,
            )

    def swap_host_policy(self, spec: str, **params: Any) -> SwapResult:
        """Hot swap the host tier's policy (as `swap_policy` for the device): nothing is moved
        or lost; on any error the old policy stays.

        Raises:
            ValueError: No host tier.
            UnknownPolicyError, PolicyParamError: As `resolve_policy`; nothing changed.
        """
        return self.swap_tier_policy(Tier.HOST, spec, **params)

    def swap_tier_policy(self, tier: Tier, spec: str, **params: Any) -> SwapResult:
        """Hot swap the policy of the host or disk tier (`swap_host_policy`)."""
        with self.lock:
            if self._tiers is None:
                raise ValueError("this cache has no host or disk tier (host_blocks=0)")
            return self._tiers.swap_policy(tier, spec, **params)

    def prefetch(self, request: CacheRequest, *, hold: bool = True, limit: int | None = None) -> int:
        """Load a queued request's host/disk-resident prefix back into device blocks ahead of
        time, within the prefetch budget. Returns blocks promoted (0: nothing below, no budget
        or no room, or already holding a prefetch). The moves come with `take_moves`.

        Args:
            request: The queued request.
            hold: Keep the path locked for the request until it is allocated or
                `cancel_prefetch` (the simulator); False: nothing stays locked, the blocks are
                evictable at once (the engine: it cannot stall the pool).
            limit: At most this many blocks now.
        """
        with self.lock:
            if self._prefetches is None or not request.match_prefix:
                return 0
            n_tokens, _, keys = self._keys.of(request)
            matchable = keys[: self._keys.matchable(n_tokens, request.recompute_last_token)]
            return self._prefetches.prefetch(
                request.sequence_id, matchable, request.sequence_id, self.clock(), hold=hold, limit=limit
            )

    def record_tier_load(self, tier: Tier, seconds: float) -> None:
        """The engine loaded blocks from `tier` into the pool in `seconds` (one timed batch): the
        tier's load time p50/p99 in the stats. Ignored without that tier."""
        with self.lock:
            if self._tiers is not None and any(level.tier is tier for level in self._tiers.levels):
                self._tiers.level(tier).load_time.record(seconds)

    def cancel_prefetch(self, request_id: Hashable) -> int:
        """The request left the queue: release what its prefetch holds (the blocks stay cached
        and evictable); returns blocks it had promoted."""
        with self.lock:
            return 0 if self._prefetches is None else self._prefetches.cancel(request_id)

    def tier_of(self, key: Hashable) -> tuple[Tier, ...]:
        """Where the block with radix key `key` has its K/V now: (), (DEVICE,), (HOST,), (DISK,)
        or (DEVICE, HOST) (a write-through copy)."""
        with self.lock:
            where: list[Tier] = [Tier.DEVICE] if key in self.radix else []
            entry = None if self._tiers is None else self._tiers.entry(key)
            if entry is not None:
                where.append(entry.tier)
            return tuple(where)
