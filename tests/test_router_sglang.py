"""SGLang's real router (``sglang-router``, in its venv: scripts/integration_venvs.sh
sglang-router) in front of two real sage engines, each its own process on 127.0.0.1: it
registers them (reading their server and model info), routes chats and completions to both and
brings the answers back, and its /flush_cache empties both engines' prefix caches.
benchmarks/fleet.py starts and stops the processes for both."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / "benchmarks" / "fleet.py"


def _fleet_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_under_test", FLEET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


fleet = _fleet_module()


@pytest.fixture(scope="module")
def routed() -> Iterator[tuple[str, list[Any]]]:
    try:
        fleet.router_binary("sglang")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with tempfile.TemporaryDirectory(prefix="sage-router-") as work:
        procs = fleet.Fleet(Path(work))
        try:
            engines = fleet.start_engines(procs, 2, "sage-tiny", 512, Path(work) / "home")
            port = fleet.free_port()
            cmd = fleet.router_command("sglang", "round_robin", port, engines, 16, "sage-tiny")
            router = procs.spawn("router", cmd)
            url = f"http://127.0.0.1:{port}"
            fleet.wait_until(
                "router", lambda: len(fleet.http("GET", f"{url}/v1/models")["data"]) == 1, 120, router
            )
            yield url, engines
        finally:
            procs.stop_all()


@pytest.mark.slow
def test_the_router_spreads_real_requests_over_both_engines_and_answers_come_back(
    routed: tuple[str, list[Any]],
) -> None:
    url, engines = routed
    assert fleet.http("GET", f"{url}/v1/models")["data"][0]["id"] == "sage-tiny"
    before = [e.stats()[2] for e in engines]
    for i in range(4):
        body = {
            "model": "sage-tiny",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 3,
        }
        answer = fleet.http("POST", f"{url}/v1/chat/completions", body)
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 3
    done = fleet.http(
        "POST", f"{url}/v1/completions", {"model": "sage-tiny", "prompt": "hello", "max_tokens": 2}
    )
    assert done["choices"][0]["finish_reason"] == "length"
    served = [e.stats()[2] - b for e, b in zip(engines, before, strict=True)]
    assert sum(served) == 5 and min(served) >= 2  # round robin: both engines served


@pytest.mark.slow
def test_the_router_s_flush_empties_every_engine_s_prefix_cache(routed: tuple[str, list[Any]]) -> None:
    url, engines = routed
    for _ in range(2):
        body = {
            "model": "sage-tiny",
            "messages": [{"role": "user", "content": "a shared prompt " * 4}],
            "max_tokens": 1,
        }
        fleet.http("POST", f"{url}/v1/chat/completions", body)
    assert sum(fleet.http("GET", f"{e.url}/v1/cache/usage")["cached_blocks"] for e in engines) > 0
    flushed = fleet.http("POST", f"{url}/flush_cache")
    assert flushed["workers_flushed"] == 2
    assert [fleet.http("GET", f"{e.url}/v1/cache/usage")["cached_blocks"] for e in engines] == [0, 0]


# Pairs of requests on a shared head (hash ids 1-3, then 6-8): the second of a pair hits when
# it lands where the first was served; round robin sends it to the other engine half the time.
ROUTED_TRACE = [
    {"timestamp": t, "input_length": 512 * len(ids), "output_length": 2, "hash_ids": ids}
    for t, ids in enumerate(
        [
            [1, 2, 3, 4],
            [1, 2, 3, 5],
            [1, 2, 3, 4],
            [6, 7, 8],
            [6, 7, 8, 9],
            [6, 7, 8],
            [1, 2, 3, 5],
            [6, 7, 8, 9],
        ]
    )
]


def _benchmark(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    trace = tmp_path / "routed.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in ROUTED_TRACE), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAGE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "sage_cli", "llm", "benchmark", "--mode", "engine", "--trace", str(trace)]
    return subprocess.run(
        [*cmd, "--max-output-tokens", "2", "--concurrency", "2", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _cache_stats(engines: list[Any]) -> list[tuple[int, int, int]]:
    return [e.stats() for e in engines]  # (tokens looked up, served from cache, requests finished)


@pytest.mark.slow
def test_the_benchmark_through_the_router_reads_the_fleet_s_hit_ratio_from_both_engines(
    routed: tuple[str, list[Any]], tmp_path: Path
) -> None:
    url, engines = routed
    before = _cache_stats(engines)
    out = tmp_path / "result.json"
    workers = [arg for e in engines for arg in ("--worker-url", e.url)]
    proc = _benchmark(
        tmp_path, "--engine-url", url, *workers, "--eviction-policies", "lfu", "--output", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    after = _cache_stats(engines)
    (row,) = json.loads(out.read_text())["results"]
    assert (row["policy"], row["router"], row["replicas"], row["failed"]) == ("lfu", url, 2, 0)
    assert [fleet.http("GET", f"{e.url}/v1/engine")["policy"]["name"] for e in engines] == ["lfu", "lfu"]
    served = [w["requests_served"] for w in row["workers"]]
    assert served == [a[2] - b[2] for a, b in zip(after, before, strict=True)]
    assert sum(served) == len(ROUTED_TRACE) and min(served) > 0  # both engines served
    # the fleet's figures are the sum of the engines' own stats over the run
    queries = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    assert (row["prefix_cache_queries_tokens"], row["prefix_cache_hits_tokens"]) == (queries, hits)
    assert hits > 0 and row["hit_rate"] == pytest.approx(hits / queries)
    assert row["ttft_p50_s"] > 0 and row["throughput_tok_s"] > 0


@pytest.mark.slow
def test_a_router_without_its_workers_or_a_worker_that_is_not_there_is_a_one_line_error(
    routed: tuple[str, list[Any]], tmp_path: Path
) -> None:
    url, engines = routed
    for args, fragment in (
        ([], "a router's URL needs --worker-url"),
        (
            ["--worker-url", engines[0].url, "--worker-url", f"http://127.0.0.1:{fleet.free_port()}"],
            "cannot reach a worker",
        ),
        (["--worker-url", engines[0].url, "--engine-kind", "vllm"], "no vllm:prefix_cache_queries"),
    ):
        proc = _benchmark(tmp_path, "--engine-url", url, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert fragment in lines[0]
