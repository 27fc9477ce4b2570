"""A fresh engine, as a new user meets it (issue 48), in a real process started by `sage`:

- item 13: ``/metrics`` has the cache's histograms (ages at hit and eviction, reuse distance,
  regret ages) and, with a host tier, the tier load histogram from the start, at zero, so a
  Grafana panel reads 0 rather than "no data";
- item 8: ``sage llm eviction logs`` and ``logs -f`` say that nothing was evicted yet;
- item 5: the official `openai` client's chat request without ``max_tokens`` generates to the end
  of the context (OpenAI's and vLLM's default), not 16 tokens; a completion's default stays 16;
- item 11: a policy plugin installed after the engine started is found by ``set-policy``, and one
  whose module fails to import is a 400 "policy X could not be loaded: ..." (it was a 500,
  ``internal server error: ModuleNotFoundError``, which also broke every other plugin's lookup).

The engine is sage-tiny (random weights) on a pool of 16 blocks of 16
tokens, so "the rest of the context" is 256 tokens less the prompt.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow  # a real engine process

REPO = Path(__file__).resolve().parent.parent
SAGE = [sys.executable, "-m", "sage_cli.app"]
POOL_TOKENS = 16 * 16


def _sage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SAGE, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def fresh() -> Iterator[tuple[dict[str, str], Path]]:
    home = Path(tempfile.mkdtemp(prefix="sg-fresh-", dir="/tmp"))  # short: a socket path is bounded
    (home / "site").mkdir()  # where plugins are installed once the engine runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=str(home), PYTHONPATH=f"{home / 'site'}{os.pathsep}{REPO}")
    started = _sage(
        env, "llm", "engine", "start", "sage-tiny", "--detach", "--name", "fresh", "--num-blocks", "16",
        "--block-size", "16", "--device", "cpu", "--host-kv-cache", "1MiB",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield env, home / "run" / "fresh.sock"
    finally:
        _sage(env, "llm", "engine", "stop", "--name", "fresh")


def _http(sock: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sage", timeout=120)


def test_a_fresh_engine_exports_its_histograms_at_zero(fresh: tuple[dict[str, str], Path]) -> None:
    _, sock = fresh
    with _http(sock) as http:
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sage:block_age_at_hit_seconds",
        "sage:block_age_at_eviction_seconds",
        "sage:block_reuse_distance_blocks",
        "sage:regret_age_seconds",
        "sage:kv_tier_load_duration_seconds",
    ):
        assert name in families, f"{name}: no series on a fresh engine"
        samples = families[name].samples
        suffixes = {s.name.removeprefix(name) for s in samples}
        assert suffixes == {"_bucket", "_sum", "_count"} | ({"_created"} & suffixes), (name, suffixes)
        assert any(s.labels.get("le") == "+Inf" for s in samples)
        assert all(s.value == 0 for s in samples if not s.name.endswith("_created")), name
    ages = families["sage:block_age_at_hit_seconds"].samples
    assert {s.labels["policy"] for s in ages} == {"lru"}
    loads = families["sage:kv_tier_load_duration_seconds"].samples
    assert {s.labels["tier"] for s in loads} == {"host"}


def test_logs_on_a_fresh_engine_say_nothing_was_evicted(fresh: tuple[dict[str, str], Path]) -> None:
    env, _ = fresh
    done = _sage(env, "llm", "eviction", "logs", "--name", "fresh")
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.strip().startswith("no evictions yet (")
    follow = [*SAGE, "llm", "eviction", "logs", "--name", "fresh", "-f"]
    proc = subprocess.Popen(follow, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("no evictions yet (") and "waiting for the first (Ctrl-C stops)" in line
        time.sleep(0.2)
        assert proc.poll() is None  # and it keeps following
    finally:
        proc.kill()
        proc.wait()


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_context(fresh: tuple[dict[str, str], Path]) -> None:
    openai = pytest.importorskip("openai")
    _, sock = fresh
    http = _http(sock)
    with http, openai.OpenAI(base_url="http://sage/v1", api_key="-", http_client=http) as client:
        # ignore_eos (vLLM's extension): the random model would stop by chance; this one runs on
        chat = client.chat.completions.create(
            model="sage-tiny",
            messages=[{"role": "user", "content": "Tell me a long story."}],
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage.completion_tokens == POOL_TOKENS - chat.usage.prompt_tokens  # the rest of the pool
        text = client.completions.create(model="sage-tiny", prompt="Once upon a time", temperature=0)
        assert text.usage.completion_tokens <= 16  # a completion's default stays OpenAI's 16


def _install_plugins(site: Path) -> None:
    """Two plugins, as pip would lay them out: `latelru` (an LRU under its own name) and `broken`,
    whose entry point names a module that does not exist."""
    (site / "latelru_policy.py").write_text(
        "from sage_eviction.policies.lru import LRUPolicy\n\n\n"
        "class LateLRU(LRUPolicy):\n"
        '    """LRU, installed after the engine started."""\n\n'
        '    name = "latelru"\n'
    )
    dist = site / "latelru-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: latelru\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[sage_eviction.policies]\nlatelru = latelru_policy:LateLRU\nbroken = no_such_module_h48:Policy\n"
    )


def test_a_plugin_installed_after_the_engine_started(fresh: tuple[dict[str, str], Path]) -> None:
    env, sock = fresh
    _install_plugins(sock.parent.parent / "site")
    swapped = _sage(env, "llm", "eviction", "set-policy", "--name", "fresh", "latelru")
    assert swapped.returncode == 0, swapped.stderr
    assert "-> latelru" in swapped.stdout
    broken = _sage(env, "llm", "eviction", "set-policy", "--name", "fresh", "broken")
    assert broken.returncode != 0 and "Traceback" not in broken.stderr
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1, broken.stderr
    assert "policy 'broken' could not be loaded: ModuleNotFoundError" in lines[0], lines[0]
    assert "no_such_module_h48" in lines[0] and "internal server error" not in lines[0]
    with _http(sock) as http:
        answer = http.put("/v1/eviction/policy", json={"policy": "broken"})
    assert answer.status_code == 400, answer.text
    back = _sage(env, "llm", "eviction", "set-policy", "--name", "fresh", "lru")  # the others still load
    assert back.returncode == 0, back.stderr
