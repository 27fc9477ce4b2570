"""The simulator as a library (issue 29): `Trace`, `simulate` and `Results` give what
``sage llm benchmark --json`` prints for the same options (the CLI in a real process), as rows,
DataFrames and a plot; `sage_eviction.Cache` drives a policy block by block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import engine_adapter.sim as sim
from engine_adapter.sim.api import BenchmarkError, Results, Trace, simulate
from engine_adapter.sim.shipped_traces import shipped_trace
from sage_eviction import Cache, FlatCache

REPO = Path(__file__).resolve().parent.parent
TIMING = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}  # measured, not simulated


def _simulated(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.fixture(scope="module")
def results() -> Results:
    trace = Trace.shipped("mooncake:conversation", requests=300)
    return simulate(trace, policies=["lru", "s3fifo"], capacity_ratios=[0.05, 0.1])


@pytest.mark.slow
def test_simulate_gives_the_rows_of_the_cli(results: Results, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAGE_HOME": str(tmp_path)}
    args = ["--trace", "mooncake:conversation", "--requests", "300", "--eviction-policies", "lru,s3fifo"]
    args += ["--capacity-ratio", "0.05,0.1", "--jobs", "1", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    assert _simulated(results.rows) == _simulated(cli["results"])
    assert results.workload == cli["workload"]
    assert results.settings == cli["settings"]


def test_results_as_dataframes_and_a_plot(results: Results, tmp_path: Path) -> None:
    runs = [(row["policy"], row["capacity_blocks"]) for row in results.rows]
    small, large = 390, 781  # 5 % and 10 % of the first 300 requests' 7,814 distinct blocks
    expected = [(p, c) for c in (small, large) for p in ("lru", "s3fifo", "belady")]
    assert runs == [*expected, ("unbounded", 7814)]
    frame = results.to_pandas()
    assert list(frame.columns) == list(results.rows[0])
    assert frame["hit_rate"].tolist() == [row["hit_rate"] for row in results.rows]
    polars_frame = results.to_polars()
    assert polars_frame.shape == frame.shape
    assert polars_frame["capacity_blocks"].to_list() == frame["capacity_blocks"].tolist()
    figure = results.plot(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "hit rate against capacity"
    assert sum("TTFT" in t for t in titles) == 2  # one TTFT CDF per cache size
    assert len(results.ttft_quantiles) == len(results.rows)


def test_traces_read_the_same_requests_by_name_and_by_path() -> None:
    path, shipped = shipped_trace("mooncake:conversation")
    by_name = Trace.shipped("mooncake:conversation", requests=50).load().describe()
    by_path = Trace.read(path, format=shipped.trace_format, requests=50).load().describe()
    assert by_name == by_path and by_name["requests"] == 50
    one = Trace.synthetic(requests=40, seed=3).load()
    assert one.describe() == Trace.synthetic(requests=40, seed=3).load().describe()
    assert one.describe() != Trace.synthetic(requests=40, seed=4).load().describe()
    assert Trace.synthetic(requests=30, preset="spec").load().describe()["requests"] == 30


def test_bad_input_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shipped traces:"):
        Trace.shipped("mooncake:nope")
    with pytest.raises(TypeError, match="must be a Trace"):
        simulate("mooncake:conversation", policies=["lru"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        simulate(Trace.synthetic(requests=10), policies=["lru"], no_such_option=1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\nnot json\n')
    with pytest.raises(BenchmarkError) as info:
        simulate(Trace.read(bad), policies=["lru"], capacities=[4])
    assert "\n" not in str(info.value)


def test_the_package_and_the_policy_library_export_the_api() -> None:
    assert (sim.Trace, sim.simulate, sim.Results) == (Trace, simulate, Results)
    with pytest.raises(AttributeError):
        _ = sim.no_such_name
    assert Cache is FlatCache
    cache = Cache("lru", 2)
    assert [cache.request(k) for k in "ababcab"] == [False, False, True, True, False, False, False]
    assert (cache.result().hits, cache.result().evictions) == (2, 3)
