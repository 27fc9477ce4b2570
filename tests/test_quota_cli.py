"""``sage llm eviction quota set|show|delete`` as real processes against a live engine (issue 51,
item 4): a quota set, shown as a table and as JSON while one salt's completions fill it, deleted;
bad input a one-line error and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # an engine process: out of the quick loop

REPO = Path(__file__).resolve().parent.parent
SAGE = [sys.executable, "-m", "sage_cli.app"]


def _sage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SAGE, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[dict[str, str], Path]]:
    home = Path(tempfile.mkdtemp(prefix="sage-quota-", dir="/tmp"))
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("SAGE_SOCKET", None)
    started = _sage(
        env, "llm", "engine", "start", "sage-tiny", "--detach", "--name", "quota", "--num-blocks", "256",
        "--block-size", "4", "--device", "cpu",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    yield env, home / "run" / "quota.sock"
    _sage(env, "llm", "engine", "stop", "--name", "quota")


def test_set_show_delete_while_a_salt_fills_its_quota(live: tuple[dict[str, str], Path]) -> None:
    env, sock = live
    done = _sage(env, "llm", "eviction", "quota", "set", "tenant/a", "--device-blocks", "5",
                 "--host-blocks", "2", "--name", "quota", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device_blocks"] == 5
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sage") as http:
        for i in range(6):
            body = {"prompt": f"Question {i} of tenant a: " + "tell me more. " * 3, "max_tokens": 2}
            answer = http.post("/v1/completions", json={**body, "cache_salt": "tenant/a"}, timeout=120)
            assert answer.status_code == 200, answer.text
    shown = _sage(env, "llm", "eviction", "quota", "show", "tenant/a", "--name", "quota", "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["salt"] == "tenant/a" and 0 < view["device_blocks_used"] <= 5
    assert view["device_evictions"] > 0  # six prompts of several blocks each: past the quota
    table = _sage(env, "llm", "eviction", "quota", "show", "--name", "quota")
    assert table.returncode == 0, table.stderr
    assert "Per-salt quotas" in table.stdout and "tenant/a" in table.stdout
    assert f"{view['device_blocks_used']} / 5" in table.stdout
    stats = _sage(env, "llm", "eviction", "stats", "--name", "quota")
    assert "Salt Quotas: 1" in stats.stdout and "tenant/a: device " in stats.stdout, stats.stdout
    deleted = _sage(env, "llm", "eviction", "quota", "delete", "tenant/a", "--name", "quota")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    assert "No salt has a quota." in _sage(env, "llm", "eviction", "quota", "show", "--name", "quota").stdout


def test_bad_input_is_one_line_and_a_non_zero_exit(live: tuple[dict[str, str], Path]) -> None:
    env, _ = live
    for args, code, words in [
        (("show", "nobody"), 1, "has no quota"),
        (("delete", "nobody"), 1, "has no quota"),
        (("set", "a"), 2, "--device-blocks"),
        (("set", "a", "--device-blocks", "-1"), 2, "--device-blocks"),
    ]:
        done = _sage(env, "llm", "eviction", "quota", *args, "--name", "quota")
        assert done.returncode == code, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert any(words in line for line in lines), (args, done.stderr)
        assert "Traceback" not in done.stderr
