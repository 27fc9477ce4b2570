"""Block ages and reuse distances as fixed-bucket histograms, per policy and per tenant.

The cache counts, for each lookup and each eviction (docs/architecture.md, "Ages and regret"):

- ``age_at_hit_seconds``: a cached block's age (now - when it was cached) when a lookup hits it;
- ``age_at_eviction_seconds``: a victim's age when it is evicted;
- ``reuse_distance_blocks``: block lookups since the hit block's previous lookup (its reuse
  time in lookups, ``ghosts.ReuseTimes``; repeats count, so it bounds the LRU stack distance
  from above);
- ``regret_age_seconds``: seconds between a block's eviction and the lookup that missed it
  (each regret, `ghosts`).

Seconds are the cache's clock: wall time in the engine, the virtual clock in the simulator, so
one figure reads the same in both. Buckets run from 100 ms to a day so that the same bounds
serve an interactive engine and an hours-long trace; they are Prometheus' ``le`` bounds
(`engine_adapter.serving.metrics` exports these counts as they are). Imports nothing of the cache.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from sage_eviction.metrics import MAX_TENANTS, OTHER_TENANTS

__all__ = ["AGE_BUCKETS_S", "DISTANCE_BUCKETS", "HISTOGRAM_KINDS", "AgeHistograms", "HistogramSnapshot"]

AGE_BUCKETS_S: tuple[float, ...] = (
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
    14400.0, 43200.0, 86400.0,
)  # fmt: skip
"""Upper bounds of the age buckets, seconds: 100 ms to a day (then +Inf)."""

DISTANCE_BUCKETS: tuple[float, ...] = tuple(float(4**i) for i in range(11))
"""Upper bounds of the reuse-distance buckets, blocks: 1, 4, 16 ... about a million."""

HISTOGRAM_KINDS: dict[str, tuple[float, ...]] = {
    "age_at_hit_seconds": AGE_BUCKETS_S,
    "age_at_eviction_seconds": AGE_BUCKETS_S,
    "reuse_distance_blocks": DISTANCE_BUCKETS,
    "regret_age_seconds": AGE_BUCKETS_S,
}
"""Each histogram the cache keeps, with its bucket bounds."""


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """One histogram's counts (one kind, one policy, one tenant).

    Attributes:
        kind: A key of `HISTOGRAM_KINDS`.
        policy: The policy in charge when the value was observed (the evicting one for evictions
            and regrets).
        tenant: The block's tenant (``-``: none).
        bounds: The buckets' upper bounds (``le``), the last bucket +Inf beyond them.
        counts: Observations per bucket, not cumulative, ``len(bounds) + 1`` of them.
        total: The sum of the observed values.
    """

    kind: str
    policy: str
    tenant: str
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        """Observations."""
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile `q` (inf in the last; 0 when empty)."""
        n = self.count
        if not n:
            return 0.0
        rank, seen = q * n, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return self.bounds[i] if i < len(self.bounds) else float("inf")
        return float("inf")

    def to_dict(self) -> dict[str, object]:
        """JSON: the bounds, the counts, the sum and the count."""
        return {
            "kind": self.kind,
            "policy": self.policy,
            "tenant": self.tenant,
            "le": list(self.bounds),
            "counts": list(self.counts),
            "sum": self.total,
            "count": self.count,
        }


class AgeHistograms:
    """The histograms of `HISTOGRAM_KINDS`, one per (kind, policy, tenant) seen."""

    __slots__ = ("_counts", "_sums", "_tenants")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], list[int]] = {}
        self._sums: dict[tuple[str, str, str], float] = {}
        self._tenants: set[str] = set()  # the tenants with histograms of their own: MAX_TENANTS

    def _label(self, tenant: str | None) -> str:
        """The tenant's label: ``-`` for none, `OTHER_TENANTS` for those past `MAX_TENANTS`
        (histograms, and their /metrics label sets, do not grow with the tenants seen)."""
        label = "-" if tenant is None else tenant
        if label not in self._tenants:
            if len(self._tenants) >= MAX_TENANTS:
                return OTHER_TENANTS
            self._tenants.add(label)
        return label

    def observe(self, kind: str, policy: str, tenant: str | None, value: float) -> None:
        """Count `value` in its bucket of the (`kind`, `policy`, `tenant`) histogram."""
        self.observe_many(kind, policy, tenant, (value,))

    def observe_many(self, kind: str, policy: str, tenant: str | None, values: Sequence[float]) -> None:
        """`observe` of each value (one lookup's hits, one eviction's victims)."""
        if not values:
            return
        key = (kind, policy, self._label(tenant))
        bounds = HISTOGRAM_KINDS[kind]
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * (len(bounds) + 1)
            self._sums[key] = 0.0
        for value in values:
            counts[bisect_left(bounds, value)] += 1
        self._sums[key] += sum(values)

    def add_counts(
        self, kind: str, policy: str, tenant: str | None, counts: Sequence[int], total: float
    ) -> None:
        """Add per-bucket `counts` and their `total` to one histogram (made when absent): what a
        compiled caller counted in its own arrays (the simulator's radix loop).

        Raises:
            ValueError: `counts` is not one count per bucket of `kind`.
        """
        bounds = HISTOGRAM_KINDS[kind]
        if len(counts) != len(bounds) + 1:
            raise ValueError(f"{kind}: {len(counts)} counts for {len(bounds) + 1} buckets")
        key = (kind, policy, self._label(tenant))
        held = self._counts.get(key)
        if held is None:
            held = self._counts[key] = [0] * (len(bounds) + 1)
            self._sums[key] = 0.0
        for i, count in enumerate(counts):
            held[i] += int(count)
        self._sums[key] += total

    def snapshot(self) -> tuple[HistogramSnapshot, ...]:
        """Every histogram now, sorted by kind, policy and tenant."""
        return tuple(
            HistogramSnapshot(k, p, t, HISTOGRAM_KINDS[k], tuple(c), self._sums[(k, p, t)])
            for (k, p, t), c in sorted(self._counts.items())
        )
