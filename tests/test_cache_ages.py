"""Ages, regret and lookup records where users read them (issue 32), without a model: the cache's
histograms on /metrics, in ``stats`` and ``top``, the lookup log's rotation, the simulator's
rows and plot, and bad input refused in one line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.cache.ages import AGE_BUCKETS_S, AgeHistograms
from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.lookup_log import LookupLog
from engine_adapter.cache.request import CacheRequest
from engine_adapter.serving.cache_histograms import CacheAccountingCollector
from sage_cli.eviction.render import render_stats
from sage_cli.eviction.views import render_top

REPO = Path(__file__).resolve().parents[1]
BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lru_loop(capacity: int, rounds: int, clock: Clock, log: LookupLog | None = None) -> CacheManager:
    """Single-block requests looping over ``capacity + 1`` keys, 1 s apart, tenant t0 or t1."""
    manager = CacheManager(BlockAllocator(capacity, BS), policy="lru", clock=clock, lookup_log=log)
    for n in range(rounds * (capacity + 1)):
        key = f"k{n % (capacity + 1)}"
        request = CacheRequest(
            n, num_tokens=BS, block_keys=[key], recompute_last_token=False, tenant=f"t{n % 2}"
        )
        manager.allocate(request)
        manager.free_sequence(n, block_keys=[key])
        clock.now += 1.0
    return manager


def test_a_histogram_counts_a_value_in_the_bucket_of_its_upper_bound() -> None:
    ages = AgeHistograms()
    for value in (0.1, 0.11, 86400.0, 1e9):
        ages.observe("age_at_hit_seconds", "lru", None, value)
    (h,) = ages.snapshot()
    assert h.counts[0] == 1 and h.counts[1] == 1  # le=0.1 holds 0.1 itself, 0.11 goes above
    assert h.counts[len(AGE_BUCKETS_S) - 1] == 1 and h.counts[-1] == 1  # a day, then +Inf
    assert h.tenant == "-" and h.count == 4 and h.quantile(0.5) == 0.5


def test_metrics_export_the_cache_histograms_and_regret() -> None:
    manager = _lru_loop(8, 40, Clock())
    registry = CollectorRegistry()
    registry.register(CacheAccountingCollector(manager.stats))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    stats = manager.stats()
    regrets = families["sage:regrets"].samples
    assert [(s.labels["policy"], s.value) for s in regrets if s.name.endswith("_total")] == [
        ("lru", float(stats.regrets))
    ]
    assert families["sage:thrashing"].samples[0].value == 1.0
    evicted = [s for s in families["sage:block_age_at_eviction_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["tenant"] for s in evicted} == {"t0", "t1"}
    assert sum(s.value for s in evicted) == stats.total_evictions
    # every victim of the LRU loop was cached 8 s before it went (8 other keys in between)
    le = [s for s in families["sage:block_age_at_eviction_seconds"].samples if s.name.endswith("_bucket")]
    assert all(s.value == 0 for s in le if float(s.labels["le"]) < 5.0)
    assert all(s.value > 0 for s in le if float(s.labels["le"]) >= 10.0)


def test_stats_and_top_show_the_regret_and_the_thrashing_warning_with_its_threshold() -> None:
    stats = _lru_loop(8, 40, Clock()).stats().to_dict()
    text = render_stats(stats)
    assert "Regret Ratio:" in text and "THRASHING" in text and "(threshold 50%)" in text
    assert "Age At Eviction: lru p50 <=10s p90 <=10s" in text
    from rich.console import Console

    console = Console(file=io.StringIO(), width=160)
    console.print(render_top(stats, {"num_blocks": 8}, [], None))
    frame = console.file.getvalue()  # type: ignore[attr-defined]
    assert "THRASHING" in frame and "regret" in frame
    calm = _lru_loop(8, 2, Clock()).stats().to_dict()
    assert "THRASHING" not in render_stats(calm)


def test_the_lookup_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    log = LookupLog(tmp_path / "lookups.jsonl", max_bytes=4096, backups=2)
    _lru_loop(8, 30, Clock(), log)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["lookups.jsonl", "lookups.jsonl.1", "lookups.jsonl.2"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    last = [json.loads(line) for line in (tmp_path / "lookups.jsonl").read_text().splitlines()][-1]
    assert last["stop"] == "evicted" and last["eviction"]["seconds_ago"] == 1.0
    assert last["matched_blocks"] == 0 and last["prompt_blocks"] == 1


@pytest.mark.slow  # two simulated runs and a figure: seconds on 2 cores
def test_the_simulator_rows_carry_regret_and_ages() -> None:
    from engine_adapter.sim.capacity import min_capacity, unique_blocks
    from engine_adapter.sim.plot import benchmark_figure
    from engine_adapter.sim.simulator import simulate
    from engine_adapter.sim.synthetic import synthetic

    workload = synthetic(requests=300, seed=3, input_tokens=256.0, output_tokens=16.0)
    capacity = max(min_capacity(workload), unique_blocks(workload.requests) // 10)
    rows = [simulate(workload, policy, capacity).to_dict() for policy in ("lru", "belady")]
    assert rows[0]["regret_ratio"] > 0.01 and rows[1]["regrets"] == 0  # Belady: none
    kinds = {h["kind"] for h in rows[0]["age_histograms"]}
    assert {"age_at_hit_seconds", "age_at_eviction_seconds"} <= kinds
    figure = benchmark_figure(rows, [[], []], 1000, "t")
    titles = [ax.get_title() for ax in figure.axes]
    assert f"block age at hit at {capacity} blocks" in titles
    assert f"block age at eviction at {capacity} blocks" in titles


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--lookup", "r1"], "give its --lookup-log PATH"),
        (["12", "--lookup", "r1", "--lookup-log", "/tmp/x"], "not both"),
        (["12", "--lookup-log", "/tmp/x"], "--lookup-log goes with --lookup"),
    ],
)
def test_explain_refuses_bad_lookup_options_in_one_line(args: list[str], says: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "eviction", "explain", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert says in done.stderr and done.stderr.strip().count("\n") == 0
