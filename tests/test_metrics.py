"""The metric definitions of docs/architecture.md, "Metrics" on hand-computed values."""

from __future__ import annotations

import math

import pytest

from sage_eviction import EvictionMetrics
from sage_eviction.metrics import (
    HitCounter,
    LatencyRecorder,
    ReprefillTracker,
    build_metrics,
    jain_fairness,
    percentile,
)

# ---- jain_fairness -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], 1.0),
        ([0.3], 1.0),
        ([0.0, 0.0, 0.0], 1.0),  # nobody served: equally (un)fair
        ([0.5, 0.5, 0.5, 0.5], 1.0),
        ([1.0, 0.0], 0.5),  # (1)^2 / (2 * 1) = 0.5
        ([1.0, 0.0, 0.0, 0.0], 0.25),  # one of n served: 1/n
        ([1.0, 2.0, 3.0], 36.0 / 42.0),  # 6^2 / (3 * 14)
        ([0.9, 0.6], 2.25 / 2.34),  # 1.5^2 / (2 * (0.81 + 0.36))
    ],
)
def test_jain_fairness_hand_computed(values: list[float], expected: float) -> None:
    assert jain_fairness(values) == pytest.approx(expected)


def test_jain_fairness_accepts_any_iterable_and_is_scale_free() -> None:
    values = [0.2, 0.4, 0.8]
    assert jain_fairness(iter(values)) == pytest.approx(jain_fairness(values))
    assert jain_fairness(v * 10 for v in values) == pytest.approx(jain_fairness(values))
    assert 1 / 3 <= jain_fairness(values) <= 1.0


# ---- percentile ----------------------------------------------------------------------------


def test_percentile_interpolates_linearly() -> None:
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile(xs, 0.0) == 10.0
    assert percentile(xs, 1.0) == 40.0
    assert percentile(xs, 0.5) == pytest.approx(25.0)  # position 1.5
    assert percentile(xs, 0.25) == pytest.approx(17.5)  # position 0.75
    assert percentile(xs, 0.99) == pytest.approx(39.7)  # position 2.97


def test_percentile_edges() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([7.0], 0.0) == 7.0
    assert percentile([7.0], 0.99) == 7.0
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match="quantile"):
            percentile([1.0, 2.0], bad)


# ---- ReprefillTracker ----------------------------------------------------------------------


def test_reprefill_tracker_counts_each_return_once_per_eviction() -> None:
    tracker = ReprefillTracker()
    assert tracker.rate == 0.0
    for key in ("a", "b", "c", "d"):
        tracker.on_evict(key)
    assert tracker.on_request("a") is True
    assert tracker.on_request("a") is False  # already back: not counted twice
    assert tracker.on_request("never-evicted") is False
    assert tracker.re_prefilled == 1
    assert tracker.rate == pytest.approx(1 / 4)
    tracker.on_evict("a")  # evicted again, may count again
    assert tracker.on_request("a") is True
    assert (tracker.evictions, tracker.re_prefilled) == (5, 2)
    assert tracker.rate == pytest.approx(2 / 5)


# ---- HitCounter ----------------------------------------------------------------------------


def test_hit_counter_overall_and_per_tenant() -> None:
    counter = HitCounter()
    assert counter.hit_rate == 0.0
    assert counter.fairness == 1.0
    counter.record("a", 3, 4)
    counter.record("b", 1, 4)
    counter.record("a", 0, 0)  # a lookup of nothing changes nothing
    assert (counter.hits, counter.lookups) == (4, 8)
    assert counter.hit_rate == pytest.approx(0.5)
    assert counter.tenant_hit_rates() == {"a": pytest.approx(0.75), "b": pytest.approx(0.25)}
    # Jain over (0.75, 0.25): 1^2 / (2 * 0.625) = 0.8
    assert counter.fairness == pytest.approx(0.8)


def test_hit_counter_single_tenant_is_fair_and_skips_empty_tenants() -> None:
    counter = HitCounter()
    counter.record(None, 2, 10)
    counter.record("idle", 0, 0)
    assert counter.tenant_hit_rates() == {None: pytest.approx(0.2)}
    assert counter.fairness == 1.0


@pytest.mark.parametrize(("hits", "lookups"), [(-1, 3), (4, 3)])
def test_hit_counter_rejects_impossible_counts(hits: int, lookups: int) -> None:
    with pytest.raises(ValueError, match=f"hits={hits}"):
        HitCounter().record("a", hits, lookups)


# ---- LatencyRecorder -----------------------------------------------------------------------


def test_latency_recorder_window_keeps_the_latest_but_counts_all() -> None:
    rec = LatencyRecorder(window=4)
    assert (rec.mean, rec.quantile(0.5)) == (0.0, 0.0)
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        rec.record(seconds)
    assert rec.count == 6
    assert rec.total == pytest.approx(21.0)
    assert rec.mean == pytest.approx(3.5)  # over all six
    # the window holds 3, 4, 5, 6: the two oldest were overwritten
    assert rec.quantile(0.0) == 3.0
    assert rec.quantile(1.0) == 6.0
    assert rec.quantiles(0.5, 0.99) == [pytest.approx(4.5), pytest.approx(5.97)]


def test_latency_recorder_wraps_around_more_than_once() -> None:
    rec = LatencyRecorder(window=3)
    for i in range(10):
        rec.record(float(i))
    assert sorted(rec.quantiles(0.0, 0.5, 1.0)) == [7.0, 8.0, 9.0]
    assert rec.count == 10


@pytest.mark.parametrize("window", [0, -5])
def test_latency_recorder_rejects_empty_window(window: int) -> None:
    with pytest.raises(ValueError, match=f"window={window}"):
        LatencyRecorder(window)


# ---- build_metrics -------------------------------------------------------------------------


def test_build_metrics_fills_every_field_in_ms() -> None:
    latency = LatencyRecorder()
    for us in (100, 200, 300, 400, 500):
        latency.record(us * 1e-6)
    reprefill = ReprefillTracker()
    for key in range(10):
        reprefill.on_evict(key)
    reprefill.on_request(3)
    reprefill.on_request(4)
    hits = HitCounter()
    hits.record("a", 9, 10)
    hits.record("b", 3, 10)

    metrics = build_metrics("LRU", 10, latency, reprefill, hits)

    assert isinstance(metrics, EvictionMetrics)
    assert metrics.strategy == "LRU"
    assert metrics.total_evictions == 10
    assert metrics.avg_eviction_time == pytest.approx(0.3)  # ms
    assert metrics.p50_eviction_time == pytest.approx(0.3)
    assert metrics.p99_eviction_time == pytest.approx(0.496)  # 400 + 0.96 * 100 us
    assert metrics.re_prefill_rate == pytest.approx(0.2)
    assert metrics.hit_rate == pytest.approx(0.6)
    assert metrics.fairness_score == pytest.approx(1.2**2 / (2 * (0.81 + 0.09)))
    as_dict = metrics.to_dict()
    assert as_dict["total_evictions"] == 10
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in as_dict.values())


def test_build_metrics_before_anything_happened() -> None:
    metrics = build_metrics("FIFO", 0, LatencyRecorder(), ReprefillTracker(), HitCounter())
    assert metrics == EvictionMetrics(strategy="FIFO")
