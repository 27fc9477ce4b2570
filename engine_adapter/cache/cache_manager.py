"""The cache manager: the one object the scheduler, the server and the simulator talk to.

It owns the block pool's free list, the radix prefix cache and the eviction policy, and keeps
the metrics of docs/architecture.md, "Metrics". The request lifecycle::

    alloc = manager.allocate(seq_id, prompt_ids)        # match, lock the hit, allocate the rest
    manager.reserve_tokens(seq_id, n)  -> ids | None    # grow during decode; None: preempt someone
    manager.select_preemption_victims(blocks_needed)    # the policy's select_victims
    manager.preempt(seq_id, token_ids=...)              # cache its full blocks, release the rest
    manager.free_sequence(seq_id, token_ids=...)        # same when it finishes
    manager.evict_to_threshold()                        # background eviction to the watermark
    manager.swap_policy("arc")                          # hot swap, nothing lost
    manager.stats()                                     # GET /v1/eviction/stats

Block ids are the pool's; ``alloc.block_table[i]`` holds tokens ``[i*block_size, (i+1)*block_size)``.

Threading: one thread at a time. Every public method takes `lock` (a re-entrant lock), so the
engine can hold it across a step and the server can take it for `stats` or `swap_policy`.

This module does not import torch: it hands out block ids from a `BlockAllocator`; the engine's
`PagedKVPool` (`engine_adapter.model.kv_pool`) holds the tensors those ids index.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.errors import (
    BlockStateError,
    CacheInvariantError,
    NoEvictableBlocksError,
    RequestTooLargeError,
    SequenceExistsError,
    UnknownSequenceError,
)
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.invariants import check_manager_invariants
from engine_adapter.cache.radix_cache import (
    BlockMetaFields,
    CachedBlock,
    block_hashes,
    format_block_key,
    new_radix_cache,
    root_key,
)
from engine_adapter.cache.records import Allocation, LookupResult, PinnedPrefix, SequenceState, SwapResult
from engine_adapter.cache.stats import CacheStats
from sage_eviction import EvictionCandidate, EvictionPolicy
from sage_eviction.metrics import HitCounter, LatencyRecorder, ReprefillTracker
from sage_eviction.registry import resolve_policy

__all__ = [
    "PRIORITY_CLASSES",
    "Allocation",
    "CacheManager",
    "LookupResult",
    "PinnedPrefix",
    "SequenceState",
    "SwapResult",
]

PRIORITY_CLASSES = {0: "low", 1: "normal", 2: "high"}
"""The module spec's priority classes, for pool use by class."""


class CacheManager:
    """Pool + radix prefix cache + policy, with the allocation API the scheduler uses.

    Args:
        allocator: The free list of block ids (`PagedKVPool.allocator` in the engine).
        block_size: Tokens per block; must equal the pool's (defaults to it).
        policy: Policy spec, e.g. ``"lru"`` or ``"slru:protected_threshold=3"``; policies that take
            `capacity` get the pool size.
        max_pinned_ratio: At most this fraction of the pool may be pinned.
        eviction_threshold: When set, `evict_to_threshold` evicts down to this fraction of the
            pool in use.
        event_log: Where eviction events go; a ring-buffer-only log when None.
        record_events: False turns events off (fast simulation).
        isolate_tenants: Use the tenant as isolation key when a request gives no ``cache_salt``.
        clock: Time source (a virtual clock in simulation).
        protect_queued: Fraction of the pool that the cached prefixes of waiting requests may
            hold protected from eviction (`protect_queued_prefix`); 0 turns it off.
        explain: Each eviction event says why its victim went (O(n) per victim; see
            `engine_adapter.cache.explain`). May be switched at any time.
        compiled: The radix cache's hot paths in C (`engine_adapter.cache._core`) or in
            pure Python; None: compiled when built and not `SAGE_PURE_PYTHON`. Same results.

    Attributes:
        lock: Re-entrant lock held by every public method; the engine and server may hold it too.
        radix: The prefix cache.
        events: The event log, or None.
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int | None = None,
        policy: str = "lru",
        *,
        policy_params: dict[str, Any] | None = None,
        max_pinned_ratio: float = 0.5,
        eviction_threshold: float | None = None,
        event_log: EvictionEventLog | None = None,
        record_events: bool = True,
        isolate_tenants: bool = False,
        clock: Callable[[], float] = time.time,
        protect_queued: float = 0.0,
        explain: bool = False,
        compiled: bool | None = None,
    ) -> None:
        if block_size is None:
            block_size = allocator.block_size
        if block_size != allocator.block_size:
            raise ValueError(
                f"block_size={block_size} differs from the pool's block_size={allocator.block_size}"
            )
        if eviction_threshold is not None and not 0.0 <= eviction_threshold <= 1.0:
            raise ValueError(f"eviction_threshold={eviction_threshold!r} must be within [0, 1]")
        if not 0.0 <= protect_queued <= 1.0:
            raise ValueError(f"protect_queued={protect_queued!r} must be within [0, 1]")
        self.allocator = allocator
        self.block_size = block_size
        self.num_blocks = allocator.num_blocks
        self.eviction_threshold = eviction_threshold
        self.isolate_tenants = isolate_tenants
        self.clock = clock
        self.explain = explain
        self.lock = threading.RLock()

        resolved = resolve_policy(policy, self.num_blocks, **dict(policy_params or {}))
        self.policy_name = resolved.cls.name
        self.policy_params = resolved.params
        self.radix = new_radix_cache(
            resolved.build(), num_blocks=self.num_blocks, max_pinned_ratio=max_pinned_ratio, compiled=compiled
        )
        self.events: EvictionEventLog | None = None
        if record_events:
            self.events = event_log if event_log is not None else EvictionEventLog()
        self._sequences: dict[int, SequenceState] = {}
        # Queue-aware protection: a waiting request's cached prefix holds one reference on each
        # block (like a running sequence), so no policy can evict it before the request runs.
        self.protect_queued = protect_queued
        self.max_protected = int(protect_queued * self.num_blocks)
        self._protected: dict[Hashable, list[CachedBlock]] = {}  # request id -> its locked path
        self._protect_refs: dict[Hashable, int] = {}  # block key -> protections holding it
        self.protections_yielded = 0  # protections dropped so that an allocation could proceed
        # Pool reservations (an embedding batch's workspace): block ids off the free list that no
        # sequence or cached block owns, held until released; eviction makes room for them.
        self._reservations: dict[int, list[int]] = {}

        # metrics (docs/architecture.md, "Metrics")
        self._hits = HitCounter()
        self._reprefill = ReprefillTracker()
        self._evict_latency = LatencyRecorder()
        self._utilization_sum = 0.0
        self._utilization_samples = 0
        self.total_evictions = 0  # blocks
        self.eviction_calls = 0
        self.preemptions = 0
        self.policy_swaps = 0
        self.last_swap_time_s: float | None = None
        self._evictions_by_reason: dict[str, int] = {}
        self._evictions_by_policy: dict[str, int] = {}

    # ---- properties ---------------------------------------------------------------------

    @property
    def policy(self) -> EvictionPolicy:
        """The active policy."""
        return self.radix.policy

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the pool's free list."""
        return self.allocator.num_free

    @property
    def num_available_blocks(self) -> int:
        """Free blocks plus cached blocks that eviction could reclaim now (queued requests'
        protections yield to an allocation, so their blocks count)."""
        return self.allocator.num_free + self._reclaimable_for(())

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache (referenced or not)."""
        return len(self.radix)

    @property
    def num_sequences(self) -> int:
        """Running sequences (allocated and not freed)."""
        return len(self._sequences)

    def has_sequence(self, sequence_id: int) -> bool:
        """Whether `sequence_id` holds blocks."""
        return sequence_id in self._sequences

    def sequence(self, sequence_id: int) -> SequenceState:
        """The state of a running sequence (do not mutate).

        Raises:
            UnknownSequenceError: Not running.
        """
        seq = self._sequences.get(sequence_id)
        if seq is None:
            raise UnknownSequenceError(f"no running sequence {sequence_id}")
        return seq

    def block_table(self, sequence_id: int) -> list[int]:
        """A copy of the sequence's block ids in token order."""
        return list(self.sequence(sequence_id).block_table)

    def sequence_ids(self) -> list[int]:
        """Running sequence ids, in allocation order."""
        return list(self._sequences)

    # ---- keys ---------------------------------------------------------------------------

    def _salt(self, cache_salt: str | None, tenant: str | None) -> str | None:
        if cache_salt is not None:
            return cache_salt
        return tenant if self.isolate_tenants else None

    def _request_keys(
        self,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_tokens: int,
        salt: str | None,
    ) -> list[Hashable]:
        n_full = num_tokens // self.block_size
        if block_keys is not None:
            return list(block_keys[:n_full])
        assert token_ids is not None  # checked by the callers
        return list(block_hashes(token_ids[: n_full * self.block_size], self.block_size, salt=salt))

    @staticmethod
    def _num_tokens(
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_tokens: int | None,
        block_size: int,
    ) -> int:
        if num_tokens is None:
            if token_ids is not None:
                num_tokens = len(token_ids)
            elif block_keys is not None:
                num_tokens = len(block_keys) * block_size
            else:
                raise ValueError("give token_ids, or num_tokens with block_keys")
        elif token_ids is not None and num_tokens > len(token_ids):
            raise ValueError(f"num_tokens={num_tokens} exceeds the {len(token_ids)} token ids given")
        if token_ids is None and block_keys is None:
            raise ValueError("give token_ids or block_keys to match against the prefix cache")
        if num_tokens < 0:
            raise ValueError(f"num_tokens={num_tokens} is negative")
        return num_tokens

    # ---- lookup and allocation -------------------------------------------------------------

    def lookup(
        self,
        token_ids: Sequence[int] | None = None,
        *,
        num_tokens: int | None = None,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
        recompute_last_token: bool = True,
    ) -> LookupResult:
        """How much of a prompt is cached and whether `allocate` would fit; changes nothing.

        Arguments as in `allocate`.
        """
        with self.lock:
            n_tokens = self._num_tokens(token_ids, block_keys, num_tokens, self.block_size)
            keys = self._request_keys(token_ids, block_keys, n_tokens, self._salt(cache_salt, tenant))
            path = self.radix.match(keys[: self._max_match(n_tokens, recompute_last_token)])
            n_new = -(-n_tokens // self.block_size) - len(path)
            available = self.allocator.num_free + self._reclaimable_for(path)
            return LookupResult(
                num_cached_blocks=len(path),
                num_cached_tokens=len(path) * self.block_size,
                num_new_blocks=n_new,
                num_available_blocks=available,
                fits=n_new <= available and n_new + len(path) <= self.num_blocks,
            )

    def _max_match(self, n_tokens: int, recompute_last_token: bool) -> int:
        if recompute_last_token:
            return max(n_tokens - 1, 0) // self.block_size
        return n_tokens // self.block_size

    def _reclaimable_in(self, path: Sequence[CachedBlock]) -> int:
        return self.radix.reclaimable_in(path)

    def _reclaimable_for(self, path: Sequence[CachedBlock]) -> int:
        """Blocks eviction could reclaim for a request that locks `path`, once every queued
        request's protection has yielded (O(protected blocks); O(len(path)) without any)."""
        reclaimable = self.radix.num_reclaimable - self._reclaimable_in(path)
        refs = self._protect_refs
        if not refs:
            return reclaimable
        in_path = {b.key for b in path}
        get = self.radix.get
        for key, count in refs.items():
            block = get(key)
            # held by protections alone: reclaimable once they yield, unless the request locks it
            if block is not None and block.pin_count == 0 and block.ref_count == count and key not in in_path:
                reclaimable += 1
        return reclaimable

    def allocate(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        num_tokens: int | None = None,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        max_tokens: int = 0,
        deadline: float | None = None,
        estimated_lifetime: float | None = None,
        non_preemptible: bool = False,
        recompute_last_token: bool = True,
        conversation: str | None = None,
        match_prefix: bool = True,
    ) -> Allocation:
        """Give a new sequence its blocks: the cached prefix (locked) and fresh ones for the rest.

        Evicts exactly the deficit when the free list is short. Counts the lookup in `hit_rate`
        and `re_prefill_rate` only when it succeeds.

        Args:
            sequence_id: The request's id; must not be running.
            token_ids: Prompt token ids (hashed into block keys).
            num_tokens: Tokens to allocate blocks for (default: ``len(token_ids)``, or
                ``len(block_keys) * block_size``).
            block_keys: Precomputed chained keys of the prompt's blocks (e.g. Mooncake
                ``hash_ids``) instead of hashing `token_ids`; keys past the full blocks are ignored.
            tenant: Accounting key (fairness); the isolation key too with `isolate_tenants`.
            priority: Higher is more important; recorded in the blocks' meta.
            cache_salt: Isolation key: only requests with the same salt share blocks.
            max_tokens: Maximum length of the sequence (for predictive policies).
            deadline: Absolute time it should finish by (SLO-aware policies).
            estimated_lifetime: Predicted remaining life in seconds (predictive policies).
            non_preemptible: Never chosen by `select_preemption_victims`.
            recompute_last_token: Never serve the prompt's last token from cache, so the model
                computes its logits in a private block (set False in simulation).
            conversation: The conversation (session) it belongs to, recorded in its blocks'
                meta for the policies that learn from it.
            match_prefix: False computes the whole prompt even if cached (a prompt compressed
                after prefill is scored by the attention of all its queries).

        Returns:
            The block table and how many leading tokens are cached.

        Raises:
            SequenceExistsError: `sequence_id` is running.
            RequestTooLargeError: It needs more blocks than the pool has; nothing changed.
            NoEvictableBlocksError: Not enough free or reclaimable blocks now; nothing changed.
        """
        with self.lock:
            if sequence_id in self._sequences:
                raise SequenceExistsError(f"sequence {sequence_id} already holds blocks")
            bs = self.block_size
            n_tokens = self._num_tokens(token_ids, block_keys, num_tokens, bs)
            n_blocks = -(-n_tokens // bs)
            if n_blocks > self.num_blocks:
                raise RequestTooLargeError(
                    f"sequence {sequence_id} needs {n_blocks} blocks ({n_tokens} tokens of block_size {bs}) "
                    f"but the pool has {self.num_blocks}"
                )
            salt = self._salt(cache_salt, tenant)
            keys = self._request_keys(token_ids, block_keys, n_tokens, salt)
            radix = self.radix
            path = (
                radix.match(keys[: self._max_match(n_tokens, recompute_last_token)]) if match_prefix else []
            )
            n_new = n_blocks - len(path)
            deficit = self._deficit(sequence_id, path, n_new)
            protected = self._protected.pop(sequence_id, None)
            if protected is not None:  # it leaves the queue; its protected head is in `path`
                self._unprotect(protected)
            now = self.clock()
            # how long the prefix this request extends had been idle: a feature of its new blocks
            prefix_idle = max(now - path[-1].meta.last_access, 0.0) if path else None
            radix.lock(path)
            radix.touch(path, now)
            evicted = self._evict(deficit, "alloc", pending=n_new) if deficit > 0 else 0
            new_ids = self.allocator.allocate(n_new)
            seq = SequenceState(
                sequence_id=sequence_id,
                block_table=[b.block_id for b in path] + new_ids,
                cached_path=path,
                keys=keys,
                salt=salt,
                num_prompt_tokens=n_tokens,
                num_prompt_blocks=n_blocks,
                num_tokens=n_tokens,
                tenant=tenant,
                conversation=conversation,
                prefix_idle=prefix_idle,
                priority=priority,
                max_tokens=max_tokens,
                deadline=deadline,
                estimated_lifetime=estimated_lifetime,
                non_preemptible=non_preemptible,
                created_at=now,
                last_access=now,
                block_keys_given=block_keys is not None,
            )
            self._sequences[sequence_id] = seq
            n_cached_tokens = len(path) * bs
            self._record_lookup(tenant, keys, len(path), n_cached_tokens, n_tokens)
            return Allocation(
                sequence_id=sequence_id,
                block_table=list(seq.block_table),
                num_cached_blocks=len(path),
                num_cached_tokens=n_cached_tokens,
                num_new_blocks=n_new,
                num_evicted_blocks=evicted,
            )

    def _deficit(self, sequence_id: int, path: Sequence[CachedBlock], n_new: int) -> int:
        """Blocks to evict before `n_new` can be allocated beside the locked `path` (0 or more).

        Raises:
            NoEvictableBlocksError: The free and reclaimable blocks together fall short.
        """
        deficit = n_new - self.allocator.num_free
        if deficit > 0:
            reclaimable = self.radix.num_reclaimable - self._reclaimable_in(path)
            if deficit > reclaimable and self._protected and deficit <= self._reclaimable_for(path):
                # protection never fails an allocation that could succeed: the newest yield first
                while deficit > reclaimable:
                    self._yield_protection()
                    reclaimable = self.radix.num_reclaimable - self._reclaimable_in(path)
            if deficit > reclaimable:
                raise NoEvictableBlocksError(
                    f"sequence {sequence_id} needs {n_new} new blocks: {self.allocator.num_free} free "
                    f"and {reclaimable} reclaimable of {self.num_blocks}"
                )
        return max(deficit, 0)

    def _record_lookup(
        self, tenant: str | None, keys: list[Hashable], n_hit: int, hit_tokens: int, n_tokens: int
    ) -> None:
        """Count an admitted lookup: its hit tokens, and its missed blocks for the re-prefill rate."""
        self._hits.record(tenant, hit_tokens, n_tokens)
        if n_hit < len(keys):
            self._reprefill.on_requests(keys[n_hit:])

    def extend(self, sequence_id: int, num_blocks: int = 1) -> list[int] | None:
        """Append `num_blocks` fresh blocks to a running sequence (decode), evicting if short.

        Returns:
            The new block ids, or None when even eviction cannot free enough (nothing changed):
            the scheduler should preempt a sequence (`select_preemption_victims`) and retry.

        Raises:
            UnknownSequenceError: Not running.
            RequestTooLargeError: The sequence would outgrow the whole pool; it can never run.
        """
        with self.lock:
            seq = self.sequence(sequence_id)
            if num_blocks <= 0:
                if num_blocks < 0:
                    raise ValueError(f"cannot extend by num_blocks={num_blocks}")
                return []
            if len(seq.block_table) + num_blocks > self.num_blocks:
                raise RequestTooLargeError(
                    f"sequence {sequence_id} would need {len(seq.block_table) + num_blocks} blocks "
                    f"but the pool has {self.num_blocks}"
                )
            deficit = num_blocks - self.allocator.num_free
            short = deficit > self.radix.num_reclaimable
            if short and self._protected and deficit <= self._reclaimable_for(()):
                while deficit > self.radix.num_reclaimable:
                    self._yield_protection()
            if deficit > self.radix.num_reclaimable:
                return None
            if deficit > 0:
                self._evict(deficit, "alloc", pending=num_blocks)
            new_ids = self.allocator.allocate(num_blocks)
            seq.block_table.extend(new_ids)
            return new_ids

    def reserve_tokens(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Make the sequence's blocks cover `num_tokens` tokens in all, extending as needed.

        Returns:
            The new block ids (``[]`` when it already has room), or None when no block can be
            freed (nothing changed; preempt and retry).
        """
        with self.lock:
            seq = self.sequence(sequence_id)
            needed = -(-num_tokens // self.block_size) - len(seq.block_table)
            new_ids = self.extend(sequence_id, needed) if needed > 0 else []
            if new_ids is not None and num_tokens > seq.num_tokens:
                seq.num_tokens = num_tokens
            return new_ids

    def touch_sequence(self, sequence_id: int) -> None:
        """Record that a running sequence made progress (for preemption order)."""
        with self.lock:
            seq = self.sequence(sequence_id)
            seq.last_access = self.clock()
            seq.access_count += 1
            self.policy.update_access(sequence_id)

    # ---- caching and release -------------------------------------------------------------

    def _full_keys(
        self,
        seq: SequenceState,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_computed_tokens: int | None,
    ) -> list[Hashable]:
        """Keys of the sequence's full, computed blocks that it holds (extends the chain)."""
        if seq.compressed:
            return []  # compacted K/V are not the prefix their tokens name: never cached
        bs = self.block_size
        if num_computed_tokens is None:
            if token_ids is not None:
                num_computed_tokens = len(token_ids)
            elif block_keys is not None:
                num_computed_tokens = len(block_keys) * bs
            else:
                num_computed_tokens = seq.num_tokens
        elif token_ids is not None and num_computed_tokens > len(token_ids):
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens} exceeds the {len(token_ids)} token ids given"
            )
        n_full = min(num_computed_tokens // bs, len(seq.block_table))
        if block_keys is not None:
            return list(block_keys[:n_full])
        known = seq.keys
        if len(known) < n_full and token_ids is not None and not seq.block_keys_given:
            parent = known[-1] if known else root_key(seq.salt)
            assert isinstance(parent, int)
            known.extend(block_hashes(token_ids[: n_full * bs], bs, parent=parent, start_block=len(known)))
        return known[:n_full]

    def commit_blocks(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
    ) -> int:
        """Cache a running sequence's newly full blocks now, so other requests can share them.

        The sequence keeps a reference on them. Stops at the first block whose key another
        sequence cached meanwhile (that block and later ones stay private until `free_sequence`).

        Returns:
            Blocks newly cached.
        """
        with self.lock:
            seq = self.sequence(sequence_id)
            keys = self._full_keys(seq, token_ids, block_keys, num_computed_tokens)
            fields = self._meta_fields(seq, self.clock())
            return self.radix.commit(seq.cached_path, keys, seq.block_table, sequence_id, fields)

    def free_sequence(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
        cache: bool = True,
    ) -> int:
        """Release a finished sequence: cache its full computed blocks, free the rest.

        Args:
            sequence_id: The sequence.
            token_ids: Every token whose K/V is in its blocks (prompt and fed-back output);
                without it only the prompt's blocks can be cached.
            block_keys: Precomputed keys of its blocks instead of `token_ids`.
            num_computed_tokens: Fewer tokens were computed than given (preempted mid-prefill).
            cache: False frees everything that is not already cached.

        Returns:
            Blocks newly cached.
        """
        with self.lock:
            seq = self.sequence(sequence_id)
            keys = self._full_keys(seq, token_ids, block_keys, num_computed_tokens) if cache else []
            fields = self._meta_fields(seq, self.clock())
            added, to_free = self.radix.release(seq.cached_path, keys, seq.block_table, sequence_id, fields)
            del self._sequences[sequence_id]
            if to_free:
                self.allocator.free(to_free)
            return added

    def compaction_gain(self, sequence_id: int, num_tokens: int) -> int:
        """Blocks that compacting the sequence to `num_tokens` would give back to the pool (free
        or reclaimable), less the fresh blocks its copy takes: negative when the sequence holds
        mostly shared prefix blocks, which stay for the others."""
        with self.lock:
            seq = self.sequence(sequence_id)
            path = seq.cached_path
            released = len(seq.block_table) - len(path)
            released += sum(1 for b in path if b.ref_count == 1 and b.pin_count == 0)
            return released - -(-num_tokens // self.block_size)

    def compact_sequence(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Give a sequence whose K/V token-level eviction compacts a fresh table for `num_tokens`.

        Its cached prefix is unlocked (those blocks stay in the tree: they still hold the
        original prefix, for others to hit or the policy to evict), its private blocks are
        freed, and ``ceil(num_tokens / block_size)`` blocks are allocated, evicting cached ones
        only if the free list is short. From then on the sequence is `compressed`: none of its
        blocks is committed to the prefix cache, and freeing it frees them all. The caller must
        have copied out the K/V it keeps (the old blocks may be reused at once).

        Returns:
            The new block table, or None when even eviction cannot give the blocks (nothing
            changed).
        """
        with self.lock:
            seq = self.sequence(sequence_id)
            needed = -(-num_tokens // self.block_size)
            path = seq.cached_path
            private = seq.block_table[len(path) :]
            # Blocks of its path only it references become reclaimable when it unlocks them.
            freed_by_unlock = sum(1 for b in path if b.ref_count == 1 and b.pin_count == 0)
            if needed > self.allocator.num_free + len(private) + self.radix.num_reclaimable + freed_by_unlock:
                return None
            self.radix.unlock(path)
            if private:
                self.allocator.free(private)
            deficit = needed - self.allocator.num_free
            if deficit > 0:
                self._evict(deficit, "alloc", pending=needed)
            seq.block_table = self.allocator.allocate(needed)
            seq.cached_path = []
            seq.keys = []
            seq.compressed = True
            seq.num_tokens = num_tokens
            return list(seq.block_table)

    def preempt(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
    ) -> int:
        """Preempt a running sequence by recompute: like `free_sequence`, and counted.

        Its full blocks stay cached, so its re-prefill can hit. Returns blocks newly cached.
        """
        with self.lock:
            added = self.free_sequence(
                sequence_id, token_ids, block_keys=block_keys, num_computed_tokens=num_computed_tokens
            )
            self.preemptions += 1
            return added

    def _meta_fields(self, seq: SequenceState, now: float) -> BlockMetaFields:
        """The policy records of the blocks `seq` caches now are made of these (`.meta(i)`)."""
        return BlockMetaFields(
            self.block_size,
            seq.priority,
            seq.tenant,
            now,
            seq.estimated_lifetime,
            seq.num_tokens,
            seq.max_tokens,
            seq.deadline,
            seq.num_prompt_blocks,
            seq.conversation,
            seq.prefix_idle,
        )

    # ---- queue-aware protection ----------------------------------------------------------

    def protect_queued_prefix(
        self,
        request_id: Hashable,
        token_ids: Sequence[int] | None = None,
        *,
        num_tokens: int | None = None,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
        recompute_last_token: bool = True,
    ) -> int:
        """Protect from eviction the cached prefix a waiting request will hit, until it is
        allocated (`allocate` with the same id) or leaves the queue (`release_queued`).

        The protected blocks of all waiting requests stay within `protect_queued` of the pool: a
        prefix that does not fit whole is protected as far as it fits (its head, which its hit
        needs first). An allocation or a decode block that could not be had otherwise takes
        the protections back, newest first (`protections_yielded`). Protecting is no hit: the
        policy is not told of an access. A no-op when `protect_queued` is 0.

        Arguments as in `allocate`; `request_id` is the sequence id it will be allocated with.

        Returns:
            Blocks it protects.
        """
        with self.lock:
            if self.max_protected <= 0:
                return 0
            self.release_queued(request_id)
            n_tokens = self._num_tokens(token_ids, block_keys, num_tokens, self.block_size)
            keys = self._request_keys(token_ids, block_keys, n_tokens, self._salt(cache_salt, tenant))
            path = self.radix.match(keys[: self._max_match(n_tokens, recompute_last_token)])
            room = self.max_protected - len(self._protect_refs)
            refs = self._protect_refs
            end = 0
            for block in path:  # the longest head of the path within the budget
                if block.key not in refs:
                    if room <= 0:
                        break
                    room -= 1
                end += 1
            if end:
                self._protect(request_id, path[:end])
            return end

    def release_queued(self, request_id: Hashable) -> int:
        """End a waiting request's protection (it left the queue); returns blocks it protected."""
        with self.lock:
            path = self._protected.pop(request_id, None)
            if path is None:
                return 0
            self._unprotect(path)
            return len(path)

    @property
    def num_protected_blocks(self) -> int:
        """Distinct blocks protected for waiting requests now."""
        return len(self._protect_refs)

    def protected_paths(self) -> list[list[CachedBlock]]:
        """The locked paths of the waiting requests' protections (for the invariants)."""
        return [list(path) for path in self._protected.values()]

    def _protect(self, request_id: Hashable, path: list[CachedBlock]) -> None:
        self.radix.lock(path)
        refs = self._protect_refs
        for block in path:
            refs[block.key] = refs.get(block.key, 0) + 1
        self._protected[request_id] = path

    def _unprotect(self, path: list[CachedBlock]) -> None:
        self.radix.unlock(path)
        refs = self._protect_refs
        for block in path:
            left = refs[block.key] - 1
            if left:
                refs[block.key] = left
            else:
                del refs[block.key]

    def _yield_protection(self) -> None:
        """Drop the newest protection (an allocation needs its blocks)."""
        request_id = next(reversed(self._protected))
        self._unprotect(self._protected.pop(request_id))
        self.protections_yielded += 1

    # ---- pins ---------------------------------------------------------------------------

    def pin(
        self,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> PinnedPrefix:
        """Pin the cached full-block prefix of `token_ids` (a system prompt) against eviction.

        Pins nest; only the part already cached is pinned (see `PinnedPrefix.num_blocks`).

        Raises:
            PinLimitError: More than `max_pinned_ratio` of the pool would be pinned; nothing changed.
        """
        with self.lock:
            n_tokens = self._num_tokens(token_ids, block_keys, None, self.block_size)
            keys = self._request_keys(token_ids, block_keys, n_tokens, self._salt(cache_salt, tenant))
            path = self.radix.match(keys)
            newly = self.radix.pin(path)
            return PinnedPrefix(tuple(b.key for b in path), len(path), newly)

    def unpin(
        self,
        prefix: PinnedPrefix | Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Drop one pin from a prefix (the `PinnedPrefix` that `pin` returned, or its token ids).

        With token ids, the leading pinned run of the cached prefix is unpinned.

        Returns:
            Blocks no longer pinned at all.

        Raises:
            BlockStateError: A block of a `PinnedPrefix` is no longer pinned; nothing changed.
        """
        with self.lock:
            if isinstance(prefix, PinnedPrefix):
                path = self.radix.match(prefix.keys)
                if len(path) != prefix.num_blocks:
                    raise BlockStateError(
                        f"pinned prefix of {prefix.num_blocks} blocks has only {len(path)} cached"
                    )
            else:
                n_tokens = self._num_tokens(prefix, block_keys, None, self.block_size)
                keys = self._request_keys(prefix, block_keys, n_tokens, self._salt(cache_salt, tenant))
                path = self.radix.match(keys)
                run = 0
                while run < len(path) and path[run].pin_count > 0:
                    run += 1
                path = path[:run]
            return self.radix.unpin(path)

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks pinned now."""
        return self.radix.num_pinned

    # ---- eviction -----------------------------------------------------------------------

    def _evict(self, n: int, reason: str, *, pending: int = 0) -> int:
        """Evict up to `n` blocks, free them, record metrics and events.

        `pending` blocks are about to be allocated from the freed ones; memory utilization is
        sampled as if they were (the state right after the eviction served its purpose).
        """
        reasons: list[dict[str, Any]] | None = None
        if self.explain:
            victims, decision, reasons = self.radix.evict_explained(n)
        else:
            victims, decision = self.radix.evict(n)
        if not victims:
            return 0
        self.allocator.free([b.block_id for b in victims])
        count = len(victims)
        policy_name = self.policy_name
        self.eviction_calls += 1
        self.total_evictions += count
        self._evictions_by_reason[reason] = self._evictions_by_reason.get(reason, 0) + count
        self._evictions_by_policy[policy_name] = self._evictions_by_policy.get(policy_name, 0) + count
        self._evict_latency.record(decision)
        self._utilization_sum += min(self.allocator.num_used + pending, self.num_blocks) / self.num_blocks
        self._utilization_samples += 1
        self._reprefill.on_evicts([b.key for b in victims])
        events = self.events
        if events is not None:
            ts = self.clock()
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
                )
            events.freed(
                policy=policy_name,
                reason=reason,
                blocks_freed=count,
                total_freed=self.total_evictions,
                duration_us=decision * 1e6,
                ts=ts,
            )
        return count

    def evict(self, num_blocks: int, *, reason: str = "manual") -> int:
        """Evict up to `num_blocks` cached blocks now (cascading); returns how many."""
        with self.lock:
            return self._evict(num_blocks, reason)

    def evict_to_threshold(self) -> int:
        """Background eviction: evict down to `eviction_threshold` of the pool in use.

        Returns:
            Blocks evicted (0 when no threshold is set or usage is below it).
        """
        with self.lock:
            if self.eviction_threshold is None:
                return 0
            target = math.floor(self.eviction_threshold * self.num_blocks)
            excess = min(self.allocator.num_used - target, self.radix.num_reclaimable)
            return self._evict(excess, "watermark") if excess > 0 else 0

    def reset_prefix_cache(self) -> int:
        """Drop every unreferenced, unpinned cached block (not counted as evictions), and forget
        which blocks were evicted before, so that the next run's re-prefill rate is its own.

        Returns:
            Blocks freed.
        """
        with self.lock:
            self._reprefill.forget()
            removed = self.radix.reclaim_all()
            if removed:
                self.allocator.free([b.block_id for b in removed])
            return len(removed)

    # ---- reservations ------------------------------------------------------------------------

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks held by reservations now."""
        return sum(len(ids) for ids in self._reservations.values())

    def reservations(self) -> dict[int, list[int]]:
        """Each reservation's block ids (copies; for checks and tests)."""
        with self.lock:
            return {owner: list(ids) for owner, ids in self._reservations.items()}

    def reserve_blocks(self, owner: int, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks out of the pool for `owner` (an embedding batch's workspace),
        evicting unreferenced cached blocks when the free list is short, as an allocation does.

        Admission and eviction see a reservation as used blocks that are neither cached nor
        reclaimable: `num_available_blocks` excludes them until `release_reservation`.

        Returns:
            The block ids, or None when free and reclaimable blocks fall short (nothing changed).

        Raises:
            ValueError: `owner` already holds a reservation, or `num_blocks` is not positive.
            RequestTooLargeError: More blocks than the pool has.
        """
        with self.lock:
            if owner in self._reservations:
                raise ValueError(f"reservation {owner} already holds blocks")
            if num_blocks <= 0:
                raise ValueError(f"cannot reserve {num_blocks} blocks")
            if num_blocks > self.num_blocks:
                raise RequestTooLargeError(
                    f"a reservation of {num_blocks} blocks exceeds the pool of {self.num_blocks}"
                )
            try:
                deficit = self._deficit(owner, (), num_blocks)
            except NoEvictableBlocksError:
                return None
            if deficit > 0:
                self._evict(deficit, "reserve", pending=num_blocks)
            ids = self.allocator.allocate(num_blocks)
            self._reservations[owner] = ids
            return list(ids)

    def release_reservation(self, owner: int) -> int:
        """Give a reservation's blocks back to the free list; returns how many (0: none held)."""
        with self.lock:
            ids = self._reservations.pop(owner, None)
            if not ids:
                return 0
            self.allocator.free(ids)
            return len(ids)

    # ---- preemption -------------------------------------------------------------------------

    def preemption_candidates(self, exclude: Iterable[int] = ()) -> list[EvictionCandidate]:
        """The running sequences as the spec's `EvictionCandidate`s."""
        with self.lock:
            skip = set(exclude)
            return [
                EvictionCandidate(
                    sequence_id=s.sequence_id,
                    block_ids=list(s.block_table),
                    last_access_time=s.last_access,
                    access_count=s.access_count,
                    priority=s.priority,
                    is_pinned=s.non_preemptible,
                    estimated_lifetime=s.estimated_lifetime,
                    sequence_length=s.num_tokens,
                    max_length=s.max_tokens,
                )
                for s in self._sequences.values()
                if s.sequence_id not in skip
            ]

    def select_preemption_victims(
        self,
        required_blocks: int,
        candidates: list[EvictionCandidate] | None = None,
        *,
        exclude: Iterable[int] = (),
    ) -> list[int]:
        """Sequences to preempt, in policy order, until they free `required_blocks`
        (the policy's `select_victims`; all unpinned ones when together they cannot).

        Args:
            required_blocks: Blocks the caller needs.
            candidates: The caller's candidates; by default every running sequence not in `exclude`.
            exclude: Sequence ids never to choose (e.g. the one asking).
        """
        with self.lock:
            if candidates is None:
                candidates = self.preemption_candidates(exclude)
            return self.policy.select_victims(candidates, required_blocks)

    # ---- hot swap -----------------------------------------------------------------------------

    def swap_policy(self, spec: str, **params: Any) -> SwapResult:
        """Replace the policy with one built by `from_entries(old.entries(), ...)`, handed over
        as three columns (`entry_columns` / `from_entry_columns`, the same entries and state).

        Nothing is evicted or lost; on any error the old policy stays. Policies taking
        `capacity` get the pool size.

        Args:
            spec: ``name`` or ``name:k=v,...``.
            **params: More params (override the spec's).

        Raises:
            UnknownPolicyError, PolicyParamError: As `resolve_policy`; nothing changed.
        """
        with self.lock:
            resolved = resolve_policy(spec, self.num_blocks, **params)
            old = self.radix.policy
            # Building millions of entries would trigger many cyclic-GC passes over the whole
            # heap (about half the swap time at 1e6 blocks); nothing here makes cycles to collect.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                # `entries()` / `from_entries` as three columns: no record built per entry.
                t0 = time.perf_counter()
                keys, metas, flags = old.entry_columns()
                t1 = time.perf_counter()
                new = resolved.build((keys, metas, flags))
                t2 = time.perf_counter()
            finally:
                if gc_was_enabled:
                    gc.enable()
            if len(new) != len(self.radix) or new.num_evictable != old.num_evictable:
                raise CacheInvariantError(
                    f"swap to {resolved.cls.name!r} holds {len(new)} entries "
                    f"({new.num_evictable} evictable); the cache has {len(self.radix)} "
                    f"({old.num_evictable} evictable); kept {old.name!r}"
                )
            if keys and new.meta(keys[0]) is not metas[0]:
                # The new policy copied the metas: point the blocks at its records.
                for block in self.radix.blocks():
                    block.meta = new.meta(block.key)
            self.radix.set_policy(new)
            result = SwapResult(
                old_name=self.policy_name,
                old_params=dict(self.policy_params),
                new_name=resolved.cls.name,
                new_params=dict(resolved.params),
                swap_time_s=t2 - t0,
                entries=len(keys),
                entries_time_s=t1 - t0,
                build_time_s=t2 - t1,
            )
            self.policy_name = resolved.cls.name
            self.policy_params = resolved.params
            self.policy_swaps += 1
            self.last_swap_time_s = result.swap_time_s
            return result

    # ---- metrics --------------------------------------------------------------------------

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from cache / prompt tokens looked up."""
        return self._hits.hit_rate

    @property
    def re_prefill_blocks(self) -> int:
        """Evicted blocks that were requested again so far (cheap: the engine reads it each step)."""
        return self._reprefill.re_prefilled

    def stats(self) -> CacheStats:
        """The metrics as a `CacheStats` (docs/architecture.md, "Metrics")."""
        with self.lock:
            p50, p99 = self._evict_latency.quantiles(0.5, 0.99)
            used = self.allocator.num_used
            return CacheStats(
                strategy=self.policy_name.upper(),
                policy=self.policy_name,
                params=dict(self.policy_params),
                total_evictions=self.total_evictions,
                eviction_calls=self.eviction_calls,
                avg_eviction_time_us=self._evict_latency.mean * 1e6,
                p50_eviction_time_us=p50 * 1e6,
                p99_eviction_time_us=p99 * 1e6,
                re_prefill_rate=self._reprefill.rate,
                fairness_score=self._hits.fairness,
                hit_rate=self._hits.hit_rate,
                memory_utilization=(
                    self._utilization_sum / self._utilization_samples
                    if self._utilization_samples
                    else used / self.num_blocks
                ),
                total_blocks=self.num_blocks,
                used_blocks=used,
                free_blocks=self.allocator.num_free,
                cached_blocks=len(self.radix),
                evictable_blocks=self.radix.num_evictable,
                pinned_blocks=self.radix.num_pinned,
                total_freed_blocks=self.total_evictions,
                evictions_by_reason=dict(self._evictions_by_reason),
                evictions_by_policy=dict(self._evictions_by_policy),
                preemptions=self.preemptions,
                policy_swaps=self.policy_swaps,
                last_swap_time_s=self.last_swap_time_s,
                prefix_cache_queries_tokens=self._hits.lookups,
                prefix_cache_hits_tokens=self._hits.hits,
                re_prefill_blocks=self._reprefill.re_prefilled,
                running_sequences=len(self._sequences),
                reserved_blocks=self.num_reserved_blocks,
            )

    def usage(self) -> dict[str, Any]:
        """Pool use now, by tenant and by priority class (``GET /v1/cache/usage``, the top view,
        per-tenant metrics): cached blocks by their meta, running sequences' private blocks by
        the sequence. O(n); not for hot paths."""
        with self.lock:
            by_tenant: dict[str, int] = {}
            by_class: dict[str, int] = {}

            def add(tenant: str | None, priority: int, n: int) -> None:
                if n <= 0:
                    return
                t = "-" if tenant is None else tenant
                c = PRIORITY_CLASSES.get(priority, f"priority {priority}")
                by_tenant[t] = by_tenant.get(t, 0) + n
                by_class[c] = by_class.get(c, 0) + n

            for block in self.radix.blocks():
                add(block.meta.tenant, block.meta.priority, 1)
            for seq in self._sequences.values():
                add(seq.tenant, seq.priority, len(seq.block_table) - len(seq.cached_path))
            return {
                "num_blocks": self.num_blocks,
                "used_blocks": self.allocator.num_used,
                "free_blocks": self.allocator.num_free,
                "cached_blocks": len(self.radix),
                "evictable_blocks": self.radix.num_evictable,
                "pinned_blocks": self.radix.num_pinned,
                "reserved_blocks": self.num_reserved_blocks,
                "by_tenant": by_tenant,
                "by_class": by_class,
            }

    def tenant_hit_rates(self) -> dict[str | None, float]:
        """Hit rate per tenant (the inputs of `fairness_score`)."""
        with self.lock:
            return self._hits.tenant_hit_rates()

    # ---- invariants ---------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Verify the pool, the tree, the sequences and the policy against each other (O(n); tests).

        Checks: free + used = total; the free list has no duplicates and matches the pool's
        flags; every used block is owned exactly once (by the tree or by one sequence) and no
        free block is owned; ref counts equal the sequences holding each block and are never
        negative; every block a sequence holds is still cached (nothing referenced was
        evicted); pins within the limit; the cached set is prefix-closed; the policy holds
        exactly the cached blocks with the right evictable flags.

        Raises:
            CacheInvariantError: With what is wrong.
        """
        with self.lock:
            check_manager_invariants(self)
