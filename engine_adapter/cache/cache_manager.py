"""The cache manager: the one object the scheduler, the server and the simulator talk to.

A front over the cache core's parts, each in its own module (listed in the package docstring,
`engine_adapter.cache`; docs/architecture.md, "Cache core"), as vLLM v1 keeps its
`KVCacheManager` over its `BlockPool` and `kv_cache_utils`. A request enters as a
`CacheRequest` (`admission`); once running, it is addressed by its sequence id (`sequences`).

The request lifecycle::

    request = CacheRequest(seq_id, prompt_ids, tenant=...)  # built once by the caller
    manager.protect_queued_prefix(request)              # while it waits (queue-aware protection)
    alloc = manager.allocate(request)                   # match, lock the hit, allocate the rest
    manager.reserve_tokens(seq_id, n)  -> ids | None    # grow during decode; None: preempt someone
    manager.commit_blocks(seq_id, token_ids)            # share its newly full blocks
    manager.select_preemption_victims(blocks_needed)    # in `preemption_order` (the scheduler's)
    manager.preempt(seq_id, token_ids=...)              # cache its full blocks, release the rest
    manager.free_sequence(seq_id, token_ids=...)        # same when it finishes
    manager.evict_to_threshold()                        # background eviction to the watermark
    manager.swap_policy("arc")                          # hot swap, nothing lost
    manager.stats()                                     # GET /v1/eviction/stats
    manager.take_moves()                                # with KV tiers: copies for the engine

Block ids are the pool's; ``alloc.block_table[i]`` holds tokens ``[i*block_size, (i+1)*block_size)``.

Threading: one thread at a time. Every public method takes `lock` (a re-entrant lock), so the
engine can hold it across a step and the server can take it for `stats` or `swap_policy`; the
parts have no locks of their own and are only called under it.

This module does not import torch: it hands out block ids from a `BlockAllocator`; the engine's
`PagedKVPool` (`engine_adapter.model.kv_pool`) holds the tensors those ids index. It imports the
parts and the policy library; no part imports it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from engine_adapter.cache.accounting import CacheAccounting
from engine_adapter.cache.admission import Admission
from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.compress_front import CompressFront
from engine_adapter.cache.compressed import CompressedPrefixes, CompressSpec
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.invariants import check_manager_invariants
from engine_adapter.cache.lookup_log import LookupLog
from engine_adapter.cache.metrics import CacheMetrics
from engine_adapter.cache.pins import Pins
from engine_adapter.cache.policy_binding import PolicyBinding
from engine_adapter.cache.promotion import Prefetches
from engine_adapter.cache.prompt_keys import PromptKeys
from engine_adapter.cache.queue_front import QueueFront
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.quota_front import QuotaFront
from engine_adapter.cache.radix_cache import RadixCache, new_radix_cache
from engine_adapter.cache.receipts_front import ReceiptsFront, attach_receipts
from engine_adapter.cache.records import Allocation, LookupResult, PinnedPrefix, SequenceState, SwapResult
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.reservations import Reservations
from engine_adapter.cache.retention import Retention, RetentionConfig
from engine_adapter.cache.retention_front import RetentionFront
from engine_adapter.cache.sequences import RunningSequences
from engine_adapter.cache.stats import CacheStats
from engine_adapter.cache.tier_front import TierFront
from engine_adapter.cache.tiers import TierConfig, TierStore
from engine_adapter.cache.usage import pool_usage
from sage_eviction import EvictionCandidate, EvictionPolicy, PreemptionOrder

__all__ = ["CacheManager"]


class CacheManager(QueueFront, TierFront, CompressFront, RetentionFront, QuotaFront, ReceiptsFront):
    """Pool + radix prefix cache + policy, with the allocation API the scheduler uses; with
    `tiers`, a host (and disk) tier under the pool (the methods in `tier_front.TierFront`).

    Args:
        allocator: The free list of block ids (`PagedKVPool.allocator` in the engine).
        block_size: Tokens per block; must equal the pool's (defaults to it).
        policy: Policy spec (``"lru"``, ``"slru:protected_threshold=3"``); `capacity` is the pool size.
        policy_params: More params (override the spec's).
        max_pinned_ratio: At most this fraction of the pool may be pinned.
        eviction_threshold: When set, `evict_to_threshold` evicts down to this fraction of the pool in use.
        event_log: Where eviction events go; a ring-buffer-only log when None.
        record_events: False turns events off (fast simulation).
        isolate_tenants: Use the tenant as isolation key when a request gives no ``cache_salt``.
        clock: Time source (a virtual clock in simulation).
        protect_queued: Fraction of the pool that the cached prefixes of waiting requests may
            hold protected from eviction (`protect_queued_prefix`); 0 turns it off.
        explain: Each eviction event says why its victim went (O(n) a victim, `explain`); switchable.
        compiled: The radix cache's hot paths in C (`_core`) or Python; None: C when built. Same results.
        tiers: Host and disk tiers under the pool (`TierConfig`, in blocks); None or 0: evictions drop.
        compress_on_evict: ``PRESS:RATIO`` (or a `CompressSpec`): an evicted chain is compacted
            in place instead of dropped (`compressed`, the methods in `compress_front`); None: off.
        ghost_factor: The regret ghost set keeps this many times the pool's blocks (`accounting`).
        int_keys: Every block key is an int64 (the simulator checks): the regret ghost set in C.
        lookup_log: Where each admitted lookup's record goes (`lookup_log`); None: off.
        retention: What prompt-cache contracts are granted (`retention`); None: the defaults.
        whole_run_reprefill: Re-prefills over the whole run, not a window (a simulator row's).

    Attributes:
        lock: Re-entrant lock held by every public method; the engine and server may hold it too.
        radix: The prefix cache.
        events: The event log, or None.
    """

    preemption_order: PreemptionOrder | None = None  # the scheduler's order; None: the policy's

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
        tiers: TierConfig | None = None,
        compress_on_evict: CompressSpec | str | None = None,
        ghost_factor: float = 2.0,
        int_keys: bool = False,
        lookup_log: LookupLog | None = None,
        retention: RetentionConfig | None = None,
        whole_run_reprefill: bool = False,
    ) -> None:
        if block_size is None:
            block_size = allocator.block_size
        if block_size != allocator.block_size:
            raise ValueError(f"block_size={block_size} differs from the pool's {allocator.block_size}")
        self.allocator, self.block_size, self.num_blocks = allocator, block_size, allocator.num_blocks
        self.isolate_tenants, self.clock, self.protect_queued = isolate_tenants, clock, protect_queued
        self.lock = HandoffLock()  # the engine loop hands it to control requests between steps
        self._binding = PolicyBinding(policy, self.num_blocks, policy_params)
        self.radix: RadixCache = new_radix_cache(
            self._binding.new_policy(),
            num_blocks=self.num_blocks,
            max_pinned_ratio=max_pinned_ratio,
            compiled=compiled,
        )
        self.events = (event_log if event_log is not None else EvictionEventLog()) if record_events else None
        keys = self._keys = PromptKeys(block_size, isolate_tenants)
        protection = self._protection = QueueProtection(self.radix, protect_queued)
        acct = CacheAccounting(self.num_blocks, clock, self._binding, ghost_factor, lookup_log, int_keys)
        metrics = self._metrics = CacheMetrics(acct, self.num_blocks, whole_run_reprefill)
        store = self._tiers = TierStore.from_config(tiers, self.events, clock, metrics.reprefill.on_evicts)
        squeeze = CompressedPrefixes.from_spec(compress_on_evict, block_size, allocator, clock)
        self._compressed = squeeze
        eviction = self._eviction = EvictionStep(
            self.radix, allocator, self._binding, protection, metrics.reprefill, self.events, clock,
            explain=explain, threshold=eviction_threshold, tiers=store, compressed=squeeze, accounting=acct,
        )  # fmt: skip
        self._reservations, self._pins = Reservations(allocator, eviction), Pins(self.radix, keys)
        kept = self._retention = Retention(retention, self.radix, clock, tiered=store is not None)
        eviction.bind_retention(kept)
        quotas = self._bind_quotas(self.radix, store, eviction, evict_own=squeeze is None)
        running = self._running = RunningSequences(
            allocator, self.radix, keys, eviction, protection, clock, store, squeeze, kept, quotas
        )  # fmt: skip
        self._admission = Admission(allocator, self.radix, keys, protection, running, metrics, store, squeeze)
        self._receipts = attach_receipts(acct, running, kept, store, self.radix, block_size, clock)
        self._prefetches = Prefetches.from_config(tiers, self.radix, store, allocator, eviction)

    # ---- properties ---------------------------------------------------------------------

    @property
    def policy(self) -> EvictionPolicy:
        """The active policy."""
        return self.radix.policy

    @property
    def policy_name(self) -> str:
        """The active policy's registry name."""
        return self._binding.name

    @property
    def policy_params(self) -> dict[str, Any]:
        """The active policy's params."""
        return self._binding.params

    @property
    def explain(self) -> bool:
        """Whether eviction events say why each victim went (may be switched at any time)."""
        return self._eviction.explain

    @explain.setter
    def explain(self, on: bool) -> None:
        self._eviction.explain = on

    @property
    def eviction_threshold(self) -> float | None:
        """The watermark of `evict_to_threshold`, a fraction of the pool, or None."""
        return self._eviction.threshold

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the pool's free list."""
        return self.allocator.num_free

    @property
    def num_available_blocks(self) -> int:
        """Free blocks plus cached blocks that eviction could reclaim now (queued requests'
        protections yield to an allocation, so their blocks count)."""
        reclaimable = self._protection.reclaimable_for(()) + self._eviction.compressed_reclaimable()
        return self.allocator.num_free + reclaimable

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache (referenced or not)."""
        return len(self.radix)

    @property
    def num_sequences(self) -> int:
        """Running sequences (allocated and not freed)."""
        return len(self._running)

    def has_sequence(self, sequence_id: int) -> bool:
        """Whether `sequence_id` holds blocks."""
        return sequence_id in self._running

    def sequence(self, sequence_id: int) -> SequenceState:
        """The state of a running sequence (do not mutate); `UnknownSequenceError` if not running."""
        return self._running.get(sequence_id)

    def block_table(self, sequence_id: int) -> list[int]:
        """A copy of the sequence's block ids in token order."""
        return list(self._running.get(sequence_id).block_table)

    def sequence_ids(self) -> list[int]:
        """Running sequence ids, in allocation order."""
        return self._running.ids()

    # ---- a request's life: lookup, admission, growth, caching, release, preemption, compaction ----

    def lookup(self, request: CacheRequest) -> LookupResult:
        """How much of a request's prompt is cached and whether `allocate` would fit; changes nothing."""
        with self.lock:
            return self._admission.lookup(request)

    def allocate(self, request: CacheRequest) -> Allocation:
        """Give a new sequence its blocks: the cached prefix (locked) and fresh ones for the rest.

        Evicts exactly the deficit when the free list is short. Ends the request's queue
        protection. Counts the lookup in `hit_rate` and `re_prefill_rate` only when it succeeds.

        Args:
            request: The request; its `sequence_id` must not be running.

        Returns:
            The block table and how many leading tokens are cached.

        Raises:
            SequenceExistsError: `request.sequence_id` is running.
            RequestTooLargeError: It needs more blocks than the pool has; nothing changed.
            NoEvictableBlocksError: Not enough free or reclaimable blocks now; nothing changed.
        """
        with self.lock:
            alloc = self._admission.allocate(request)
            if self._prefetches is not None:
                self._prefetches.admitted(
                    request.sequence_id, self._running.get(request.sequence_id).cached_path
                )
            return alloc

    def extend(self, sequence_id: int, num_blocks: int = 1) -> list[int] | None:
        """Append `num_blocks` fresh blocks to a running sequence (decode), evicting if short: the
        new ids, or None when even eviction cannot free enough (nothing changed; preempt someone,
        `select_preemption_victims`, and retry). `UnknownSequenceError`, `RequestTooLargeError`:
        not running; it would outgrow the pool."""
        with self.lock:
            return self._running.extend(sequence_id, num_blocks)

    def reserve_tokens(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Make the sequence's blocks cover `num_tokens` tokens in all, extending as needed: the
        new block ids (``[]`` when it has room), or None when no block can be freed (as `extend`)."""
        with self.lock:
            return self._running.reserve_tokens(sequence_id, num_tokens)

    def reserve_tokens_many(self, wants: Sequence[tuple[int, int]]) -> int:
        """`reserve_tokens` of each (id, tokens) in turn, one lock: how many got theirs before a None."""
        with self.lock:
            return self._running.reserve_many(wants)

    def touch_sequence(self, sequence_id: int) -> None:
        """Record that a running sequence made progress (for preemption order)."""
        with self.lock:
            self._running.touch(sequence_id)

    def commit_blocks(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
    ) -> int:
        """Cache a running sequence's newly full blocks now, so other requests can share them; it
        keeps a reference on them. Stops at the first block whose key another sequence cached
        meanwhile (that block and later ones stay private until `free_sequence`). Returns blocks
        newly cached."""
        with self.lock:
            return self._running.commit(sequence_id, token_ids, block_keys, num_computed_tokens)

    def free_sequence(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
        cache: bool = True,
    ) -> int:
        """Release a finished sequence: cache its full computed blocks (none past its write
        limit: explicit writes, generated tokens not cached, `retention`), free the rest; returns
        blocks newly cached.

        Args:
            sequence_id: The sequence.
            token_ids: Every token whose K/V is in its blocks (prompt and fed-back output);
                without it only the prompt's blocks can be cached.
            block_keys: Precomputed keys of its blocks instead of `token_ids`.
            num_computed_tokens: Fewer tokens were computed than given (preempted mid-prefill).
            cache: False frees everything that is not already cached.
        """
        with self.lock:
            return self._running.release(sequence_id, token_ids, block_keys, num_computed_tokens, cache)

    def preempt(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        num_computed_tokens: int | None = None,
    ) -> int:
        """Preempt a running sequence by recompute: like `free_sequence`, and counted; its full
        blocks stay cached, so its re-prefill can hit. Returns blocks newly cached."""
        with self.lock:
            running = self._running
            added = running.release(sequence_id, token_ids, block_keys, num_computed_tokens, True, False)
            self._metrics.preemptions += 1
            return added

    def preemption_candidates(self, exclude: Iterable[int] = ()) -> list[EvictionCandidate]:
        """The running sequences as the spec's `EvictionCandidate`s."""
        with self.lock:
            return self._running.candidates(exclude)

    def select_preemption_victims(
        self,
        required_blocks: int,
        candidates: list[EvictionCandidate] | None = None,
        *,
        exclude: Iterable[int] = (),
    ) -> list[int]:
        """Sequences to preempt, in `preemption_order` (None: the policy's), until they free
        `required_blocks` (the policy's `select_victims`; all unpinned ones when they cannot).

        Args:
            required_blocks: Blocks the caller needs.
            candidates: The caller's candidates; by default every running sequence not in `exclude`.
            exclude: Sequence ids never to choose (e.g. the one asking).
        """
        with self.lock:
            if candidates is None:
                candidates = self.preemption_candidates(exclude)
            return self.policy.select_victims(candidates, required_blocks, self.preemption_order)

    def compaction_gain(self, sequence_id: int, num_tokens: int) -> int:
        """Blocks that compacting the sequence to `num_tokens` would give back to the pool (free
        or reclaimable), less the fresh blocks its copy takes (`compaction.compaction_gain`)."""
        with self.lock:
            return self._running.compaction_gain(sequence_id, num_tokens)

    def compact_sequence(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Give a sequence whose K/V token-level eviction compacts a fresh table for `num_tokens`
        (`compaction`); from then on it is `compressed`. Returns the new table, or None when even
        eviction cannot give the blocks (nothing changed)."""
        with self.lock:
            return self._running.compact(sequence_id, num_tokens)

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
            return self._pins.pin(token_ids, block_keys, tenant, cache_salt)

    def unpin(
        self,
        prefix: PinnedPrefix | Sequence[int] | None = None,
        *,
        block_keys: Sequence[Hashable] | None = None,
        tenant: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Drop one pin from a prefix (the `PinnedPrefix` that `pin` returned, or its token ids:
        then the leading pinned run of its cached prefix); returns blocks no longer pinned at all.

        Raises:
            BlockStateError: A block of a `PinnedPrefix` is no longer pinned; nothing changed.
        """
        with self.lock:
            return self._pins.unpin(prefix, block_keys, tenant, cache_salt)

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks pinned now."""
        return self.radix.num_pinned

    # ---- eviction -----------------------------------------------------------------------

    @property
    def total_evictions(self) -> int:
        """Blocks evicted so far (by every reason)."""
        return self._eviction.total_evictions

    @property
    def eviction_calls(self) -> int:
        """Evictions that evicted at least one block."""
        return self._eviction.eviction_calls

    def evict(self, num_blocks: int, *, reason: str = "manual") -> int:
        """Evict up to `num_blocks` cached blocks now (cascading); returns how many."""
        with self.lock:
            return self._eviction.evict(num_blocks, reason)

    def evict_to_threshold(self) -> int:
        """Background eviction down to `eviction_threshold` of the pool in use; returns blocks
        evicted (0 when no threshold is set or usage is below it)."""
        with self.lock:
            return self._eviction.evict_to_threshold()

    def reset_prefix_cache(self) -> int:
        """Drop every unreferenced, unpinned cached block (not counted as evictions), and forget
        which blocks were evicted before, so that the next run's re-prefill rate is its own;
        returns blocks freed."""
        with self.lock:
            self._metrics.reprefill.forget()
            self._metrics.accounting.forget()
            self._retention.clear()
            self._quotas.clear_books()
            below = self._tiers.resident_below() if self._tiers is not None else {}
            removed = self.radix.reclaim_all()
            dropped = 0 if self._compressed is None else self._compressed.drop_all()
            if self._tiers is not None:
                self._tiers.clear()
            if removed:
                self.allocator.free([b.block_id for b in removed])
            if self.events is not None and self.events.record_stores:
                self.events.reset(
                    blocks=[format_block_key(b.key) for b in removed],
                    below={tier: [format_block_key(k) for k in keys] for tier, keys in below.items()},
                    remaining=len(self.radix),
                    ts=self.clock(),
                )
            return len(removed) + dropped

    # ---- reservations ------------------------------------------------------------------------

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks held by reservations now."""
        return self._reservations.num_blocks

    def reservations(self) -> dict[int, list[int]]:
        """Each reservation's block ids (copies; for checks and tests)."""
        with self.lock:
            return self._reservations.snapshot()

    def reserve_blocks(self, owner: int, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks out of the pool for `owner` (an embedding batch's workspace),
        evicting unreferenced cached blocks when the free list is short, as an allocation does.
        They are used but neither cached nor reclaimable until `release_reservation`.

        Returns:
            The block ids, or None when free and reclaimable blocks fall short (nothing changed).

        Raises:
            ValueError: `owner` already holds a reservation, or `num_blocks` is not positive.
            RequestTooLargeError: More blocks than the pool has.
        """
        with self.lock:
            return self._reservations.reserve(owner, num_blocks)

    def release_reservation(self, owner: int) -> int:
        """Give a reservation's blocks back to the free list; returns how many (0: none held)."""
        with self.lock:
            return self._reservations.release(owner)

    # ---- hot swap -----------------------------------------------------------------------------

    @property
    def policy_swaps(self) -> int:
        """Hot swaps done."""
        return self._binding.swaps

    @property
    def last_swap_time_s(self) -> float | None:
        """The last hot swap's pause in seconds, or None."""
        return self._binding.last_swap_time_s

    def swap_policy(self, spec: str, **params: Any) -> SwapResult:
        """Hot swap: a new policy (``name`` or ``name:k=v,...``, `params` overriding) built from
        the old one's entries (`PolicyBinding.swap`). Nothing is evicted or lost; on any error
        (`UnknownPolicyError`, `PolicyParamError`, as `resolve_policy`) the old policy stays."""
        with self.lock:
            return self._binding.swap(self.radix, spec, **params)

    # ---- metrics and checks ----------------------------------------------------------------

    @property
    def preemptions(self) -> int:
        """Sequences preempted so far."""
        return self._metrics.preemptions

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from cache / prompt tokens looked up."""
        return self._metrics.hits.hit_rate

    @property
    def accounting(self) -> CacheAccounting:
        """Ages, regret and the lookup log (`accounting`; read it under `lock`)."""
        return self._metrics.accounting

    @property
    def re_prefill_blocks(self) -> int:
        """Evicted blocks that were requested again so far (cheap: the engine reads it each step)."""
        return self._metrics.reprefill.re_prefilled

    def stats(self) -> CacheStats:
        """The metrics as a `CacheStats` (docs/architecture.md, "Metrics")."""
        with self.lock:
            snapshot = self._metrics.snapshot(
                self.allocator,
                self.radix,
                self._binding,
                self._eviction,
                running_sequences=len(self._running),
                reserved_blocks=self.num_reserved_blocks,
                tiers=() if self._tiers is None else self._tiers.stats(),
                prefetched=self._prefetches.counts() if self._prefetches is not None else (0, 0),
                compressed=None if self._compressed is None else self._compressed.counters(),
            )
            fields = {**self._retention.counters(), **self._quota_fields(), **self._receipt_fields()}
            return dataclasses.replace(snapshot, **fields)

    def usage(self) -> dict[str, Any]:
        """Pool use now, by tenant and by priority class (``GET /v1/cache/usage``, the top view,
        per-tenant metrics; `usage.pool_usage`). O(n); not for hot paths."""
        with self.lock:
            return pool_usage(self.allocator, self.radix, self._running.states(), self.num_reserved_blocks)

    def tenant_hit_rates(self) -> dict[str | None, float]:
        """Hit rate per tenant (the inputs of `fairness_score`)."""
        with self.lock:
            return self._metrics.hits.tenant_hit_rates()

    def check_invariants(self) -> None:
        """Verify the pool, the tree, the sequences, the protections, the reservations and the
        policy against each other (O(n); tests). The checks: `invariants`.

        Raises:
            CacheInvariantError: With what is wrong.
        """
        with self.lock:
            check_manager_invariants(
                self.allocator,
                self.radix,
                self._running.states(),
                self._reservations.snapshot(),
                self._protection,
                self._tiers,
                [] if self._prefetches is None else self._prefetches.paths(),
                self._compressed,
            )
