"""The per-salt quotas in ``/metrics`` (issue 51, item 4): one series per salt *with a quota*.

Label cardinality is bounded by the bound on quotas (`engine_adapter.cache.quotas.MAX_QUOTA_SALTS`
salts, two tiers, four events): a salt without a quota never gets a series, and a deleted quota's
series go at the next scrape (every scrape sets the families afresh, as
``sage:kv_cache_blocks_by_tenant`` is). The families:

- ``sage:salt_quota_limit_blocks{salt, tier}``: the cap (``device``, ``host``; a tier that is not
  capped has no series);
- ``sage:salt_quota_used_blocks{salt, tier}``: the blocks the salt holds there now;
- ``sage:salt_quota_hit_blocks{salt, event}``: blocks the quota acted on since it was set:
  ``own_eviction`` (its own blocks evicted for its writes), ``not_cached``, ``promotion_cut``,
  ``host_drop``. A gauge, not a counter: it starts again from 0 when a quota is deleted and set anew.

Registered on the engine's own registry (`metrics.EngineMetrics.registry`) the first time
``/metrics`` is read. Imports prometheus_client only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["SaltQuotaMetrics"]

_EVENTS = (
    ("own_eviction", "device_evictions"),
    ("not_cached", "not_cached_blocks"),
    ("promotion_cut", "promotions_cut"),
    ("host_drop", "host_drops"),
)


class SaltQuotaMetrics:
    """The three per-salt families, on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.limit = Gauge(
            "sage:salt_quota_limit_blocks",
            "A salt's quota of cached blocks, by tier (salts with a quota only).",
            ("salt", "tier"),
            registry=registry,
        )
        self.used = Gauge(
            "sage:salt_quota_used_blocks",
            "Cached blocks a salt with a quota holds now, by tier.",
            ("salt", "tier"),
            registry=registry,
        )
        self.hits = Gauge(
            "sage:salt_quota_hit_blocks",
            "Blocks a salt's quota acted on since it was set: own_eviction, not_cached, "
            "promotion_cut, host_drop.",
            ("salt", "event"),
            registry=registry,
        )

    def set(self, views: Iterable[Mapping[str, Any]]) -> None:
        """The quotas now (`CacheManager.quotas()`): every family set afresh."""
        for family in (self.limit, self.used, self.hits):
            family.clear()
        for view in views:
            salt = str(view["salt"])
            for tier in ("device", "host"):
                cap = view.get(f"{tier}_blocks")
                if cap is not None:
                    self.limit.labels(salt=salt, tier=tier).set(cap)
                self.used.labels(salt=salt, tier=tier).set(view.get(f"{tier}_blocks_used", 0))
            for event, key in _EVENTS:
                self.hits.labels(salt=salt, event=event).set(view.get(key, 0))
