"""``sage llm benchmark --workload colocation`` as a real process: the table, --json, the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes: out of the quick loop


def sage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250", "SAGE_HOME": str(cwd / "sage-home")}
    env.pop("SAGE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "benchmark", "--workload", "colocation", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_table_names_every_system_and_the_capacity(tmp_path: Path) -> None:
    proc = sage(
        "--ratio", "7:3,shift", "--load", "125%", "--duration", "10", "--compute", "split", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("static-50/50", "static-80/20+adm", "shared-lru", "spec-no-alg2", "sage-no-alg3", "sage"):
        assert name in proc.stdout
    assert "capacity at 100 % load" in proc.stdout and "7:3" in proc.stdout and "shift" in proc.stdout
    assert "eviction policy: lru" in proc.stdout  # the pool's, by default


def test_json_and_the_output_file_hold_the_same_rows(tmp_path: Path) -> None:
    out = tmp_path / "colo.json"
    proc = sage(
        "--ratio",
        "9:1",
        "--load",
        "1.0",
        "--seeds",
        "0,1",
        "--systems",
        "sage,spec",
        "--duration",
        "10",
        "--alpha",
        "1",
        "--beta",
        "0",
        "--json",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads(out.read_text())
    assert [r["system"] for r in printed["results"]] == ["sage", "spec"]
    assert printed["settings"]["seeds"] == [0, 1]
    for row in printed["results"]:
        assert row["objective"] == pytest.approx(row["llm_attainment"])  # alpha 1, beta 0, gamma 0
        assert row["lost"] == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--ratio", "7:x"), "--ratio"),
        (("--load", "0"), "--load"),
        (("--seeds", "a"), "--seeds"),
        (("--systems", "sage,magic"), "unknown system"),
        (("--capacity-blocks", "10"), "does not take --capacity-blocks"),
        (("--mode", "engine"), "not a --duration"),  # engine mode takes --requests instead
        (("--alpha", "0", "--beta", "0"), "at least one"),
        (("--eviction-policies", "lru,arc"), "runs one eviction policy on the shared pool"),
        (("--eviction-policies", "nosuch"), "unknown eviction policy 'nosuch'"),
        (("--mode", "engine", "--eviction-policies", "lru"), "does not take --eviction-policies"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    proc = sage(*args, "--duration", "1", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_pool_runs_the_policy_named(tmp_path: Path) -> None:
    proc = sage("--eviction-policies", "slo", "--ratio", "7:3", "--duration", "10", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "eviction policy: slo" in proc.stdout
