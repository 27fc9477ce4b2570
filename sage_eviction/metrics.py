"""The metrics, defined once and used by the policies, the cache and the benchmark.

Their definitions: docs/architecture.md, "Metrics".

- `jain_fairness`: Jain's index (sum x)^2 / (n * sum x^2); 1.0 for zero or one value.
- `ReprefillTracker`: evicted keys that were requested again later / evicted keys.
- `HitCounter`: hit rate overall and per tenant (tokens or blocks served from cache / looked up).
- `LatencyRecorder` and `percentile`: eviction-decision wall times and their p50/p99.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from sage_eviction.keyset import new_key_set
from sage_eviction.types import EvictionMetrics

__all__ = [
    "HitCounter",
    "LatencyRecorder",
    "ReprefillTracker",
    "build_metrics",
    "jain_fairness",
    "percentile",
]


def jain_fairness(values: Iterable[float]) -> float:
    """Jain's fairness index of `values` (Jain, Chiu and Hawe, DEC-TR-301, 1984).

    Returns 1.0 for no values, one value, or all zeros.
    """
    xs = [float(v) for v in values]
    if len(xs) <= 1:
        return 1.0
    total = sum(xs)
    squares = sum(x * x for x in xs)
    if squares == 0.0:
        return 1.0
    return total * total / (len(xs) * squares)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values by linear interpolation; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} is outside [0, 1]")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac


class ReprefillTracker:
    """Counts evicted keys that come back.

    A key is counted once per eviction: evicted, requested again (and so recomputed), it adds
    one to `re_prefilled`; evicted again, it may count again. The evicted keys not yet requested
    again are a `KeySet` (sage_eviction/keyset.py): 16 to 32 bytes an int key where the compiled
    core is used, against about 80 in a set of int objects.
    """

    __slots__ = ("_evicted", "evictions", "re_prefilled")

    def __init__(self) -> None:
        self._evicted: Any = new_key_set()
        self.evictions = 0
        self.re_prefilled = 0

    def on_evict(self, key: Hashable) -> None:
        """A key left the cache by eviction."""
        self.evictions += 1
        self._evicted.add(key)

    def on_evicts(self, keys: Sequence[Hashable]) -> None:
        """`on_evict` of each key (one call for an eviction's victims)."""
        self.evictions += len(keys)
        self._evicted.update(keys)

    def on_requests(self, keys: Iterable[Hashable]) -> int:
        """`on_request` of each key (one call for a request's missed blocks); returns how many
        were re-prefills."""
        back: int = self._evicted.remove_present(keys)
        self.re_prefilled += back
        return back

    def on_request(self, key: Hashable) -> bool:
        """A key was requested; returns True when it had been evicted (a re-prefill)."""
        if key in self._evicted:
            self._evicted.discard(key)
            self.re_prefilled += 1
            return True
        return False

    def forget(self) -> None:
        """Forget which keys were evicted (the counts stay): after a cache reset, a key that
        comes back is recomputed because of the reset, not because of an eviction."""
        self._evicted.clear()

    @property
    def rate(self) -> float:
        """Re-prefilled / evicted; 0.0 before any eviction."""
        return self.re_prefilled / self.evictions if self.evictions else 0.0


class HitCounter:
    """Hits and lookups, overall and per tenant, in any unit (tokens or blocks)."""

    __slots__ = ("hits", "lookups", "per_tenant")

    def __init__(self) -> None:
        self.hits = 0
        self.lookups = 0
        self.per_tenant: dict[str | None, list[int]] = {}

    def record(self, tenant: str | None, hits: int, lookups: int) -> None:
        """Add `hits` of `lookups` for `tenant`."""
        if hits < 0 or lookups < hits:
            raise ValueError(f"hits={hits} must be within 0..lookups={lookups}")
        self.hits += hits
        self.lookups += lookups
        counts = self.per_tenant.get(tenant)
        if counts is None:
            self.per_tenant[tenant] = [hits, lookups]
        else:
            counts[0] += hits
            counts[1] += lookups

    @property
    def hit_rate(self) -> float:
        """Hits / lookups; 0.0 before any lookup."""
        return self.hits / self.lookups if self.lookups else 0.0

    def tenant_hit_rates(self) -> dict[str | None, float]:
        """Hit rate of each tenant that looked anything up."""
        return {t: h / n for t, (h, n) in self.per_tenant.items() if n}

    @property
    def fairness(self) -> float:
        """Jain's index over the per-tenant hit rates."""
        return jain_fairness(self.tenant_hit_rates().values())


class LatencyRecorder:
    """Wall times in seconds; keeps the count and sum of all, and the last `window` for quantiles."""

    __slots__ = ("_next", "_ring", "count", "total", "window")

    def __init__(self, window: int = 65536) -> None:
        if window <= 0:
            raise ValueError(f"window={window} must be positive")
        self.window = window
        self._ring: list[float] = []
        self._next = 0
        self.count = 0
        self.total = 0.0

    def record(self, seconds: float) -> None:
        """Add one measurement."""
        self.count += 1
        self.total += seconds
        if len(self._ring) < self.window:
            self._ring.append(seconds)
        else:
            self._ring[self._next] = seconds
            self._next = (self._next + 1) % self.window

    @property
    def mean(self) -> float:
        """Mean of all measurements; 0.0 when none."""
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The q-quantile of the recent window."""
        return percentile(sorted(self._ring), q)

    def times(self) -> Sequence[float]:
        """The window's decision times (seconds; oldest first until the window is full, then in
        ring order): read them, do not change them."""
        return self._ring

    def quantiles(self, *qs: float) -> list[float]:
        """Several quantiles with one sort."""
        ordered = sorted(self._ring)
        return [percentile(ordered, q) for q in qs]


def build_metrics(
    strategy: str,
    evictions: int,
    latency: LatencyRecorder,
    reprefill: ReprefillTracker,
    hits: HitCounter,
) -> EvictionMetrics:
    """`EvictionMetrics` filled from the trackers; times in ms as the module spec has them."""
    p50, p99 = latency.quantiles(0.5, 0.99)
    return EvictionMetrics(
        total_evictions=evictions,
        avg_eviction_time=latency.mean * 1e3,
        re_prefill_rate=reprefill.rate,
        fairness_score=hits.fairness,
        strategy=strategy,
        p50_eviction_time=p50 * 1e3,
        p99_eviction_time=p99 * 1e3,
        hit_rate=hits.hit_rate,
    )
