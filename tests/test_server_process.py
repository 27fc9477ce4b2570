"""The engine server as a real process: ``python -m engine_adapter.serving.server`` on a temporary socket.

Talks HTTP over the Unix socket with httpx, as the CLI does: concurrent completions with shared
prefixes while the policy is hot-swapped, stats, logs (tail and follow), metrics, a second
server refused on a live socket, a stale socket replaced, and both ways of stopping (SIGTERM,
``POST /v1/engine/shutdown``) leaving no socket, no pid file and no process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow  # real processes or long searches: out of the quick loop

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
NUM_BLOCKS = 24
PREFIXES = [f"Tenant {t} system prompt: you answer briefly and politely, always. " for t in "ABCD"]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    socket: Path
    pid_file: Path
    home: Path
    stderr_path: Path

    def client(self, timeout: float = 60.0) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://sage", timeout=timeout)

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


_DIRS: list[Path] = []


def _short_dir() -> Path:
    # AF_UNIX paths hold ~107 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    _DIRS.append(path)
    return path


@pytest.fixture(scope="module", autouse=True)
def _remove_dirs() -> Iterator[None]:
    yield
    for path in _DIRS:
        shutil.rmtree(path, ignore_errors=True)


def _launch(home: Path, sock: Path, **config: Any) -> tuple[subprocess.Popen[bytes], Path]:
    values = {"socket": str(sock), "num_blocks": NUM_BLOCKS, "block_size": 16, "device": "cpu", **config}
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    stderr_path = home / f"stderr-{time.monotonic_ns()}.log"
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine_adapter.serving.server", "--config-json", json.dumps(values)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return proc, stderr_path


def _start(home: Path, sock: Path, **config: Any) -> Server:
    proc, stderr_path = _launch(home, sock, **config)
    server = Server(proc, sock, sock.with_name(f"{sock.stem}.pid"), home, stderr_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{server.stderr()}")
        if sock.exists():
            try:
                with server.client(timeout=5.0) as c:
                    if c.get("/health").status_code == 200:
                        return server
            except httpx.TransportError:
                pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"server did not answer within {START_TIMEOUT_S}s:\n{server.stderr()}")


def _assert_gone(server: Server) -> None:
    try:
        rc = server.proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        pytest.fail(f"server still running {STOP_TIMEOUT_S}s after being stopped:\n{server.stderr()}")
    assert rc == 0, server.stderr()
    assert not server.socket.exists(), "socket left behind"
    assert not server.pid_file.exists(), "pid file left behind"


def _stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


def _complete(c: httpx.Client, prompt: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    home = _short_dir()
    srv = _start(home, home / "e.sock", log_evictions=True)
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    _assert_gone(srv)


def _follow(srv: Server, want: int, out: list[dict[str, Any]], started: threading.Event) -> None:
    """Read `want` events from a follow stream (NDJSON), then hang up."""
    with srv.client() as c, c.stream("GET", "/v1/eviction/logs", params={"follow": "true", "tail": 0}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        started.set()
        for line in r.iter_lines():
            if line:
                out.append(json.loads(line))
            if len(out) >= want:
                return


def test_socket_and_pid_file(server: Server) -> None:
    mode = server.socket.lstat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert int(server.pid_file.read_text().strip()) == server.proc.pid
    with server.client() as c:
        info = c.get("/v1/engine").json()
    assert info["socket"] == str(server.socket) and info["pid"] == server.proc.pid
    assert info["num_blocks"] == NUM_BLOCKS


def test_concurrent_completions_survive_policy_swaps(server: Server) -> None:
    followed: list[dict[str, Any]] = []
    follow_started = threading.Event()
    follower = threading.Thread(target=_follow, args=(server, 5, followed, follow_started), daemon=True)
    follower.start()
    assert follow_started.wait(30)

    prompts = [f"{PREFIXES[i % 4]}Question {i}: what is {i} plus {i}?" for i in range(48)]
    swaps = ["arc", "s3fifo", "lfu", "sieve", "lru", "arc", "lru"]
    with server.client() as c, ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(_complete, c, p, 6, tenant=f"t{i % 4}") for i, p in enumerate(prompts)]
        answers = []
        for policy in swaps:
            r = c.put("/v1/eviction/policy", json={"policy": policy})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["new"]["name"] == policy
            assert 0 <= body["entries"] <= NUM_BLOCKS
            time.sleep(0.05)
        answers = [f.result(timeout=120) for f in futures]  # no request failed
    assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in answers)
    assert sum(a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers) > 0

    with server.client() as c:
        stats = c.get("/v1/eviction/stats").json()
        assert stats["total_evictions"] > 0 and stats["eviction_calls"] > 0
        assert stats["policy_swaps"] == len(swaps)
        assert sum(stats["evictions_by_reason"].values()) == stats["total_evictions"]
        # Quiet swaps: every cached block moves to the new policy, none is lost.
        _complete(c, PREFIXES[0] + "warm")
        for policy in ["arc", "s3fifo", "lfu", "lru"]:
            before = c.get("/v1/eviction/stats").json()["cached_blocks"]
            body = c.put("/v1/eviction/policy", json={"policy": policy}).json()
            after = c.get("/v1/eviction/stats").json()["cached_blocks"]
            assert before == body["entries"] == after, (policy, before, body, after)
        assert _complete(c, PREFIXES[0] + "warm")["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

        events = c.get("/v1/eviction/logs", params={"tail": 200}).json()["events"]
        assert {"evict", "freed"} <= {e["event"] for e in events}

        families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
        evicted = sum(s.value for s in families["sage:evictions"].samples if s.name == "sage:evictions_total")
        assert evicted == c.get("/v1/eviction/stats").json()["total_evictions"]
        swaps_total = next(
            s.value for s in families["sage:policy_swaps"].samples if s.name.endswith("_total")
        )
        assert swaps_total == len(swaps) + 4

    follower.join(30)
    assert not follower.is_alive()
    assert len(followed) >= 5 and {e["event"] for e in followed} <= {"evict", "freed"}


def test_a_client_that_hangs_up_mid_stream_aborts_its_request(server: Server) -> None:
    def aborted(c: httpx.Client) -> float:
        families = text_string_to_metric_families(c.get("/metrics").text)
        success = next(f for f in families if f.name == "sage:request_success")
        return sum(s.value for s in success.samples if s.labels.get("finish_reason") == "abort")

    with server.client() as c:
        before = aborted(c)
        body = {"prompt": "hang up on me", "max_tokens": 300, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            first = next(line for line in r.iter_lines() if line)
            assert first.startswith("data: {")
        deadline = time.monotonic() + 30
        while aborted(c) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert aborted(c) == before + 1
        assert c.get("/v1/engine").json()["requests"]["running"] == 0


def test_a_second_server_on_a_live_socket_refuses_to_start(server: Server) -> None:
    proc, stderr_path = _launch(server.home, server.socket)
    rc = proc.wait(timeout=STOP_TIMEOUT_S)
    assert rc != 0
    lines = [line for line in stderr_path.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and "already serving" in lines[0], lines
    with server.client() as c:  # the first one is untouched
        assert c.get("/health").json()["pid"] == server.proc.pid
    assert server.socket.exists() and int(server.pid_file.read_text()) == server.proc.pid


def test_sigterm_drains_and_leaves_nothing_behind() -> None:
    home = _short_dir()
    srv = _start(home, home / "t.sock", log_evictions=True)
    try:
        with srv.client() as c:
            for i in range(6):  # enough distinct prompts to evict on a 24-block pool
                _complete(c, f"{i} distinct prompt {i} " * 6, max_tokens=2)
        followed: list[dict[str, Any]] = []
        started = threading.Event()
        follower = threading.Thread(target=_follow, args=(srv, 10**6, followed, started), daemon=True)
        follower.start()
        assert started.wait(30)
        in_flight: list[dict[str, Any]] = []

        def long_request() -> None:
            with srv.client() as c:
                in_flight.append(_complete(c, "a request in flight at SIGTERM", max_tokens=150))

        worker = threading.Thread(target=long_request, daemon=True)
        worker.start()
        with srv.client() as c:  # SIGTERM once it runs
            deadline = time.monotonic() + 30
            while c.get("/v1/engine").json()["requests"]["running"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        srv.proc.send_signal(signal.SIGTERM)
        worker.join(STOP_TIMEOUT_S)
        _assert_gone(srv)
        assert in_flight, "the request in flight failed"
        assert in_flight[0]["choices"][0]["finish_reason"] in ("stop", "length")  # drained, not aborted
        follower.join(10)
        assert not follower.is_alive(), "the follow stream did not end with the engine"
        (log,) = (home / "logs").glob("*/evictions.jsonl")  # flushed on the way out
        lines = log.read_text().splitlines()
        assert any(json.loads(line)["event"] == "evict" for line in lines)
    finally:
        _stop(srv)


def test_a_stale_socket_is_replaced_and_the_shutdown_endpoint_stops_the_server() -> None:
    home = _short_dir()
    sock = home / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # a crash leaves the file behind: connect() is refused
    stale.close()
    assert sock.exists()
    srv = _start(home, sock)
    try:
        with srv.client() as c:
            assert c.get("/health").json()["pid"] == srv.proc.pid
            r = c.post("/v1/engine/shutdown")
            assert r.status_code == 200 and r.json() == {"status": "draining"}
        _assert_gone(srv)
    finally:
        _stop(srv)


def test_a_path_that_is_not_a_socket_is_never_replaced() -> None:
    home = _short_dir()
    path = home / "f.sock"
    path.write_text("precious")
    proc, stderr_path = _launch(home, path)
    assert proc.wait(timeout=STOP_TIMEOUT_S) != 0
    assert "not a socket" in stderr_path.read_text()
    assert path.read_text() == "precious"
