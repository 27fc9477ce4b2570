"""The engine-mode colocation benchmark (sage_cli/benchmark/colocation_engine.py): the workload fitted
to a calibration, the rows computed from measured runs, and one short run on live engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.sim.colocation.workload import generate
from sage_cli.benchmark.colocation_engine import (
    ENGINE_SYSTEMS,
    Calibration,
    EngineRequest,
    _result,
    build_requests,
    run_colocation_engine_benchmark,
)
from sage_cli.benchmark.replay import EngineRun

REPO = Path(__file__).resolve().parent.parent
CALIBRATION = Calibration(ttft_s=0.05, tpot_s=0.01, embedding_s=0.2, output_tokens=8)


def test_requests_are_fitted_to_the_engines_capacity_and_slos() -> None:
    workload = generate(ratio="7:3", arrival="poisson", output="short", seed=3, duration_s=600.0)
    reqs, capacity = build_requests(
        workload,
        CALIBRATION,
        requests=40,
        load=1.25,
        slo_factor=4.0,
        prompt_tokens=32,
        max_output_tokens=16,
        text_divisor=8,
        text_tokens=24,
    )
    assert len(reqs) == 40
    llm = [r for r in reqs if r.kind == "llm"]
    f = len(llm) / len(reqs)
    assert capacity == pytest.approx(1 / (f * (0.05 + 0.01 * 7) + (1 - f) * 0.2))
    # the last arrival lands where `requests` at 1.25 x capacity would end
    assert reqs[-1].arrival_s == pytest.approx(40 / (1.25 * capacity))
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    for r in llm:
        assert r.body["slo_ttft_ms"] == pytest.approx(200.0) and r.body["slo_tpot_ms"] == pytest.approx(40.0)
        assert len(r.body["prompt"]) == 32 and 1 <= r.body["max_tokens"] <= 16
    for r in reqs:
        if r.kind == "embedding":
            assert r.body["slo_deadline_ms"] == pytest.approx(800.0)
            assert all(len(text) <= 24 for text in r.body["input"])


def test_rows_count_met_rejected_and_lost_requests() -> None:
    reqs = [
        EngineRequest("llm", 0.0, {}, (100.0, 20.0), 10),
        EngineRequest("llm", 0.0, {}, (100.0, 20.0), 10),
        EngineRequest("llm", 0.0, {}, (100.0, 20.0), 10),
        EngineRequest("embedding", 0.0, {}, (500.0,), 30),
        EngineRequest("embedding", 0.0, {}, (500.0,), 30),
    ]
    runs = [
        EngineRun(ok=True, ttft_s=0.05, tpot_s=[0.01, 0.01], completion_tokens=3),  # met
        EngineRun(ok=True, ttft_s=0.05, tpot_s=[0.03, 0.03], completion_tokens=3),  # TPOT missed
        EngineRun(ok=False, status=429, error="rejected"),
        EngineRun(ok=True, ttft_s=0.4),  # met
        EngineRun(ok=False, status=500, error="boom"),  # lost
    ]
    after = {"colocation": {"decisions": {"llm:defer": 2}}, "preemptions": 1, "total_blocks": 64}
    result = _result("x", reqs, runs, 2.0, {}, after)
    assert (result.llm_total, result.llm_met, result.llm_finished, result.llm_rejected) == (3, 1, 2, 1)
    assert (result.embedding_total, result.embedding_met, result.embedding_rejected) == (2, 1, 0)
    assert result.llm_deferred == 2 and result.preemptions == 1 and result.lost == 1
    assert result.output_tokens == 6 and result.embedding_latency_s == [0.4]


@pytest.mark.slow
def test_a_short_run_on_live_engines() -> None:
    out = run_colocation_engine_benchmark(
        ratios=["5:5"],
        loads=[1.0],
        requests=10,
        systems=("shared-lru", "sage"),
        engine={"num_blocks": 64, "block_size": 16},
        max_output_tokens=4,
        text_tokens=16,
    )
    names = [row["system"] for row in out["results"]]
    assert names == ["shared-lru", "sage", "sage, LLM only"]
    assert set(ENGINE_SYSTEMS) >= set(names[:2])
    for row in out["results"]:
        assert row["lost"] == 0.0
        assert 0.0 <= row["combined_attainment"] <= 1.0
    assert out["capacity"]["5:5"] > 0 and out["results"][0]["requests"] == 10.0
    assert all(row["ratio"] == "5:5" and row["load"] == 1.0 for row in out["results"])


def _sage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--compute", "split"], "--compute shared"),
        (["--systems", "sage-no-alg1"], "has no engine setting"),
        (["--seeds", "1,2"], "one --seeds"),
        (["--duration", "5"], "not a --duration"),
    ],
)
def test_engine_mode_refuses_what_it_cannot_honour(args: list[str], needle: str) -> None:
    done = _sage("--mode", "engine", "--workload", "colocation", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_cli_runs_the_engine_grid_and_prints_the_table() -> None:
    common = ["--mode", "engine", "--workload", "colocation", "--ratio", "7:3", "--load", "1.0"]
    done = _sage(*common, "--requests", "6", "--systems", "sage", "--capacity-blocks", "64", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["mode"] == "engine" and result["settings"]["engine"]["num_blocks"] == 64
    assert [row["system"] for row in result["results"]] == ["sage", "sage, LLM only"]
    assert all(row["lost"] == 0.0 for row in result["results"])
