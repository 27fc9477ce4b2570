"""``sage llm eviction explain --request ID`` and the prompt-cache lines of ``eviction stats``,
as a user runs them: real processes (an engine started with ``sage llm engine start --detach``
on a temporary socket, the CLI as a subprocess) against real requests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # an engine process: out of the quick loop

REPO = Path(__file__).resolve().parent.parent


def _sage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sage_cli.app", "llm", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[dict[str, str], Path]]:
    folder = Path(tempfile.mkdtemp(prefix="sg-rc-", dir="/tmp"))
    sock = folder / "e.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO), COLUMNS="200")  # no wrapped lines
    started = _sage(
        env, "engine", "start", "sage-tiny", "--num-blocks", "64", "--block-size", "4", "--device", "cpu",
        "--detach", "--socket", str(sock),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    yield env, sock
    _sage(env, "engine", "stop", "--socket", str(sock))
    shutil.rmtree(folder, ignore_errors=True)


def _complete(sock: Path, prompt: str, **fields: Any) -> dict[str, Any]:
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sage", timeout=60
    ) as client:
        answer = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, **fields})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_explain_request_names_why_each_block_missed(engine: tuple[dict[str, str], Path]) -> None:
    env, sock = engine
    _complete(sock, "a shared system prompt here ")
    salted = _complete(sock, "a shared system prompt here ", cache_salt="other-tenant", tenant="t2")
    shown = _sage(env, "eviction", "explain", "--request", salted["id"], "--socket", str(sock))
    assert shown.returncode == 0, shown.stderr
    assert f"request {salted['id']}, tenant t2, salt sha256:" in shown.stdout
    assert "cached under a different salt" in shown.stdout and "other-tenant" not in shown.stdout
    as_json = _sage(env, "eviction", "explain", "--request", salted["id"], "--socket", str(sock), "--json")
    receipt = json.loads(as_json.stdout)
    assert receipt["misses"][0]["reason"] == "other_salt" and receipt["tenant"] == "t2"
    latest = json.loads(
        _sage(env, "eviction", "explain", "--request", "latest", "--socket", str(sock), "--json").stdout
    )
    assert latest["id"] == salted["id"]
    stats = _sage(env, "eviction", "stats", "--socket", str(sock))
    assert stats.returncode == 0 and "Prompt Cache (tenant t2, salt sha256:" in stats.stdout


def test_an_unknown_request_is_a_one_line_error(engine: tuple[dict[str, str], Path]) -> None:
    env, sock = engine
    missing = _sage(env, "eviction", "explain", "--request", "cmpl-nope", "--socket", str(sock))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "no cache receipt for request 'cmpl-nope'" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    both = _sage(env, "eviction", "explain", "12", "--request", "x", "--socket", str(sock))
    assert both.returncode != 0 and "alone" in both.stderr
