"""`sage llm benchmark --mode engine` as a real process: a temporary engine, real completions."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes or long searches: out of the quick loop

SAGE = [sys.executable, "-m", "sage_cli.app"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SAGE, *args], capture_output=True, text=True, timeout=300, check=False)


def test_engine_mode_replays_the_workload_through_a_temporary_engine() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sage-bm-", dir="/tmp"))
    out = folder / "results.json"
    done = _run(
        "llm", "benchmark", "--mode", "engine", "--eviction-policies", "lru,arc",
        "--workload", "spec", "--requests", "16", "--capacity-blocks", "40",
        "--max-output-tokens", "4", "--socket", str(folder / "none.sock"), "--output", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["mode"] == "engine"
    rows = {r["policy"]: r for r in result["results"]}
    assert set(rows) == {"lru", "arc", "unbounded"}
    for row in rows.values():
        assert row["requests"] == 16 and row["failed"] == 0
        assert row["ttft_p50_s"] > 0 and row["throughput_tok_s"] > 0
        # 4 tokens a request (ignore_eos), counted from usage: SmolLM2's byte tokens that end
        # half a character send no chunk, so counting chunks came short
        assert row["output_tokens"] == 16 * 4
    assert rows["unbounded"]["evictions"] == 0
    assert rows["lru"]["evictions"] > 0  # 40 blocks cannot hold the spec workload's 160
    assert "throughput_impact" in rows["lru"]
    assert "lru" in done.stdout and "unbounded" in done.stdout


def test_engine_mode_rejects_a_pool_smaller_than_the_largest_request() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sage-bm-", dir="/tmp"))
    done = _run(
        "llm", "benchmark", "--mode", "engine", "--eviction-policies", "lru", "--workload", "spec",
        "--requests", "4", "--capacity-blocks", "3", "--socket", str(folder / "none.sock"),
    )  # fmt: skip
    assert done.returncode == 2
    assert "cannot hold the workload's largest request" in done.stderr
    assert "Traceback" not in done.stderr
