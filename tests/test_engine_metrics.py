"""`engine_adapter.serving.metrics.EngineMetrics`: the `sage:*` Prometheus metrics, parsed back from text."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from engine_fixtures import app_client
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.metrics import EVICTION_DURATION_BUCKETS, METRIC_FAMILIES, EngineMetrics

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "sage.json"

EXPECTED = {
    # family name as the parser reports it (counters lose `_total`) -> type
    "sage:evictions": "counter",
    "sage:eviction_duration_seconds": "histogram",
    "sage:prefix_cache_queries": "counter",
    "sage:prefix_cache_hits": "counter",
    "sage:kv_cache_usage_perc": "gauge",
    "sage:num_preemptions": "counter",
    "sage:re_prefill_blocks": "counter",
    "sage:num_requests_running": "gauge",
    "sage:num_requests_waiting": "gauge",
    "sage:request_success": "counter",
    "sage:time_to_first_token_seconds": "histogram",
    "sage:time_per_output_token_seconds": "histogram",
    "sage:prompt_tokens": "counter",
    "sage:generation_tokens": "counter",
    "sage:policy_swaps": "counter",
    "sage:policy_info": "gauge",
}


def _samples(metrics: EngineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _families(metrics: EngineMetrics) -> dict[str, str]:
    text = generate_latest(metrics.registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_metric_of_design_6_is_exposed_with_its_type() -> None:
    families = _families(EngineMetrics())
    for name, kind in EXPECTED.items():
        assert families.get(name) == kind, f"{name}: {families.get(name)}"


def test_the_metrics_live_in_a_private_registry() -> None:
    a, b = EngineMetrics(), EngineMetrics()  # two engines in one process do not collide
    assert a.registry is not b.registry
    assert a.registry is not REGISTRY
    assert "sage:evictions_total" not in generate_latest(REGISTRY).decode()


def test_eviction_counts_blocks_by_policy_and_reason_and_times_the_decision() -> None:
    m = EngineMetrics()
    m.on_eviction("lru", "alloc", 3, 2e-6)
    m.on_eviction("lru", "alloc", 2, 4e-5)
    m.on_eviction("arc", "watermark", 1, 2e-2)
    m.on_eviction("arc", "preempt", 0, 1e-6)  # a call that freed nothing is timed, not counted
    s = _samples(m)
    assert s[("sage:evictions_total", (("policy", "lru"), ("reason", "alloc")))] == 5
    assert s[("sage:evictions_total", (("policy", "arc"), ("reason", "watermark")))] == 1
    assert ("sage:evictions_total", (("policy", "arc"), ("reason", "preempt"))) not in s
    assert s[("sage:eviction_duration_seconds_count", ())] == 4
    assert s[("sage:eviction_duration_seconds_bucket", (("le", "1e-06"),))] == 1
    assert s[("sage:eviction_duration_seconds_bucket", (("le", "0.01"),))] == 3  # 2e-2 only in +Inf
    assert s[("sage:eviction_duration_seconds_bucket", (("le", "+Inf"),))] == 4
    assert EVICTION_DURATION_BUCKETS[0] == 1e-6 and EVICTION_DURATION_BUCKETS[-1] == 1e-2


def test_lookups_count_tokens_queried_and_hit() -> None:
    m = EngineMetrics()
    m.on_lookup(hit_tokens=16, lookup_tokens=48)
    m.on_lookup(hit_tokens=0, lookup_tokens=10)
    s = _samples(m)
    assert s[("sage:prefix_cache_queries_total", ())] == 58
    assert s[("sage:prefix_cache_hits_total", ())] == 16


def test_gauges_and_plain_counters() -> None:
    m = EngineMetrics()
    m.set_usage(0.75)
    m.set_queue(running=3, waiting=5)
    m.on_preemption()
    m.on_preemption(2)
    m.on_re_prefill(4)
    m.on_re_prefill(0)
    s = _samples(m)
    assert s[("sage:kv_cache_usage_perc", ())] == 0.75
    assert s[("sage:num_requests_running", ())] == 3
    assert s[("sage:num_requests_waiting", ())] == 5
    assert s[("sage:num_preemptions_total", ())] == 3
    assert s[("sage:re_prefill_blocks_total", ())] == 4
    m.set_queue(running=0, waiting=0)
    s = _samples(m)
    assert s[("sage:num_requests_running", ())] == 0


def test_finished_requests_record_reason_latencies_and_tokens() -> None:
    m = EngineMetrics()
    m.on_request_finished("stop", 0.05, [0.01, 0.02, 0.03], prompt_tokens=12, generation_tokens=4)
    m.on_request_finished("length", 0.2, [], prompt_tokens=8, generation_tokens=1)
    m.on_request_finished("abort", None, [])
    s = _samples(m)
    assert s[("sage:request_success_total", (("finish_reason", "stop"),))] == 1
    assert s[("sage:request_success_total", (("finish_reason", "length"),))] == 1
    assert s[("sage:request_success_total", (("finish_reason", "abort"),))] == 1
    assert s[("sage:time_to_first_token_seconds_count", ())] == 2
    assert abs(s[("sage:time_to_first_token_seconds_sum", ())] - 0.25) < 1e-12
    assert s[("sage:time_per_output_token_seconds_count", ())] == 3
    assert s[("sage:prompt_tokens_total", ())] == 20
    assert s[("sage:generation_tokens_total", ())] == 5


def test_policy_info_marks_only_the_active_policy_and_swaps_are_counted() -> None:
    m = EngineMetrics(policy="lru")
    s = _samples(m)
    assert s[("sage:policy_info", (("policy", "lru"),))] == 1
    assert s[("sage:policy_swaps_total", ())] == 0
    m.on_swap("arc")
    m.on_swap("s3fifo")
    s = _samples(m)
    assert s[("sage:policy_swaps_total", ())] == 2
    assert s[("sage:policy_info", (("policy", "s3fifo"),))] == 1
    assert s[("sage:policy_info", (("policy", "arc"),))] == 0
    assert s[("sage:policy_info", (("policy", "lru"),))] == 0
    m.on_swap("lru")
    s = _samples(m)
    assert [labels for (name, labels), v in s.items() if name == "sage:policy_info" and v == 1] == [
        (("policy", "lru"),)
    ]


def test_batch_changes_are_exported_from_start_at_zero() -> None:
    # issue 28, item 9: a labelled counter has no series until its first change, so the
    # dashboard's "batch changes" panel was empty on a fresh engine.
    s = _samples(EngineMetrics())
    assert s[("sage:batch_changes_total", (("direction", "shrink"),))] == 0
    assert s[("sage:batch_changes_total", (("direction", "grow"),))] == 0


def _dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [a["expr"] for a in dashboard["annotations"]["list"]]
    return {m for q in queries for m in re.findall(r"\bsage:[A-Za-z0-9_:]+", q)}


def test_a_fresh_engine_has_a_series_for_every_dashboard_metric_with_known_labels() -> None:
    """Every family the dashboard draws whose series are known in advance (no labels, or labels
    exported from start) has its samples on a fresh engine, before any request."""
    families = {f.name: f for f in METRIC_FAMILIES.values()}
    known = {
        name
        for name, family in families.items()
        if family.kind.__name__ != "Histogram" and (not family.labels or family.exported_from_start)
    }
    drawn = {name for name in _dashboard_metrics() if name in known}
    assert "sage:batch_changes_total" in drawn
    with tempfile.TemporaryDirectory(prefix="sg-fresh-", dir="/tmp") as root:
        config = EngineConfig(
            device="cpu", num_blocks=16, socket=f"{root}/e.sock", log_dir=f"{root}/logs", adaptive_batch=True
        )
        engine = Engine(config)  # never started: no request has run
        text = app_client(engine).get("/metrics").text
    present = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert drawn <= present, f"no series on a fresh engine: {sorted(drawn - present)}"


def _tier(tier: str, **counts: int) -> dict[str, object]:
    fields = ("used_blocks", "capacity_blocks", "hits", "demotions", "promotions", "drops")
    fields += ("blocks_moved_in", "blocks_moved_out", "prefetched_blocks", "prefetch_hits")
    return {"tier": tier, "policy": "lru", "policy_swaps": 0, **{f: counts.get(f, 0) for f in fields}}


def test_kv_tier_figures_are_gauges_and_counters_advanced_by_what_grew() -> None:
    m = EngineMetrics()
    m.set_tiers([_tier("host", used_blocks=5, capacity_blocks=64, demotions=7, blocks_moved_in=7)])
    m.set_tiers(
        [
            _tier("host", used_blocks=3, capacity_blocks=64, demotions=9, hits=2, blocks_moved_in=9),
            _tier("disk", capacity_blocks=256, demotions=1, prefetched_blocks=3, prefetch_hits=1),
        ]
    )
    m.set_tiers([_tier("host", used_blocks=3, capacity_blocks=64, demotions=9, hits=2, blocks_moved_in=9)])
    m.on_tier_load("host", 0.0004)
    m.on_tier_load("disk", 0.02)
    m.on_tier_load("disk", 0.2)
    m.on_tier_copies(0.002, failed=0)
    m.on_tier_copies(0.3, failed=2)
    s = _samples(m)
    assert s[("sage:kv_tier_used_blocks", (("tier", "host"),))] == 3
    assert s[("sage:kv_tier_capacity_blocks", (("tier", "disk"),))] == 256
    counted = {
        (labels[1][1], labels[0][1]): value
        for (name, labels), value in s.items()
        if name == "sage:kv_tier_blocks_total"
    }
    # cumulative counts reported three times are counted once each
    assert counted == {
        ("host", "demotions"): 9,
        ("host", "moved_in"): 9,
        ("host", "hits"): 2,
        ("disk", "demotions"): 1,
        ("disk", "prefetched"): 3,
        ("disk", "prefetch_hits"): 1,
    }
    assert s[("sage:kv_tier_load_duration_seconds_count", (("tier", "disk"),))] == 2
    assert s[("sage:kv_tier_load_duration_seconds_bucket", (("le", "0.05"), ("tier", "disk")))] == 1
    assert s[("sage:kv_tier_load_duration_seconds_count", (("tier", "host"),))] == 1
    assert s[("sage:kv_tier_copy_duration_seconds_count", ())] == 2
    assert s[("sage:kv_tier_copy_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert s[("sage:kv_tier_failed_moves_total", ())] == 2
