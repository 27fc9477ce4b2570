"""``sage llm benchmark --replicas N --router ...`` through a real subprocess: the fleet rows as
JSON and as the table, and one-line errors for what it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_benchmark_cli import assert_one_line_error, sage


@pytest.mark.slow
def test_fleet_rows_as_json_and_table(tmp_path: Path) -> None:
    args = ["--requests", "60", "--eviction-policies", "lru", "--capacity-ratio", "0.2", "--jobs", "1"]
    args += ["--replicas", "2", "--router", "round_robin,precise"]
    proc = sage(*args, "--json", "--output", str(tmp_path / "fleet.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    rows = result["results"]
    assert [(r["router"], r["replicas"], r["policy"]) for r in rows] == [
        ("round_robin", 2, "lru"),
        ("precise", 2, "lru"),
    ]
    for row in rows:
        assert sum(row["routed"]) == row["requests"] == 60
        assert 0.0 <= row["block_hit_ratio"] <= 1.0 and row["load_spread"] >= 1.0
    assert rows[0]["routed"] == [30, 30]
    assert result["settings"]["fleet"] == {"replicas": [2], "routers": ["round_robin", "precise"]}
    assert json.loads((tmp_path / "fleet.json").read_text()) == result
    table = sage(*args, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "Load max/mean" in table.stdout and "round_robin" in table.stdout and "precise" in table.stdout


@pytest.mark.slow  # a subprocess each (about 3 s)
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--replicas", "2", "--router", "nearest"], "unknown router 'nearest'; routers: round_robin"),
        (["--replicas", "0"], "--replicas 0: a fleet needs at least one replica"),
        (["--replicas", "two"], "--replicas: 'two' is not a number of replicas"),
        (["--router", "precise"], "--router needs --replicas N"),
        (["--replicas", "2", "--router", "cache_aware:cache_threshold=1.5"], "must be in [0, 1]"),
        (["--replicas", "2", "--eviction-policies", "belady"], "--replicas runs online policies, not belady"),
        (["--replicas", "2", "--mode", "engine"], "--replicas and --router run the fleet simulator"),
    ],
)
def test_bad_fleet_options_are_one_line_errors(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = sage("--requests", "20", *args, cwd=tmp_path)
    assert_one_line_error(proc, fragment)
