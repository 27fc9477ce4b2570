"""Admission: a `CacheRequest` meets the cache. Its prompt is matched against the radix index,
then looked up (`lookup`: what is cached and whether it would fit), admitted (`allocate`: the hit
locked, fresh blocks for the rest, the lookup counted) or protected while it waits in the queue
(`protect`). Once admitted, a sequence is addressed by its id (`sequences.RunningSequences`).
Called under the cache manager's lock. Imports `block_allocator`, `cached_block`, `errors`,
`metrics`, `prompt_keys`, `queue_protection`, `radix_cache`, `receipts`, `records`, `request`, `sequences`,
`tier_moves` and `tiers`: with KV tiers, a lookup that runs past the device tree into host or
disk entries promotes them (docs/architecture.md, "Tiers").
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.compressed import CompressedPrefix, CompressedPrefixes
from engine_adapter.cache.errors import RequestTooLargeError, SequenceExistsError
from engine_adapter.cache.metrics import CacheMetrics
from engine_adapter.cache.prompt_keys import PromptKeys
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.receipts import Lookup as _Lookup
from engine_adapter.cache.receipts import salt_label
from engine_adapter.cache.records import Allocation, LookupResult
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.sequences import RunningSequences
from engine_adapter.cache.tier_level import TierEntry
from engine_adapter.cache.tier_moves import Tier
from engine_adapter.cache.tiers import TierStore

__all__ = ["Admission"]


class Admission:
    """Lookup, admission and queue protection of requests, for one cache.

    Args:
        pool: The free list.
        radix: The radix index prompts are matched against.
        keys: How a request's prompt names blocks.
        protection: The waiting requests' protections.
        running: Where admitted requests run.
        metrics: Counts each admitted lookup.
        tiers: The host/disk tiers a lookup continues into, or None.
    """

    def __init__(
        self,
        pool: BlockAllocator,
        radix: RadixCache,
        keys: PromptKeys,
        protection: QueueProtection,
        running: RunningSequences,
        metrics: CacheMetrics,
        tiers: TierStore | None = None,
        compressed: CompressedPrefixes | None = None,
    ) -> None:
        self._compressed = compressed
        self._pool = pool
        self._radix = radix
        self._keys = keys
        self._protection = protection
        self._running = running
        self._metrics = metrics
        self._tiers = tiers

    def matchable_keys(self, keys: list[Hashable], num_tokens: int, request: CacheRequest) -> list[Hashable]:
        """The keys a request may hit (all but a last block it must recompute)."""
        return keys[: self._keys.matchable(num_tokens, request.recompute_last_token)]

    def _match(self, keys: list[Hashable], num_tokens: int, request: CacheRequest) -> list[CachedBlock]:
        """The cached path a request may hit: its longest cached prefix within `matchable`."""
        return self._radix.match(self.matchable_keys(keys, num_tokens, request))

    def lookup(self, request: CacheRequest) -> LookupResult:
        """How much of the prompt is cached and whether `allocate` would fit; changes nothing."""
        n_tokens, _, keys = self._keys.of(request)
        path = self._match(keys, n_tokens, request)
        block_size = self._keys.block_size
        available = self._pool.num_free + self._protection.reclaimable_for(path)
        held = n_hit = 0
        squeeze = self._compressed
        if squeeze is not None:  # a compressed hit: its blocks are locked, not reclaimable, for it
            hit = squeeze.match(self.matchable_keys(keys, n_tokens, request), len(path))
            held, n_hit = (len(hit[0].blocks), hit[1]) if hit is not None else (0, 0)
            available += squeeze.num_reclaimable - (held if hit and not hit[0].ref_count else 0)
        n_new = -(-n_tokens // block_size) - len(path) - n_hit
        return LookupResult(
            num_cached_blocks=len(path) + held,
            num_cached_tokens=(len(path) + n_hit) * block_size,
            num_new_blocks=n_new,
            num_available_blocks=available,
            fits=n_new <= available and n_new + len(path) + n_hit <= self._pool.num_blocks,
        )

    def allocate(self, request: CacheRequest) -> Allocation:
        """Run the request on its cached prefix and fresh blocks; count its lookup.

        Raises:
            SequenceExistsError: Its sequence id is running.
            RequestTooLargeError: It needs more blocks than the pool has; nothing changed.
            NoEvictableBlocksError: Not enough free or reclaimable blocks now; nothing changed.
        """
        started = time.perf_counter()
        sequence_id = request.sequence_id
        if sequence_id in self._running:
            raise SequenceExistsError(f"sequence {sequence_id} already holds blocks")
        bs = self._keys.block_size
        n_tokens, salt, keys = self._keys.of(request)
        n_blocks = -(-n_tokens // bs)
        pool_blocks = self._pool.num_blocks
        if n_blocks > pool_blocks:
            raise RequestTooLargeError(
                f"sequence {sequence_id} needs {n_blocks} blocks ({n_tokens} tokens of block_size {bs}) "
                f"but the pool has {pool_blocks}"
            )
        path: list[CachedBlock] = []
        below: list[TierEntry] = []
        hit: tuple[CompressedPrefix, int] | None = None
        matchable: list[Hashable] = []
        if request.match_prefix:
            matchable = self.matchable_keys(keys, n_tokens, request)
            path = self._radix.match(matchable)
            if self._tiers is not None:
                below = self._running.cut_promotions(salt, self._tiers.match(matchable, len(path)))
            if self._compressed is not None:
                hit = self._compressed.match(matchable, len(path))
        seq, evicted = self._running.admit(request, path, keys, salt, n_tokens, n_blocks, below, hit)
        entry, n_entry = hit if hit is not None else (None, 0)
        n_cached_tokens = (len(path) + n_entry) * bs
        self._metrics.record_lookup(request.tenant, keys, len(path) + n_entry, n_cached_tokens, n_tokens)
        n_host = sum(1 for e in below if e.tier is Tier.HOST)
        read = (n_cached_tokens - len(below) * bs, n_host * bs, (len(below) - n_host) * bs)
        lookup = _Lookup(keys, salt, len(path) + n_entry, len(matchable), n_tokens, read)
        self._account(request, lookup, path, started)
        return Allocation(
            sequence_id=sequence_id,
            block_table=list(seq.block_table),
            num_cached_blocks=len(path) + (0 if entry is None else len(entry.blocks)),
            num_cached_tokens=n_cached_tokens,
            num_new_blocks=n_blocks - len(path) - n_entry,
            num_evicted_blocks=evicted,
            num_host_blocks=n_host,
            num_disk_blocks=len(below) - n_host,
            num_compressed_blocks=0 if entry is None else len(entry.blocks),
            num_compressed_tokens=n_entry * bs,
            compressed_kept=0 if entry is None else entry.kept,
            compressed_key=None if entry is None else entry.key,
        )

    def _account(
        self, request: CacheRequest, lookup: _Lookup, path: list[CachedBlock], started: float
    ) -> None:
        """Tell the accounting the admitted lookup (with its record when lookups are logged),
        and the receipts the request's first admission (`receipts`)."""
        accounting = self._metrics.accounting
        keys, n_hit = lookup.keys, lookup.n_hit
        record: dict[str, object] | None = None
        if accounting.lookup_log is not None:
            record = {
                "request_id": str(request.sequence_id) if request.request_id is None else request.request_id,
                "sequence_id": request.sequence_id,
                "tenant": request.tenant,
                "salt": salt_label(request.cache_salt),
                "prompt_tokens": lookup.n_tokens,
                "prompt_blocks": len(keys),
                "matched_blocks": n_hit,
                "matched_tokens": sum(lookup.read),
                "read_tokens": dict(zip(("device", "host", "disk"), lookup.read, strict=True)),
                "lookup_us": round((time.perf_counter() - started) * 1e6, 1),
            }
        lookup.ghosts = accounting.on_lookup(keys, path, n_hit, request.tenant, lookup.matchable, record)
        if accounting.receipts is not None:
            accounting.receipts.on_lookup(request, lookup)

    def protect(self, request: CacheRequest) -> int:
        """Protect the cached prefix the waiting request will hit (replacing an earlier
        protection of its id) within the budget; returns blocks protected (0: protection off)."""
        protection = self._protection
        if protection.max_protected <= 0:
            return 0
        protection.release(request.sequence_id)
        n_tokens, _, keys = self._keys.of(request)
        return protection.protect(request.sequence_id, self._match(keys, n_tokens, request))
