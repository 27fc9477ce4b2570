"""`CacheStats`: one typed snapshot of the cache's metrics, what `CacheManager.stats()` returns.

`to_dict()` is the JSON of ``GET /v1/eviction/stats`` (docs/architecture.md, "Control API"); the
metrics are defined in docs/architecture.md, "Metrics". The engine, the server, the simulator and
the tests read the fields, never keys by string. `metrics.CacheMetrics.snapshot` builds it.
Imports only `ages` of the cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.ages import HistogramSnapshot

__all__ = ["CacheStats", "TierStats"]


@dataclass(frozen=True, slots=True)
class TierStats:
    """One lower KV tier's figures (host or disk; docs/architecture.md, "Tiers").

    Attributes:
        tier: ``host`` or ``disk``.
        policy: The registry name of the tier's eviction policy.
        capacity_blocks: Its slots.
        used_blocks: Slots holding a block now.
        hits: Blocks a lookup or prefetch found here (and promoted to the device pool).
        demotions: Blocks that came down into this tier (evicted from the tier above).
        promotions: Blocks copied from here into the device pool.
        drops: Blocks that left this tier and every tier (gone; a later lookup misses).
        blocks_moved_in: Block copies written into this tier (demotions and write-through).
        blocks_moved_out: Block copies read out of it (promotions and demotions below it).
        policy_swaps: Hot swaps of its policy.
        loads: Load batches timed (one per step and source tier that loaded blocks back; the
            engine times them, the core and the simulator do not).
        load_time_p50_ms, load_time_p99_ms: A timed load's wall time (0 before the first).
        prefetched_blocks: Blocks loaded from here ahead of time for queued requests.
        prefetch_hits: Of those, blocks their request found on the device when it was admitted.
    """

    tier: str
    policy: str
    capacity_blocks: int
    used_blocks: int
    hits: int
    demotions: int
    promotions: int
    drops: int
    blocks_moved_in: int
    blocks_moved_out: int
    policy_swaps: int
    loads: int = 0
    load_time_p50_ms: float = 0.0
    load_time_p99_ms: float = 0.0
    prefetched_blocks: int = 0
    prefetch_hits: int = 0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The cache's metrics at one moment.

    Attributes:
        strategy: The policy's name in capitals, as the module spec prints it.
        policy: The registry name of the active policy.
        params: Its params.
        total_evictions: Blocks evicted (by every reason).
        eviction_calls: Times the policy was asked for victims.
        avg_eviction_time_us: Mean wall time of a policy decision.
        p50_eviction_time_us: Its median.
        p99_eviction_time_us: Its 99th percentile.
        re_prefill_rate: Evicted blocks requested again later / evicted blocks, a block counted
            when it comes back within `re_prefill_window` evictions of its own.
        fairness_score: Jain's index over per-tenant hit rates.
        hit_rate: Prompt tokens served from cache / prompt tokens looked up.
        memory_utilization: Used / total blocks right after each eviction, averaged (used / total
            before the first eviction).
        total_blocks: Blocks in the pool.
        used_blocks: Blocks handed out.
        free_blocks: Blocks on the free list.
        cached_blocks: Blocks in the radix cache.
        evictable_blocks: Cached blocks the policy may choose now.
        pinned_blocks: Cached blocks pinned.
        total_freed_blocks: Blocks evicted (the module spec's name for `total_evictions`).
        evictions_by_reason: Evicted blocks per reason (``alloc``, ``watermark`` ...).
        evictions_by_policy: Evicted blocks per policy (it changes with hot swaps).
        preemptions: Running sequences preempted.
        policy_swaps: Hot swaps so far.
        last_swap_time_s: The last swap's pause, or None.
        prefix_cache_queries_tokens: Prompt tokens looked up.
        prefix_cache_hits_tokens: Of those, tokens served from cache.
        re_prefill_blocks: Evicted blocks that came back.
        running_sequences: Sequences holding blocks now.
        reserved_blocks: Blocks held by pool reservations now (embedding batches' workspace).
        tiers: The host and disk tiers' figures, top down (empty without tiers).
        prefetched_blocks: Blocks loaded back from host or disk ahead of time for queued requests.
        prefetch_hits: Of those, blocks their request found on the device when it was admitted.
        compressed_prefixes: Compressed prefixes held now (compress-on-evict; 0 when off), in
            `compressed_blocks` blocks.
        compressions: Cached chains compressed instead of evicted.
        compressed_hits: Admissions served (in part) from a compressed prefix, and
            `compressed_hit_tokens` the prompt tokens they reused from one.
        missed_blocks, ghost_hits, regrets, regret_ratio, ghost_capacity, thrashing,
            thrashing_threshold, window_regret_ratio: Regret (`accounting.AccountingStats`;
            docs/architecture.md, "Ages and regret").
        re_prefill_window: The evictions a re-prefill is looked for in (`re_prefill_rate`):
            4 x the pool's blocks, at least 8192 (`sage_eviction.metrics.reprefill_window`); 0 in
            a simulator row, which counts over its whole run.
        age_histograms: Block age at hit and at eviction, reuse distance at hit and regret age,
            per policy and tenant (`ages.HistogramSnapshot`).
        retained_blocks: Blocks under an unexpired retention now (prompt-cache lifetimes,
            `retention`), in every tier.
        retention_granted_blocks: Block retentions granted or lengthened (a hit's refresh counts).
        retention_refused_blocks: Blocks refused retention (no lower tier, the device share of
            `--max-retained-fraction` full).
        retention_broken_blocks: Retained blocks dropped before they expired (every lower tier
            full of unexpired blocks, or, without one, the pool needed for a request).
        retention_expired_blocks: Retentions that lapsed.
        salt_quotas: Each salt with a quota (at most `quotas.MAX_QUOTA_SALTS`): its caps, the
            device and host blocks it holds now, and its quota hits: its own blocks evicted for
            its writes, blocks not cached, promotions cut, host blocks dropped (`quotas`).
        cache_accounts: Per tenant and salt (a salt as `receipts.salt_label`; at most
            `MAX_TENANTS` rows, the rest under `OTHER_TENANTS`): requests, prompt tokens, tokens
            read per tier and written, lifetimes granted and refused (`receipts.TOTAL_FIELDS`).
    """

    strategy: str
    policy: str
    params: dict[str, Any]
    total_evictions: int
    eviction_calls: int
    avg_eviction_time_us: float
    p50_eviction_time_us: float
    p99_eviction_time_us: float
    re_prefill_rate: float
    fairness_score: float
    hit_rate: float
    memory_utilization: float
    total_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    evictable_blocks: int
    pinned_blocks: int
    total_freed_blocks: int
    evictions_by_reason: dict[str, int]
    evictions_by_policy: dict[str, int]
    preemptions: int
    policy_swaps: int
    last_swap_time_s: float | None
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    re_prefill_blocks: int
    running_sequences: int
    reserved_blocks: int = 0
    tiers: tuple[TierStats, ...] = ()
    prefetched_blocks: int = 0
    prefetch_hits: int = 0
    compressed_prefixes: int = 0
    compressed_blocks: int = 0
    compressions: int = 0
    compressed_hits: int = 0
    compressed_hit_tokens: int = 0
    missed_blocks: int = 0
    ghost_hits: int = 0
    regrets: int = 0
    regret_ratio: float = 0.0
    ghost_capacity: int = 0
    thrashing: bool = False
    thrashing_threshold: float = 0.0
    window_regret_ratio: float | None = None
    re_prefill_window: int = 0
    age_histograms: tuple[HistogramSnapshot, ...] = ()
    retained_blocks: int = 0
    retention_granted_blocks: int = 0
    retention_refused_blocks: int = 0
    retention_broken_blocks: int = 0
    retention_expired_blocks: int = 0
    salt_quotas: tuple[dict[str, Any], ...] = ()
    cache_accounts: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``GET /v1/eviction/stats``, fields in order (dicts copied)."""
        out = {
            f.name: dict(value) if isinstance(value := getattr(self, f.name), dict) else value
            for f in dataclasses.fields(self)
        }
        out["tiers"] = [dataclasses.asdict(t) for t in self.tiers]
        out["age_histograms"] = [h.to_dict() for h in self.age_histograms]
        out["salt_quotas"] = [dict(q) for q in self.salt_quotas]
        out["cache_accounts"] = [dict(a) for a in self.cache_accounts]
        return out
