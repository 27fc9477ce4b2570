"""`benchmarks/peers.py` without the peers' venvs: its figures, its ratio table, its token
counts over real HTTP streams, and the cleanup of every engine process group it starts.

The engines here are a real subprocess: a small OpenAI-shaped HTTP server (standard library)
that answers with a recorded completion stream and starts a child of its own, so the test sees
whether a whole process group is stopped, not just its leader. The last test runs the benchmark
against a real sage engine process alone (``--peers none``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sage_cli.benchmark.replay import EngineRun, latency_figures

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"

# An OpenAI-shaped server on 127.0.0.1:PORT: /v1/models, /v1/completions streaming RECORDED
# (every chunk after the first carries two tokens; the usage chunk only with USAGE=1), and
# llama-cpp-python's /extras/tokenize/count (a token per word). It writes its pid and its
# child's into PIDS before it listens; a FAIL=1 server exits at once after starting the child.
DUMMY = r"""
import http.server, json, os, subprocess, sys, time
port, pids, usage, fail = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(pids, "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
if fail:
    sys.exit(3)
RECORDED = [
    {"choices": [{"index": 0, "text": "alpha", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": " beta gamma", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": " delta epsilon", "finish_reason": "length"}]},
]
USAGE = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}}

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _json(self, value):
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._json({"data": [{"id": "smollm2-135m"}]})
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/extras/tokenize/count":
            return self._json({"count": len(request["input"].split())})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for chunk in RECORDED + ([USAGE] if usage else []):
            time.sleep(0.01)
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def peers() -> Any:
    spec = importlib.util.spec_from_file_location("peers_under_test", PEERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie awaiting its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _dummy_spec(peers: Any, tmp_path: Path, *, usage: bool, fail: bool = False) -> tuple[Any, Path]:
    script = tmp_path / "dummy_server.py"
    script.write_text(DUMMY)
    pids = tmp_path / f"pids-{usage}-{fail}"
    port = peers.free_port()
    command = [sys.executable, str(script), str(port), str(pids), "1" if usage else "0", "1" if fail else "0"]
    spec = peers.ServerSpec(
        "dummy", command, dict(os.environ), port, tokens_from="usage" if usage else "tokenizer"
    )
    return spec, pids


def _pids(path: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the dummy server never wrote its pids"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def test_percentiles_of_ttft_and_tpot_interpolate_between_requests() -> None:
    runs = []
    for i in range(1, 6):  # TTFT 0.1 .. 0.5 s; 11 tokens whose last comes i s after the first
        run = EngineRun(ok=True, ttft_s=i / 10, last_token_s=i / 10 + i)
        run.count_tokens(11)
        runs.append(run)
    runs.append(EngineRun(error="HTTP 500"))  # a failure counts in neither figure
    figures = latency_figures(runs, wall=2.0)
    assert (figures["requests"], figures["failed"], figures["output_tokens"]) == (6, 1, 55)
    assert figures["ttft_p50_s"] == pytest.approx(0.3)
    assert figures["ttft_p99_s"] == pytest.approx(0.4 + 0.96 * 0.1)
    assert figures["tpot_p50_s"] == pytest.approx(0.3)  # 3 s over the 10 tokens after the first
    assert figures["tpot_p99_s"] == pytest.approx(0.4 + 0.96 * 0.1)
    assert figures["throughput_tok_s"] == pytest.approx(27.5)


def test_the_ratio_is_sages_tokens_per_second_over_each_peers_at_the_same_concurrency(peers: Any) -> None:
    def row(engine: str, level: int, tok_s: float) -> dict[str, Any]:
        return {
            "engine": engine, "concurrency": level, "throughput_tok_s": tok_s, "failed": 0,
            "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "tpot_p50_s": 0.01, "tpot_p99_s": 0.02,
        }  # fmt: skip

    rows = peers.ratio_rows(
        [
            row("sage", 1, 60.0), row("sage", 8, 120.0),
            row("vllm", 1, 40.0), row("vllm", 8, 160.0), row("vllm", 32, 200.0),
            {"engine": "llamacpp", "error": "StartError: no llamacpp venv"},
        ]
    )  # fmt: skip
    ratios = {(r["engine"], r.get("concurrency")): r["sage_ratio"] for r in rows}
    assert ratios[("sage", 1)] == 1.0
    assert ratios[("vllm", 1)] == pytest.approx(1.5)
    assert ratios[("vllm", 8)] == pytest.approx(0.75)
    assert ratios[("vllm", 32)] is None  # sage has no row at 32: no ratio
    assert ratios[("llamacpp", None)] is None
    text = peers.table(rows)
    assert "| vllm | 1 | 100.0 / 200.0 | 10.0 / 20.0 | 40.0 | 1.50x |" in text
    assert "| vllm | 8 | 100.0 / 200.0 | 10.0 / 20.0 | 160.0 | 0.75x |" in text
    assert "| llamacpp | - | could not start: StartError: no llamacpp venv |" in text


@pytest.mark.parametrize("usage", [True, False], ids=["usage", "tokenizer"])
def test_a_level_counts_tokens_from_usage_or_the_tokenizer_never_chunks(
    peers: Any, tmp_path: Path, usage: bool
) -> None:
    spec, pids = _dummy_spec(peers, tmp_path, usage=usage)
    args = peers.parse_args(
        ["--concurrency", "1,3", "--rounds", "2", "--min-requests", "1", "--max-tokens", "5"]
    )
    rows = peers.measure(spec, args, tmp_path)
    assert [r["concurrency"] for r in rows] == [1, 3]
    for row in rows:
        assert row["failed"] == 0 and row["requests"] == 2 * row["concurrency"]
        # 3 text chunks a request; 5 tokens by usage, 5 words by the tokenizer
        assert row["tokens_per_request"] == 5 and row["output_tokens"] == 5 * row["requests"]
        assert row["tokens_from"] == ("usage" if usage else "tokenizer")
        assert row["tpot_p50_s"] > 0 and row["ttft_p50_s"] > 0
    assert not any(_alive(pid) for pid in _pids(pids))  # the server and its child stopped


def test_a_usage_engine_whose_stream_has_no_usage_fails_its_requests(peers: Any, tmp_path: Path) -> None:
    spec, _ = _dummy_spec(peers, tmp_path, usage=False)
    spec.tokens_from = "usage"  # an engine that should send usage but does not: nothing to count
    args = peers.parse_args(
        ["--concurrency", "2", "--rounds", "1", "--min-requests", "1", "--max-tokens", "5"]
    )
    (row,) = peers.measure(spec, args, tmp_path)
    assert row["failed"] == 2 and row["output_tokens"] == 0
    assert row["errors"] == ["the stream carried no usage (stream_options.include_usage)"]


def test_a_peer_that_exits_while_starting_is_a_row_and_leaves_no_process(peers: Any, tmp_path: Path) -> None:
    spec, pids = _dummy_spec(peers, tmp_path, usage=True, fail=True)
    args = peers.parse_args(["--concurrency", "1", "--start-timeout", "30"])
    (row,) = peers.measure(spec, args, tmp_path)
    assert row["engine"] == "dummy" and "exited with code 3 while starting" in row["error"]
    leader, child = _pids(pids)
    assert not _alive(leader) and not _alive(child)  # the child outlived its parent: killed with the group


def test_a_peer_that_never_answers_is_stopped_at_the_timeout(peers: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "silent.pid"
    code = f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(600)"  # noqa: E501
    spec = peers.ServerSpec("silent", [sys.executable, "-c", code], dict(os.environ), peers.free_port())
    args = peers.parse_args(["--concurrency", "1", "--start-timeout", "3"])
    (row,) = peers.measure(spec, args, tmp_path)
    assert "did not answer within 3 s" in row["error"]
    assert not any(_alive(pid) for pid in _pids(pid_file))


def test_a_missing_peer_venv_is_a_row_saying_how_to_build_it(peers: Any, tmp_path: Path) -> None:
    args = peers.parse_args(["--llamacpp-python", str(tmp_path / "no-venv" / "python")])
    (row,) = peers.measure(peers.llamacpp_spec(args, tmp_path), args, tmp_path)
    assert "scripts/peer_venvs.sh llamacpp" in row["error"]


def test_bad_options_are_one_line_errors(peers: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--peers", "tgi"], ["--concurrency", "1,x"], ["--max-tokens", "1"]):
        with pytest.raises(SystemExit) as exit_:
            peers.parse_args(bad)
        assert exit_.value.code == 2
        assert "error:" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_benchmark_runs_against_a_real_sage_alone(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(PEERS.parents[1]), "SAGE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(PEERS), "--peers", "none", "--concurrency", "1,2", "--rounds", "1",
         "--min-requests", "1", "--max-tokens", "4", "--prompt-words", "8", "--json"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "cores" in result["machine"]
    rows = result["rows"]
    assert [(r["engine"], r["concurrency"]) for r in rows] == [("sage", 1), ("sage", 2)]
    for row in rows:
        assert row["failed"] == 0 and row["tokens_from"] == "usage" and row["sage_ratio"] == 1.0
        assert row["output_tokens"] == 4 * row["concurrency"]  # ignore_eos: every request its 4
        assert row["ttft_p50_s"] > 0 and row["tpot_p50_s"] > 0 and row["throughput_tok_s"] > 0
    log = Path(result["logs"]) / "sage.log"
    assert "smollm2-135m" in log.read_text()
    # the engine is gone: nothing listens on its socket's folder any more
    leftover = subprocess.run(["pgrep", "-f", result["logs"]], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == "", leftover.stdout
