"""The metrics, defined once and used by the policies, the cache and the benchmark.

Their definitions: docs/architecture.md, "Metrics".

- `jain_fairness`: Jain's index (sum x)^2 / (n * sum x^2); 1.0 for zero or one value.
- `ReprefillTracker`: evicted keys that were requested again later / evicted keys, over a bounded
  window of the latest evictions (`reprefill_window`; sage_eviction/keyset.py, `EvictedWindow`).
- `HitCounter`: hit rate overall and per tenant (tokens or blocks served from cache / looked up).
- `LatencyRecorder` and `percentile`: eviction-decision wall times and their p50/p99.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

from sage_eviction.keyset import EvictedWindow, new_key_set  # EvictedWindow: re-exported
from sage_eviction.types import EvictionMetrics

__all__ = [
    "MAX_TENANTS",
    "OTHER_TENANTS",
    "REPREFILL_WINDOW",
    "EvictedWindow",
    "HitCounter",
    "LatencyRecorder",
    "ReprefillTracker",
    "build_metrics",
    "count_tenant",
    "jain_fairness",
    "percentile",
    "reprefill_window",
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


MAX_TENANTS = 1024
"""Tenants counted apart in a per-tenant table (hit counts, age histograms, and so the /metrics
label sets drawn from them); tenants first seen once a table holds this many are counted
together under `OTHER_TENANTS`. Tenants are strings clients choose: a row per tenant ever seen
would grow without end, and so would the label sets a scrape exports."""

OTHER_TENANTS = "(other)"
"""The tenant that the tenants past `MAX_TENANTS` are counted under."""


def count_tenant(table: dict[str | None, list[int]], tenant: str | None, hit: bool) -> None:
    """Add one lookup (a hit when `hit`) to `tenant`'s [hits, lookups] in `table`, or to
    `OTHER_TENANTS`' when the table is full (`MAX_TENANTS`). The compiled core has the same
    (sage_eviction/_core_ops.pxi, `_count_tenant`)."""
    counts = table.get(tenant)
    if counts is None:
        if len(table) >= MAX_TENANTS:
            tenant = OTHER_TENANTS
            counts = table.get(tenant)
        if counts is None:
            table[tenant] = [1 if hit else 0, 1]
            return
    if hit:
        counts[0] += 1
    counts[1] += 1


REPREFILL_WINDOW = 8192
"""The re-prefill window's least size, in evicted keys: a key counts as re-prefilled when it is
requested again while it is among the last `window` keys evicted (`new_key_set(window)`)."""


def reprefill_window(capacity: int | None) -> int:
    """The stated window for a cache of `capacity` blocks: 4 x capacity, at least
    `REPREFILL_WINDOW` (a cache that evicts a key and wants it back after four cache-fulls of
    other evictions is not told it was a re-prefill: ghost lists hold 1 to 2 cache-fulls)."""
    return REPREFILL_WINDOW if capacity is None else max(REPREFILL_WINDOW, 4 * capacity)


class ReprefillTracker:
    """Counts evicted keys that come back, over a window of the last `window` evictions.

    A key is counted once per eviction: evicted, requested again while it is among the last
    `window` evictions (and so recomputed), it adds one to `re_prefilled`; evicted again, it may
    count again. The rate is `re_prefilled / evictions`: where a run evicts no more than `window`
    keys it is exactly the share of evicted keys requested again; beyond, a key requested back
    after more than `window` later evictions is not counted (the rate is windowed, and the stats
    say so: `re_prefill_window`). Memory: `new_key_set(window)` (the compiled `KeySet`'s window
    or `EvictedWindow`), bounded by `window`. `window=None` keeps every evicted key of the run:
    for a simulator row only, whose trace bounds the keys (its rate is then the exact one).
    """

    __slots__ = ("_evicted", "evictions", "re_prefilled", "window")

    def __init__(self, window: int | None = REPREFILL_WINDOW) -> None:
        self.window = window  # how many of the latest evictions a re-prefill is looked for in
        self._evicted = new_key_set(window)
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
        """Re-prefilled (within the window) / evicted; 0.0 before any eviction."""
        return self.re_prefilled / self.evictions if self.evictions else 0.0


class HitCounter:
    """Hits and lookups, overall and per tenant (up to `MAX_TENANTS`, the rest together under
    `OTHER_TENANTS`), in any unit (tokens or blocks)."""

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
            if len(self.per_tenant) >= MAX_TENANTS:  # past the cap: counted together
                tenant = OTHER_TENANTS
                counts = self.per_tenant.get(tenant)
            if counts is None:
                self.per_tenant[tenant] = [hits, lookups]
                return
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
