"""Sweeps across executors: `sage llm benchmark --jobs N` and `--ray ADDRESS` give the JSON of
`--jobs 1` (rows in the same order, every field the same but the wall times), and the executors
of engine_adapter/sim/sweep.py keep the rows' order and their errors.

The CLI tests run `sage` as real processes (real worker processes, a real local Ray cluster);
the Ray test is skipped where ray (the `ray` extra) is not installed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_adapter.sim.benchmark import build_workload
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.sweep import (
    Executor,
    RowOutcome,
    RowSpec,
    SweepContext,
    run_row,
    run_rows,
    usable_cores,
)
from sage_cli.benchmark.table import run_caption
from sage_eviction.native import PURE_ENV, core_implementation

# Fields that time the run on the wall clock: the only ones an executor may change.
WALL_FIELDS = ("wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us")

HAS_RAY = (
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys; sys.exit(importlib.util.find_spec('ray') is None)",
        ],
        check=False,
    ).returncode
    == 0
)


def sage(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "250", "SAGE_HOME": str(cwd / "sage-home"), **(env or {})}
    full_env.pop("SAGE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def small_trace(path: Path, requests: int = 160, seed: int = 7) -> Path:
    """A Mooncake trace of conversations that share system prompts: hits, misses and evictions."""
    rng = random.Random(seed)
    prefixes = [[1000 * p + i for i in range(rng.randint(2, 6))] for p in range(8)]
    lines = []
    for index in range(requests):
        prefix = rng.choice(prefixes)
        own = [100_000 + 10 * index + i for i in range(rng.randint(1, 4))]
        hash_ids = prefix + own
        lines.append(
            {
                "timestamp": index * 250,
                "input_length": 512 * len(hash_ids) - rng.randint(0, 300),
                "output_length": rng.randint(1, 40),
                "hash_ids": hash_ids,
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def without_wall_times(result: dict[str, Any]) -> dict[str, Any]:
    """The result less what an executor may change: the run block and the rows' wall times."""
    rest = {key: value for key, value in result.items() if key != "run"}
    rest["results"] = [
        {key: value for key, value in row.items() if key not in WALL_FIELDS} for row in result["results"]
    ]
    return rest


SWEEP = ("--eviction-policies", "lru,arc,gdsf,slru", "--capacity-blocks", "40,80", "--json")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return small_trace(tmp_path / "small.jsonl")


@pytest.mark.slow
def test_jobs_give_the_json_of_one_process(tmp_path: Path, trace: Path) -> None:
    results = {}
    for jobs in ("1", "2", "3"):
        proc = sage("--trace", str(trace), *SWEEP, "--jobs", jobs, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        results[jobs] = json.loads(proc.stdout)
    one = results["1"]
    # the sweep is not trivial: rows that evict, rows that differ
    assert len(one["results"]) == 2 * 5 + 1
    assert all(row["evictions"] > 0 for row in one["results"] if row["policy"] != "unbounded")
    assert len({row["hit_rate"] for row in one["results"]}) > 3
    for jobs in ("2", "3"):
        assert without_wall_times(results[jobs]) == without_wall_times(one)
    assert one["run"]["executor"] == "in-process" and one["run"]["workers"] == 1
    assert results["2"]["run"]["executor"] == "processes" and results["2"]["run"]["workers"] == 2
    for result in results.values():
        assert result["run"]["implementation"] == core_implementation()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'sage-kv[ray]')")
def test_a_local_ray_cluster_gives_the_json_of_one_process(tmp_path: Path, trace: Path) -> None:
    one = sage("--trace", str(trace), *SWEEP, "--jobs", "1", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    on_ray = sage("--trace", str(trace), *SWEEP, "--ray", "local", cwd=tmp_path)
    assert on_ray.returncode == 0, on_ray.stderr
    result = json.loads(on_ray.stdout)
    assert without_wall_times(result) == without_wall_times(json.loads(one.stdout))
    assert result["run"]["executor"] == "ray" and result["run"]["ray_address"] == "local"
    assert result["run"]["implementation"] == core_implementation()


@pytest.mark.slow
def test_the_implementation_is_in_the_json_and_under_the_table(tmp_path: Path, trace: Path) -> None:
    args = ("--trace", str(trace), "--eviction-policies", "lru", "--capacity-blocks", "40", "--jobs", "2")
    pure = sage(*args, "--json", cwd=tmp_path, env={PURE_ENV: "1"})
    assert pure.returncode == 0, pure.stderr
    run = json.loads(pure.stdout)["run"]
    assert run["implementation"] == f"pure-python ({PURE_ENV}=1)"
    assert run["policy_calls"] == {"lru": "python", "belady": "python", "unbounded": "python"}
    table = sage(*args, cwd=tmp_path, env={PURE_ENV: "1"})
    assert table.returncode == 0, table.stderr
    caption = f"core: pure-python ({PURE_ENV}=1); in Python: belady, lru, unbounded; 2 processes;"
    assert caption in " ".join(table.stdout.split())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--jobs", "0"], ["--jobs 0", "positive"]),
        (["--jobs", "-1"], ["--jobs -1", "positive"]),
        (["--jobs", "2", "--ray", "local"], ["either --jobs", "--ray"]),
        (["--jobs", "2", "--mode", "engine"], ["--mode sim"]),
        (["--ray", ""], ["--ray", "address"]),
    ],
)
def test_bad_executor_options_are_one_line_errors(
    tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    proc = sage("--workload", "synthetic", "--requests", "10", *args, cwd=tmp_path)
    assert_one_line_error(proc, *fragments)
    assert proc.returncode == 2


@pytest.mark.slow
def test_ray_without_ray_installed_names_the_extra(tmp_path: Path) -> None:
    # A sitecustomize that makes `ray` unimportable, as on a machine without the extra.
    hide = tmp_path / "hide-ray"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n", encoding="utf-8")
    path = os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])
    proc = sage(
        "--workload",
        "synthetic",
        "--requests",
        "10",
        "--ray",
        "local",
        cwd=tmp_path,
        env={"PYTHONPATH": path},
    )
    assert_one_line_error(proc, "--ray needs Ray", "pip install 'sage-kv[ray]'")


# ---------------------------------------------------------------------- the executors in-process


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> SweepContext:
    path = small_trace(tmp_path_factory.mktemp("sweep") / "small.jsonl", requests=60)
    return SweepContext(build_workload(trace=path), "radix", CostModel())


def _rows(policies: list[str], capacities: list[int]) -> list[RowSpec]:
    pairs = [(policy, capacity) for capacity in capacities for policy in policies]
    return [RowSpec(index, policy, capacity) for index, (policy, capacity) in enumerate(pairs)]


class Recorder:
    """A `RowProgress` that keeps what it was told."""

    def __init__(self) -> None:
        self.started_rows: list[int] = []
        self.finished_rows: list[int] = []
        self.requests: dict[int, list[int]] = {}

    def started(self, spec: RowSpec) -> None:
        self.started_rows.append(spec.index)

    def requests_done(self, spec: RowSpec, done: int) -> None:
        self.requests.setdefault(spec.index, []).append(done)

    def finished(self, spec: RowSpec) -> None:
        self.finished_rows.append(spec.index)

    def refresh(self) -> None:
        pass


def figures(outcomes: list[RowOutcome]) -> list[dict[str, Any]]:
    return [{k: v for k, v in o.row.items() if k not in WALL_FIELDS} for o in outcomes]


def test_processes_return_the_rows_of_this_process_in_order(context: SweepContext) -> None:
    rows = _rows(["lru", "arc", "lfu"], [30, 45])
    shuffled = [rows[i] for i in (4, 0, 5, 2, 1, 3)]  # handed over in this order, back in it
    here, there = Recorder(), Recorder()
    in_process = run_rows(context, shuffled, Executor(jobs=1), here)
    in_workers = run_rows(context, shuffled, Executor(jobs=2), there)
    assert [o.index for o in in_process] == [o.index for o in in_workers] == [4, 0, 5, 2, 1, 3]
    assert figures(in_process) == figures(in_workers)
    assert figures(in_process)[1] == figures([run_row(context, rows[0])])[0]  # a row on its own
    assert len({o.row["evictions"] for o in in_process}) > 1
    assert {o.implementation for o in in_workers} == {core_implementation()}
    # the bar hears of every row: per request here, per row from the workers
    assert here.started_rows == here.finished_rows == [4, 0, 5, 2, 1, 3]
    n_requests = len(context.workload.requests)
    assert all(done[-1] == n_requests for done in here.requests.values())
    assert sorted(there.finished_rows) == list(range(6)) and not there.started_rows


ROWS = _rows(["lru", "arc", "lfu", "s3fifo"], [30, 45])


@pytest.fixture(scope="module")
def alone(context: SweepContext) -> dict[int, dict[str, Any]]:
    """Each row run on its own in this process: the oracle for every executor and order."""
    return {spec.index: figures([run_row(context, spec)])[0] for spec in ROWS}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(ROWS))), size=st.integers(1, len(ROWS)), jobs=st.integers(1, 3))
def test_any_rows_in_any_order_on_any_jobs_are_the_rows_run_alone(
    context: SweepContext, alone: dict[int, dict[str, Any]], order: list[int], size: int, jobs: int
) -> None:
    chosen = [ROWS[i] for i in order[:size]]
    outcomes = run_rows(context, chosen, Executor(jobs=jobs), Recorder())
    assert [o.index for o in outcomes] == [spec.index for spec in chosen]
    assert figures(outcomes) == [alone[spec.index] for spec in chosen]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'sage-kv[ray]')")
def test_ray_tasks_give_the_rows_run_alone_and_raise_a_bad_rows_error(
    context: SweepContext, alone: dict[int, dict[str, Any]]
) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        outcomes = run_rows(context, ROWS[::-1], Executor(ray_address="local"), Recorder())
        assert figures(outcomes) == [alone[spec.index] for spec in ROWS[::-1]]
        assert {o.implementation for o in outcomes} == {core_implementation()}
        with pytest.raises(ValueError, match="cannot hold the largest request"):
            run_rows(context, [ROWS[0], RowSpec(99, "lru", 1)], Executor(ray_address="local"), Recorder())
    finally:
        ray.shutdown()


def test_a_bad_row_in_a_worker_raises_the_simulators_error(context: SweepContext) -> None:
    rows = [RowSpec(0, "lru", 30), RowSpec(1, "lru", 1)]  # 1 block holds no request (radix)
    with pytest.raises(ValueError, match="cannot hold the largest request"):
        run_rows(context, rows, Executor(jobs=2), Recorder())


@pytest.mark.parametrize("jobs", [0, -1, 1.5])
def test_an_executor_needs_a_positive_number_of_jobs(jobs: Any) -> None:
    with pytest.raises(ValueError, match="positive number of processes"):
        Executor(jobs=jobs)


def test_workers_never_outnumber_the_rows() -> None:
    assert Executor(jobs=8).workers(3) == 3
    assert Executor(jobs=8).describe(1) == {"executor": "in-process", "workers": 1}
    assert Executor(jobs=2).describe(5) == {"executor": "processes", "workers": 2}
    assert Executor(ray_address="auto").describe(5) == {"executor": "ray", "ray_address": "auto"}
    assert usable_cores() >= 1


def test_the_caption_says_the_core_and_the_executor() -> None:
    run = {"executor": "processes", "workers": 2, "implementation": "compiled", "wall_s": 4.14}
    assert run_caption(run) == "core: compiled; 2 processes; 4.1 s"
    ray = {"executor": "ray", "ray_address": "local", "implementation": "compiled", "wall_s": 1.0}
    assert run_caption(ray) == "core: compiled; Ray tasks at local; 1.0 s"
    assert run_caption(None) is None
