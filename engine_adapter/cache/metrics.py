"""The cache's lookup metrics, and the `CacheStats` snapshot of every part's counters.

`CacheMetrics` counts what admissions looked up (hit tokens overall and per tenant, the missed
blocks that the re-prefill rate watches for) and preemptions; the eviction step tells the same
re-prefill tracker which blocks it evicted. `snapshot` reads these and the other parts' counters
(pool, radix index, policy binding, eviction step) into one `CacheStats`
(docs/architecture.md, "Metrics"). Called under the cache manager's lock. Imports `accounting`,
`block_allocator`, `eviction`, `policy_binding`, `radix_cache`, `stats` and the policy library's
metrics.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from engine_adapter.cache.accounting import CacheAccounting
from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.policy_binding import PolicyBinding
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.stats import CacheStats, TierStats
from sage_eviction.metrics import HitCounter, ReprefillTracker, reprefill_window

__all__ = ["CacheMetrics"]


class CacheMetrics:
    """Lookups, re-prefills and preemptions of one cache.

    Attributes:
        hits: Prompt tokens looked up and served from cache, overall and per tenant.
        reprefill: Evicted blocks and the ones requested again within its window.
        preemptions: Sequences preempted.
        accounting: Ages, regret and lookup records (`accounting`).
    """

    __slots__ = ("accounting", "hits", "preemptions", "reprefill")

    def __init__(self, accounting: CacheAccounting, capacity: int, whole_run: bool = False) -> None:
        self.accounting = accounting
        self.hits = HitCounter()
        # The cache's one re-prefill record (its policies record none: `PolicyBinding`), over the
        # last `reprefill_window(capacity)` evictions: bounded however long the cache serves. A
        # simulator row (`whole_run`) keeps every eviction of its run, as its compiled loops do:
        # its trace bounds the keys, and its rate is then the exact one.
        self.reprefill = ReprefillTracker(None if whole_run else reprefill_window(capacity))
        self.preemptions = 0

    def record_lookup(
        self, tenant: str | None, keys: list[Hashable], n_hit: int, hit_tokens: int, n_tokens: int
    ) -> None:
        """Count an admitted lookup: its hit tokens, and its missed blocks for the re-prefill rate."""
        self.hits.record(tenant, hit_tokens, n_tokens)
        if n_hit < len(keys):
            self.reprefill.on_requests(keys[n_hit:])

    def snapshot(
        self,
        pool: BlockAllocator,
        radix: RadixCache,
        binding: PolicyBinding,
        eviction: EvictionStep,
        *,
        running_sequences: int,
        reserved_blocks: int,
        tiers: tuple[TierStats, ...] = (),
        prefetched: tuple[int, int] = (0, 0),
        compressed: dict[str, int] | None = None,
    ) -> CacheStats:
        """Every counter now, as a `CacheStats`."""
        p50, p99 = eviction.latency.quantiles(0.5, 0.99)
        used = pool.num_used
        utilization = eviction.memory_utilization()
        return CacheStats(
            strategy=binding.name.upper(),
            policy=binding.name,
            params=dict(binding.params),
            total_evictions=eviction.total_evictions,
            eviction_calls=eviction.eviction_calls,
            avg_eviction_time_us=eviction.latency.mean * 1e6,
            p50_eviction_time_us=p50 * 1e6,
            p99_eviction_time_us=p99 * 1e6,
            re_prefill_rate=self.reprefill.rate,
            fairness_score=self.hits.fairness,
            hit_rate=self.hits.hit_rate,
            memory_utilization=used / pool.num_blocks if utilization is None else utilization,
            total_blocks=pool.num_blocks,
            used_blocks=used,
            free_blocks=pool.num_free,
            cached_blocks=len(radix),
            evictable_blocks=radix.num_evictable,
            pinned_blocks=radix.num_pinned,
            total_freed_blocks=eviction.total_evictions,
            evictions_by_reason=dict(eviction.by_reason),
            evictions_by_policy=dict(eviction.by_policy),
            preemptions=self.preemptions,
            policy_swaps=binding.swaps,
            last_swap_time_s=binding.last_swap_time_s,
            prefix_cache_queries_tokens=self.hits.lookups,
            prefix_cache_hits_tokens=self.hits.hits,
            re_prefill_blocks=self.reprefill.re_prefilled,
            re_prefill_window=self.reprefill.window or 0,  # 0: the whole run
            running_sequences=running_sequences,
            reserved_blocks=reserved_blocks,
            tiers=tiers,
            prefetched_blocks=prefetched[0],
            prefetch_hits=prefetched[1],
            **({} if compressed is None else _compressed_fields(compressed)),
            **self.accounting.snapshot(),
        )


def _compressed_fields(counters: dict[str, int]) -> dict[str, Any]:
    """`CacheStats`' compress-on-evict fields from `CompressedPrefixes.counters`."""
    return {
        "compressed_prefixes": counters["entries"],
        "compressed_blocks": counters["blocks"],
        "compressions": counters["compressions"],
        "compressed_hits": counters["hits"],
        "compressed_hit_tokens": counters["hit_tokens"],
    }
