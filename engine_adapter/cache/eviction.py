"""The eviction step: how much to evict, evicting it through the radix index, freeing the victims'
block ids, and recording it.

`EvictionStep.room_for(path, n)` says how many blocks must be evicted before `n` fresh ones
can be taken beside a locked path, or None when they cannot (`deficit` raises instead); queued
requests' protections yield when that makes enough room (`queue_protection`).
`evict_to_threshold` evicts down to the watermark in the background. `evict(n, reason)` asks
the radix index for up to `n` victims in policy order (with their explanations when `explain`
is on), gives their ids back to the pool, keeps the counters that feed `CacheStats` (blocks by
reason and by policy, calls, the policy's decision time, memory utilization at each eviction),
tells the re-prefill tracker which blocks went, and writes one ``evict`` event per victim and
one ``freed`` event per call (docs/architecture.md, "Cache core" and "Metrics"). With KV tiers
(`tiers`), each victim is demoted to host before its id is freed, and only what is dropped
counts for re-prefill ("Tiers"). With `--compress-on-evict` (`compressed`), a victim's chain is
compacted instead of dropped and entries already compressed go last ("Compress on evict").
Called under the cache manager's lock. Imports
`block_allocator`, `block_keys`, `cached_block`, `compressed`, `errors`, `events`, `policy_binding`, `quotas`,
`queue_protection`, `radix_cache`, `tiers` and the policy library's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from engine_adapter.cache.accounting import CacheAccounting
from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.compressed import CompressedPrefix, CompressedPrefixes
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.policy_binding import PolicyBinding
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.quotas import SaltQuotas
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.retention import Retention
from engine_adapter.cache.tiers import TierStore
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker

__all__ = ["EvictionStep"]


class EvictionStep:
    """Eviction and its metrics and events, for one cache.

    Args:
        radix: The index to evict from.
        pool: The free list the victims' ids go back to.
        binding: The active policy's name (for the counters and events).
        protection: The queued requests' protections, which yield to an allocation.
        reprefill: The re-prefill tracker (told each victim's key).
        events: Where events go, or None (no events).
        clock: The events' time source.
        explain: Each eviction event says why its victim went (O(n) per victim).
        threshold: When set, `evict_to_threshold` evicts down to this fraction of the pool in use.
        tiers: The host/disk tiers victims are demoted to, or None (victims are dropped).
        compressed: Where victims' chains are compressed instead of dropped, or None.
        accounting: Told each dropped victim (its age, a ghost), or None.

    Attributes:
        explain: May be switched at any time.
        threshold: The watermark, or None.
        total_evictions: Blocks evicted.
        eviction_calls: Evictions that evicted at least one block.
        latency: The policy's decision time per call.
        by_reason: Blocks evicted by reason (``alloc``, ``reserve``, ``watermark``, ``manual``).
        by_policy: Blocks evicted by policy name.
        retention: The prompt-cache lifetimes (set by the manager): without tiers, their pins
            give way when an allocation would fall short; with tiers, a dropped retained victim
            is a break. None: none.
    """

    def __init__(
        self,
        radix: RadixCache,
        pool: BlockAllocator,
        binding: PolicyBinding,
        protection: QueueProtection,
        reprefill: ReprefillTracker,
        events: EvictionEventLog | None,
        clock: Callable[[], float],
        *,
        explain: bool = False,
        threshold: float | None = None,
        tiers: TierStore | None = None,
        compressed: CompressedPrefixes | None = None,
        accounting: CacheAccounting | None = None,
    ) -> None:
        if tiers is not None and compressed is not None:
            raise ValueError("compress-on-evict does not run with KV tiers yet (docs/architecture.md)")
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"eviction_threshold={threshold!r} must be within [0, 1]")
        self.threshold = threshold
        self._radix = radix
        self._pool = pool
        self._binding = binding
        self._protection = protection
        self._reprefill = reprefill
        self.events = events
        self._clock = clock
        self.tiers = tiers
        self.compressed = compressed
        self.accounting = accounting
        self.retention: Retention | None = None
        self.quotas: SaltQuotas | None = None  # per-salt quotas (set by the manager)
        self.explain = explain
        self.total_evictions = 0  # blocks
        self.eviction_calls = 0
        self.latency = LatencyRecorder()
        self.by_reason: dict[str, int] = {}
        self.by_policy: dict[str, int] = {}
        self._utilization_sum = 0.0
        self._utilization_samples = 0

    def bind_retention(self, retention: Retention) -> None:
        """Honour `retention` here and in the tiers (which it tells of lapsed retentions)."""
        self.retention = retention
        if self.tiers is not None:
            self.tiers.retention, retention.on_expire = retention, self.tiers.refresh_key

    @property
    def explain(self) -> bool:
        """Whether events say why each victim went (the tiers' choices too)."""
        return self._explain

    @explain.setter
    def explain(self, on: bool) -> None:
        self._explain = on
        if self.tiers is not None:
            self.tiers.explain = on

    def room_for(self, path: Sequence[CachedBlock], n_new: int) -> int | None:
        """Blocks to evict before `n_new` can be allocated beside the locked `path` (0 or more),
        or None when the free and reclaimable blocks together fall short (nothing changed);
        queued requests' protections yield when that makes enough room."""
        deficit = n_new - self._pool.num_free
        if deficit <= 0:
            return 0
        radix, retention = self._radix, self.retention
        if retention is not None:
            retention.expire()  # lapsed retention pins are reclaimable again
        reclaimable = radix.num_reclaimable - radix.reclaimable_in(path) if path else radix.num_reclaimable
        reclaimable += self.compressed_reclaimable()
        # the protections are consulted only when the reclaimable blocks fall short, retention
        # pins last: a lifetime never refuses nor preempts a request
        if deficit > reclaimable:
            have = self._protection.yield_for(deficit, path) + self.compressed_reclaimable()
            if deficit > have and (retention is None or not retention.unpin_for(deficit - have, path)):
                return None
        return deficit

    def deficit(self, owner: Hashable, path: Sequence[CachedBlock], n_new: int) -> int:
        """`room_for`, for an owner that cannot wait for room.

        Raises:
            NoEvictableBlocksError: The free and reclaimable blocks together fall short.
        """
        deficit = self.room_for(path, n_new)
        if deficit is None:
            pool, radix = self._pool, self._radix
            reclaimable = radix.num_reclaimable - radix.reclaimable_in(path) + self.compressed_reclaimable()
            raise NoEvictableBlocksError(
                f"sequence {owner} needs {n_new} new blocks: {pool.num_free} free "
                f"and {reclaimable} reclaimable of {pool.num_blocks}"
            )
        return deficit

    def evict_to_threshold(self) -> int:
        """Background eviction down to `threshold` of the pool in use (reason ``watermark``);
        returns blocks evicted (0 without a threshold or below it)."""
        if self.threshold is None:
            return 0
        if self.retention is not None:
            self.retention.expire()
        target = math.floor(self.threshold * self._pool.num_blocks)
        reclaimable = self._radix.num_reclaimable + self.compressed_reclaimable()
        excess = min(self._pool.num_used - target, reclaimable)
        return self.evict(excess, "watermark") if excess > 0 else 0

    def compressed_reclaimable(self) -> int:
        """Blocks that dropping the unreferenced compressed entries would free (0 without)."""
        return 0 if self.compressed is None else self.compressed.num_reclaimable

    def memory_utilization(self) -> float | None:
        """Mean pool use at the evictions so far (None before the first)."""
        if not self._utilization_samples:
            return None
        return self._utilization_sum / self._utilization_samples

    def evict(self, n: int, reason: str, *, pending: int = 0) -> int:
        """Evict up to `n` blocks, free them, record metrics and events; returns how many.

        `pending` blocks are about to be allocated from the freed ones; memory utilization is
        sampled as if they were (the state right after the eviction served its purpose).
        """
        if self.retention is not None:
            self.retention.expire()  # lapsed retention pins may go now
        if self.compressed is not None:
            return self._evict_compressing(n, reason, pending)
        reasons: list[dict[str, Any]] | None = None
        if self.explain:
            victims, decision, reasons = self._radix.evict_explained(n)
        else:
            victims, decision = self._radix.evict(n)
        if not victims:
            return 0
        return self._retire(victims, reason, decision, reasons, pending)

    def evict_chosen(self, victims: list[CachedBlock], reason: str = "quota") -> int:
        """Evict the given evictable leaves, chosen by the caller (a salt's own blocks for its
        quota, `quotas`): each leaves the tree as a policy victim would (demoted, freed, counted,
        recorded). Returns how many."""
        for block in victims:
            self._radix.remove(block)
        return self._retire(victims, reason, 0.0, None, 0) if victims else 0

    def _retire(
        self,
        victims: list[CachedBlock],
        reason: str,
        decision: float,
        reasons: list[dict[str, Any]] | None,
        pending: int,
    ) -> int:
        """The victims left the tree: demote or drop them, free their ids, count and record it."""
        pool = self._pool
        policy_name = self._binding.name
        # demoted before the ids are freed: each copy-out move precedes any reuse of the block
        dropped = victims if self.tiers is None else self._demote(victims, policy_name)
        self._left_device(victims)
        if reasons is not None and self.tiers is not None:
            gone = {id(b) for b in dropped}
            for block, record in zip(victims, reasons, strict=True):
                # which tier's policy chose, and where the block went (docs/architecture.md, "Tiers")
                record["tier"] = "device"
                record["then"] = "drop" if id(block) in gone else "demote"
        pool.free([b.block_id for b in victims])
        first_id = self.total_evictions + 1  # the victims' eviction ids, in order
        self._count(len(victims), reason, decision, pending)
        self._reprefill.on_evicts([b.key for b in dropped])
        if self.accounting is not None:
            ids: Sequence[int] = range(first_id, first_id + len(victims))
            if dropped is not victims:
                gone = {id(b) for b in dropped}
                ids = [i for i, b in zip(ids, victims, strict=True) if id(b) in gone]
            self.accounting.on_evict(dropped, ids, self._radix.num_reclaimable)
        if self.events is not None:
            self._write_events(victims, policy_name, reason, decision, reasons, first_id=first_id)
        return len(victims)

    def _left_device(self, blocks: list[CachedBlock]) -> None:
        """`blocks` left the device tree: their salts' quota books are told (`quotas.left`)."""
        if self.quotas:
            self.quotas.left(blocks)

    def _count(self, count: int, reason: str, decision: float, pending: int) -> None:
        """One eviction call's counters: `count` blocks dropped."""
        policy_name = self._binding.name
        pool = self._pool
        self.eviction_calls += 1
        self.total_evictions += count
        self.by_reason[reason] = self.by_reason.get(reason, 0) + count
        self.by_policy[policy_name] = self.by_policy.get(policy_name, 0) + count
        self.latency.record(decision)
        num_blocks = pool.num_blocks
        self._utilization_sum += min(pool.num_used + pending, num_blocks) / num_blocks
        self._utilization_samples += 1

    def _evict_compressing(self, n: int, reason: str, pending: int) -> int:
        """`evict` with compress-on-evict: each policy victim's chain (the victim and the
        ancestors only it kept alive) is compressed in place, giving back all but the blocks its
        kept tokens need; a chain too short to give one back is dropped. When the tree has no
        victim left, compressed entries are dropped, least recently used first. Returns blocks
        freed (compressed or dropped)."""
        store = self.compressed
        assert store is not None  # checked by the caller
        radix, pool = self._radix, self._pool
        freed, decision = 0, 0.0
        dropped: list[CachedBlock] = []
        dropped_why: list[dict[str, Any]] = []
        gone: list[tuple[CompressedPrefix, str]] = []  # dropped entries and why
        while freed < n:
            victims, took, why = self._next_victim()
            decision += took
            if not victims:
                break
            leaf = victims[0]
            chain = store.chain_above(leaf)
            if store.blocks_kept(len(chain) + 1) > len(chain):  # no block to give back
                pool.free([leaf.block_id])
                dropped.append(leaf)
                self._left_device([leaf])
                if self.explain:
                    dropped_why.append(_then(why, "drop: too short to give a block back when compressed"))
                gone += _because(store.drop_under(leaf.key), _UNDER)
                freed += 1
                continue
            for block in chain:  # nearest first: each is a leaf once the one below has left
                radix.remove(block)
            self._left_device([*chain, leaf])
            path = [*reversed(chain), leaf]
            gone += _because(store.drop_named(leaf.key if not chain else chain[-1].key), _AGAIN)
            for block in path:
                gone += _because(store.drop_under(block.key), _UNDER)
            entry, spare = store.compress(path)
            freed += len(spare)
            told = None if why is None else _then(why, "compress")  # why: None with explanation off
            self._compress_event(entry, path, len(spare), reason, told)
        if freed < n:
            gone += _because(store.drop_lru(n - freed), _LRU)
        freed += sum(len(e.blocks) for e, _ in gone)
        if not freed:
            return 0
        n_dropped = len(dropped) + sum(len(e.blocks) for e, _ in gone)
        first_id = self.total_evictions + 1
        self._count(n_dropped, reason, decision, pending)
        self._reprefill.on_evicts([b.key for b in dropped] + [k for e, _ in gone for k in e.keys])
        if self.accounting is not None:
            ids = range(first_id, first_id + len(dropped))
            self.accounting.on_evict(dropped, ids, self._radix.num_reclaimable)
        if self.events is not None and (dropped or gone):
            extra = n_dropped - len(dropped)
            reasons = dropped_why if self.explain else None  # one record per dropped leaf
            self._write_events(
                dropped, self._binding.name, reason, decision, reasons, extra=extra, first_id=first_id
            )
            self._drop_events(gone, reason)
        return freed

    def _next_victim(self) -> tuple[list[CachedBlock], float, dict[str, Any] | None]:
        """The policy's next victim, its decision time and (explanation on) why it was chosen."""
        if self.explain:
            victims, took, reasons = self._radix.evict_explained(1)
            return victims, took, reasons[0] if reasons else None
        victims, took = self._radix.evict(1)
        return victims, took, None

    def _compress_event(
        self,
        entry: CompressedPrefix,
        path: list[CachedBlock],
        n_freed: int,
        reason: str,
        why: dict[str, Any] | None,
    ) -> None:
        """A ``compress`` event for a chain compressed instead of evicted (reason ``evict:...``),
        naming the policy's victim (`block`, the chain's last) and the chain's blocks, with the
        policy's explanation when explanation is on."""
        if self.events is None:
            return
        store = self.compressed
        assert store is not None
        leaf = path[-1]
        self.events.compress(
            sequence_id=None,
            policy=str(store.spec),
            reason=f"evict:{reason}",
            tokens_before=len(path) * store.block_size,
            tokens_after=entry.kept,
            blocks_freed=n_freed,
            bytes_freed=None,
            duration_us=0.0,
            ts=self._clock(),
            victim={
                "block": format_block_key(leaf.key),
                "blocks": [format_block_key(b.key) for b in path],
                "chosen_by": self._binding.name,
                **({} if why is None else {"explain": why}),
            },
        )

    def _drop_events(self, gone: list[tuple[CompressedPrefix, str]], reason: str) -> None:
        """One ``drop_compressed`` event per compressed entry given up, with why."""
        events = self.events
        assert events is not None  # checked by the caller
        ts = self._clock()
        for entry, why in gone:
            events.drop_compressed(
                blocks=[format_block_key(k) for k in entry.keys],
                blocks_freed=len(entry.blocks),
                tokens_kept=entry.kept,
                hits=entry.hits,
                reason=reason,
                why=why,
                ts=ts,
            )

    def _demote(self, victims: list[CachedBlock], policy_name: str) -> list[CachedBlock]:
        """Demote each victim to the tiers; returns those that found no room (dropped, with
        their descendants below)."""
        tiers = self.tiers
        assert tiers is not None  # checked by the caller
        dropped: list[CachedBlock] = []
        for block in victims:
            if not tiers.demote(block, policy_name):
                dropped.append(block)
                if self.retention is not None:
                    self.retention.forget(block.key)  # a break when it was retained
                tiers.drop_below(block.key)
        if self.quotas:  # a salt past its host quota drops its own oldest host blocks
            assert self.quotas is not None
            gone = {id(b) for b in dropped}
            for block in victims:
                if id(block) not in gone:
                    for key in self.quotas.demoted(block.key):
                        if tiers.drop_key(key, "quota"):
                            self.quotas.dropped_host(block.key)
        return dropped

    def _write_events(
        self,
        victims: list[CachedBlock],
        policy_name: str,
        reason: str,
        decision: float,
        reasons: list[dict[str, Any]] | None,
        *,
        extra: int = 0,
        first_id: int,
    ) -> None:
        """One ``evict`` event per victim (numbered from `first_id`), then one ``freed`` event
        for the call (counting `extra` blocks of dropped compressed entries beside the victims)."""
        events = self.events
        assert events is not None  # checked by the caller
        ts = self._clock()
        for i, block in enumerate(victims):
            meta = block.meta
            parent = block.parent
            events.evict(
                block=format_block_key(block.key),
                parent=None if parent is None else format_block_key(parent.key),
                depth=block.depth,
                block_id=block.block_id,
                sequence_id=block.sequence_id,
                tenant=meta.tenant,
                policy=policy_name,
                reason=reason,
                last_access=meta.last_access,
                hits=meta.hits,
                priority=meta.priority,
                ts=ts,
                explain=None if reasons is None else reasons[i],
                eviction_id=first_id + i,
            )
        events.freed(
            policy=policy_name,
            reason=reason,
            blocks_freed=len(victims) + extra,
            total_freed=self.total_evictions,
            duration_us=decision * 1e6,
            ts=ts,
        )


# Why a compressed entry was given up (the ``why`` of a ``drop_compressed`` event).
_LRU = "least recently used compressed prefix: the tree had nothing left to evict"
_UNDER = "the tree block it continued left the tree"
_AGAIN = "its chain was cached again and is compressed anew"


def _because(entries: list[CompressedPrefix], why: str) -> list[tuple[CompressedPrefix, str]]:
    return [(e, why) for e in entries]


def _then(why: dict[str, Any] | None, then: str) -> dict[str, Any]:
    """The policy's explanation of a victim (or an empty one) with what became of the victim."""
    record = {} if why is None else dict(why)
    record["then"] = then
    return record
