"""See and explain the cache of a live engine: explained evictions, the tree, top, the dashboard.

One engine (sage-tiny, a 24-block pool, ``--explain --log-evictions --adaptive-batch``) serves
prompts of several tenants until it evicts; then, as real processes over its socket:

- ``sage llm eviction logs --explain`` prints one line per victim with its ranking values, and
  ``sage llm eviction explain SEQ`` the victim's values, the candidates it was chosen before and
  the blocks passed over; an eviction not in the log and a malformed target are one-line errors;
- ``sage llm eviction tree`` renders as text, ``--dot`` writes DOT and ``--png`` a PNG (Graphviz);
  without the graphviz package or the dot program it is a one-line error naming the install;
- ``GET /v1/cache/tree`` stays within ``max_nodes`` and answers bad queries with a 400 and JSON;
- ``sage llm eviction top`` runs in a real terminal (tmux): it draws the figures and ``q`` quits;
- every metric the Grafana dashboard (dashboards/sage.json) queries is exported by ``/metrics``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow  # a real engine and real terminals

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "dashboards" / "sage.json"


class Engine:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "e.sock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
        self.env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO), COLUMNS="200")

    def sage(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sage_cli", "llm", "eviction", *args, "--socket", str(self.socket)],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def http(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://sage", timeout=60
        )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    folder = Path(tempfile.mkdtemp(prefix="sg-view-", dir="/tmp"))  # AF_UNIX paths are short
    e = Engine(folder)
    args = ["llm", "engine", "start", "sage-tiny", "--num-blocks", "24", "--device", "cpu", "--detach"]
    args += ["--socket", str(e.socket), "--explain", "--log-evictions", "--adaptive-batch"]
    # generated tokens cached too (not the default since issue 51): their blocks make 24 blocks evict
    args += ["--max-num-seqs", "8", "--cache-generated-tokens"]
    started = subprocess.run(
        [sys.executable, "-m", "sage_cli", *args], env=e.env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    try:
        with e.http() as c:
            for i in range(8):
                prompt = (
                    f"Tenant {i % 3} system prompt: answer briefly and politely. Question {i} is this one."
                )
                r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 6, "tenant": f"t{i % 2}"})
                assert r.status_code == 200, r.text
            assert c.get("/v1/eviction/stats").json()["total_evictions"] > 0
        yield e
    finally:
        subprocess.run(
            [sys.executable, "-m", "sage_cli", "llm", "engine", "stop", "--socket", str(e.socket)],
            env=e.env,
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(folder, ignore_errors=True)


def _one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_logs_explain_and_explain_a_past_eviction(engine: Engine) -> None:
    logs = engine.sage("logs", "--explain", "--tail", "200")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.strip().splitlines()
    assert lines and all("evicted by LRU for" in line and "rank=(" in line for line in lines)
    raw = engine.sage("logs", "--json", "--tail", "200").stdout
    events = [json.loads(line) for line in raw.splitlines() if line.strip()]
    victims = [e for e in events if e.get("event") == "evict"]
    assert victims and all("explain" in e for e in victims)
    seq = next(e["sequence_id"] for e in victims if e.get("sequence_id") is not None)
    explained = engine.sage("explain", str(seq))
    assert explained.returncode == 0, explained.stderr
    assert "ranked by: the logical time of its latest insert or hit" in explained.stdout
    assert "its values:" in explained.stdout and "rank=(" in explained.stdout
    by_block = engine.sage("explain", victims[0]["block"][:12], "--json")
    assert (
        by_block.returncode == 0
        and json.loads(by_block.stdout.splitlines()[0])["block"] == victims[0]["block"]
    )
    _one_line_error(engine.sage("explain", "999999"), "no eviction of 999999")
    _one_line_error(engine.sage("explain", "not-a-key"), "sequence id")


def test_tree_as_text_and_dot(engine: Engine, tmp_path: Path) -> None:
    text = engine.sage("tree", "--depth", "3", "--max-nodes", "10")
    assert text.returncode == 0, text.stderr
    assert "prefix cache:" in text.stdout and "tokens 0-" in text.stdout and "ghost" in text.stdout
    dot, png = tmp_path / "t.dot", tmp_path / "t.png"
    drawn = engine.sage("tree", "--dot", str(dot))
    assert drawn.returncode == 0, drawn.stderr
    assert dot.read_text().startswith("digraph sage_prefix_cache {") and "style=dashed" in dot.read_text()
    small = json.loads(engine.sage("tree", "--json", "--max-nodes", "1").stdout)
    assert small["shown_nodes"] == 1 and small["truncated"] is True

    # No graphviz package: a one-line error naming the extra. No dot program: naming the package.
    shadow = tmp_path / "shadow"
    (shadow / "graphviz").mkdir(parents=True)
    (shadow / "graphviz" / "__init__.py").write_text("raise ImportError('no graphviz here')\n")
    env = {**engine.env, "PYTHONPATH": f"{shadow}{os.pathsep}{REPO}"}
    _one_line_error(engine.sage("tree", "--dot", str(dot), env=env), "pip install 'sage-kv[viz]'")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = {**engine.env, "PATH": str(bare)}
    _one_line_error(engine.sage("tree", "--png", str(png), env=env), "apt-get install graphviz")


@pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed (.ci/run installs it)"
)
def test_tree_as_png(engine: Engine, tmp_path: Path) -> None:
    png = tmp_path / "t.png"
    drawn = engine.sage("tree", "--png", str(png))
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tree_endpoint_is_bounded_and_checks_its_query(engine: Engine) -> None:
    with engine.http() as c:
        tree = c.get("/v1/cache/tree", params={"depth": 64, "max_nodes": 2}).json()
        assert tree["shown_nodes"] <= 2
        for query in ({"depth": 0}, {"max_nodes": "abc"}, {"max_nodes": 100000}, {"colour": "red"}):
            r = c.get("/v1/cache/tree", params=query)
            assert r.status_code == 400 and "error" in r.json(), (query, r.text)
        usage = c.get("/v1/cache/usage").json()
        assert usage["adaptive_batch"] is True and usage["explain_evictions"] is True
        assert 1 <= usage["max_running_batch"] <= 8
        assert sum(usage["by_tenant"].values()) == usage["used_blocks"]


def _pane(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def test_top_in_a_real_terminal(engine: Engine) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    session = f"sage-top-{os.getpid()}"
    env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", REPO), ("SAGE_HOME", engine.env["SAGE_HOME"])))
    command = (
        f"env {env} {sys.executable} -m sage_cli llm eviction top --socket {engine.socket}; "
        "echo TOP-EXITED-$?; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", command], check=True)
    try:
        deadline = time.monotonic() + 40
        while "last victims" not in (screen := _pane(session)) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert "hit rate" in screen and "evictions/s" in screen and "re-prefill" in screen, screen
        assert "pool use" in screen and "evicted by LRU" in screen and "batch limit" in screen, screen
        time.sleep(1.5)  # a refresh: evictions/s has a value now
        assert re.search(r"evictions/s \d", _pane(session)), _pane(session)
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while "TOP-EXITED" not in (screen := _pane(session)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "TOP-EXITED-0" in screen, screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _exported(text: str) -> set[str]:
    """Every sample name /metrics can yield: those present, and the suffixes of each family."""
    names: set[str] = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_every_dashboard_metric_is_exported(engine: Engine) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [a["expr"] for a in dashboard["annotations"]["list"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {m for q in queries for m in re.findall(r"\bsage:[A-Za-z0-9_:]+", q)}
    assert len(used) >= 15, used
    with engine.http() as c:
        exported = _exported(c.get("/metrics").text)
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
