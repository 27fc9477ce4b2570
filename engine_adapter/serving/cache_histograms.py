"""The cache's ages and regret on ``/metrics``: a Prometheus collector read at each scrape.

The cache core keeps its age and reuse-distance histograms and its regret counts itself
(`engine_adapter.cache.accounting`; the simulator reads the same ones), so the engine does not
observe them twice: `CacheAccountingCollector` turns the cache's snapshot into metric families
when ``/metrics`` is read (docs/architecture.md, "Ages and regret"). The families:

- ``sage:block_age_at_hit_seconds{policy, tenant}``, ``sage:block_age_at_eviction_seconds{policy,
  tenant}``, ``sage:block_reuse_distance_blocks{policy, tenant}`` and
  ``sage:regret_age_seconds{policy, tenant}`` (histograms; `ages.HISTOGRAM_KINDS`);
- ``sage:missed_blocks_total``, ``sage:ghost_hits_total`` and ``sage:regrets_total`` (counters),
  ``sage:regret_ratio`` and ``sage:thrashing`` (0 or 1; gauges), each with the active ``policy``.

Imports prometheus_client and the cache's stats and ages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_adapter.cache.ages import HISTOGRAM_KINDS
from engine_adapter.cache.stats import CacheStats

__all__ = ["HISTOGRAM_NAMES", "CacheAccountingCollector"]

HISTOGRAM_NAMES = {
    "age_at_hit_seconds": ("sage:block_age_at_hit_seconds", "Age of a cached block when a lookup hits it."),
    "age_at_eviction_seconds": ("sage:block_age_at_eviction_seconds", "Age of a block when it is evicted."),
    "reuse_distance_blocks": (
        "sage:block_reuse_distance_blocks",
        "Block lookups since a hit block's previous lookup.",
    ),
    "regret_age_seconds": (
        "sage:regret_age_seconds",
        "Seconds between an avoidable eviction and the lookup that missed the block.",
    ),
}
"""The exposed name and help of each of the cache's histograms, by kind."""


class CacheAccountingCollector(Collector):
    """Collects the cache's age histograms and regret counts from `stats` at each scrape.

    Args:
        stats: Returns the cache's `CacheStats` now (`CacheManager.stats`, which takes the lock).
    """

    def __init__(self, stats: Callable[[], CacheStats]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        """Nothing up front: the families are made at each scrape."""
        return []

    @staticmethod
    def _add(
        family: HistogramMetricFamily,
        policy: str,
        tenant: str,
        bounds: tuple[float, ...],
        counts: tuple[int, ...],
        total: float,
    ) -> None:
        """One series: the cumulative buckets of `counts` (one per bound, then +Inf)."""
        cumulative, buckets = 0, []
        for bound, count in zip([*map(repr, bounds), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family.add_metric([policy, tenant], buckets, total)

    def collect(self) -> Iterator[Metric]:
        """The families, from the cache's stats now."""
        stats = self._stats()
        labels = ["policy", "tenant"]
        families = {
            kind: HistogramMetricFamily(name, doc, labels=labels)
            for kind, (name, doc) in HISTOGRAM_NAMES.items()
        }
        seen = set()
        for h in stats.age_histograms:
            self._add(families[h.kind], h.policy, h.tenant, h.bounds, h.counts, h.total)
            seen.add((h.kind, h.policy))
        # Until the active policy observes something, a series at zero (no tenant) stands for it,
        # as every other metric exists from the start: a fresh engine's panels read 0, not
        # "no data" (issue 48).
        for kind, family in families.items():
            if (kind, stats.policy) not in seen:
                bounds = HISTOGRAM_KINDS[kind]
                self._add(family, stats.policy, "-", bounds, (0,) * (len(bounds) + 1), 0.0)
        yield from families.values()
        policy = [stats.policy]
        for name, doc, value in (
            ("sage:missed_blocks", "Prompt blocks lookups missed.", stats.missed_blocks),
            (
                "sage:ghost_hits",
                "Missed blocks that were evicted recently (in the ghost set).",
                stats.ghost_hits,
            ),
            ("sage:regrets", "Missed blocks whose eviction was avoidable.", stats.regrets),
        ):
            counter = CounterMetricFamily(name, doc, labels=["policy"])
            counter.add_metric(policy, float(value))
            yield counter
        for name, doc, gauge_value in (
            ("sage:regret_ratio", "Regrets / missed blocks.", stats.regret_ratio),
            (
                "sage:thrashing",
                f"1 while the last window's regret ratio is at least {stats.thrashing_threshold}.",
                float(stats.thrashing),
            ),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["policy"])
            gauge.add_metric(policy, gauge_value)
            yield gauge
