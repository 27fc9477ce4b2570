"""The HTTP limits and the TCP listener of a real engine process, started by the real CLI.

Slow or malformed clients (half headers, a trickling body, ``Content-Length: abc``, too many
connections, a body over the limit) get a JSON 4xx/503 and are closed, and a normal request still
succeeds afterwards; over TCP every request but ``/health`` needs the API key, which never
appears on the engine's command line; TLS serves the same API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
API_KEY = "k" * 8 + "-test-key-0123456789"
LIMITS = {
    "SAGE_HEADER_TIMEOUT": "1",
    "SAGE_BODY_TIMEOUT": "1",
    "SAGE_KEEP_ALIVE_TIMEOUT": "1",
    "SAGE_MAX_CONNECTIONS": "16",
    "SAGE_MAX_BODY_BYTES": "4096",
}

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Engine:
    folder: Path
    socket: Path
    port: int
    env: dict[str, str]
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def sage(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sage_cli.app", *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )

    def unix(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://sage")

    def raw(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(10)
        conn.connect(str(self.socket))
        return conn


def start_engine(*extra: str, scheme: str = "http", env_extra: dict[str, str] | None = None) -> Engine:
    folder = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO), **LIMITS, **(env_extra or {}))
    engine = Engine(folder, folder / "e.sock", free_port(), env, scheme)
    args = ["llm", "engine", "start", "sage-tiny", "--num-blocks", "64", "--device", "cpu", "--detach"]
    args += ["--socket", str(engine.socket), "--host", "127.0.0.1", "--port", str(engine.port), *extra]
    result = engine.sage(*args)
    assert result.returncode == 0, result.stderr
    return engine


def stop_engine(engine: Engine) -> None:
    stopped = engine.sage("llm", "engine", "stop", "--socket", str(engine.socket))
    pid_file = engine.socket.with_name("e.pid")
    if stopped.returncode != 0 and pid_file.exists():  # a failed test may have left it unreachable
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(engine.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    # The key comes from the environment, as a user would keep it out of shell history.
    started = start_engine(env_extra={"SAGE_API_KEY": API_KEY})
    yield started
    stop_engine(started)


def read_answer(conn: socket.socket) -> tuple[int, dict[str, object]]:
    """Status and JSON body of the one answer on `conn`, read until the server closes it."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


def assert_still_serves(engine: Engine) -> None:
    with engine.unix() as client:
        answer = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=60)
    assert answer.status_code == 200, answer.text


# -- malformed and slow clients -----------------------------------------------------------------


def test_a_bad_content_length_gets_a_json_400(engine: Engine) -> None:
    # Regression: uvicorn answered a plain-text 400.
    with engine.raw() as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: sage\r\nContent-Length: abc\r\n\r\n{}")
        status, body = read_answer(conn)
    assert status == 400
    assert body["error"]["type"] == "invalid_request"  # type: ignore[index]
    assert_still_serves(engine)


def test_half_sent_headers_get_a_408_and_are_closed(engine: Engine) -> None:
    started = time.monotonic()
    with engine.raw() as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: sa")
        status, body = read_answer(conn)
    assert status == 408 and "headers" in body["error"]["message"]  # type: ignore[index]
    assert time.monotonic() - started < 8  # the 1 s deadline, with room for a loaded machine


def test_a_trickling_body_gets_a_408(engine: Engine) -> None:
    with engine.raw() as conn:
        conn.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: sage\r\nContent-Length: 100\r\n\r\n{"pro')
        status, body = read_answer(conn)
    assert status == 408 and "body" in body["error"]["message"]  # type: ignore[index]
    assert_still_serves(engine)


def test_a_body_over_the_limit_is_refused_before_it_is_read(engine: Engine) -> None:
    big = json.dumps({"prompt": "x" * 10_000, "max_tokens": 1})
    with engine.unix() as client:
        declared = client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        chunked = client.post("/v1/completions", content=iter([big[:3000].encode(), big[3000:].encode()]))
    for answer in (declared, chunked):
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["type"] == "request_too_large"


def test_slow_clients_cannot_starve_the_engine(engine: Engine) -> None:
    # Regression: 200 half-open connections were never closed and, with the file limit, made
    # normal requests time out. Over the connection cap a client gets a JSON 503 at once; the
    # slow ones are closed at their header deadline, and then everyone is served again.
    slow = []
    for _ in range(16):
        conn = engine.raw()
        conn.sendall(b"GET /health HTTP/1.1\r\n")
        slow.append(conn)
    with engine.raw() as extra:
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: sage\r\n\r\n")
        status, body = read_answer(extra)
    assert status == 503 and body["error"]["type"] == "unavailable"
    for conn in slow:
        assert read_answer(conn)[0] == 408
        conn.close()
    assert_still_serves(engine)


# -- TCP and the API key ------------------------------------------------------------------------


def test_tcp_needs_the_key_except_for_health(engine: Engine) -> None:
    with httpx.Client(base_url=engine.url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}):
            answer = client.get("/v1/eviction/stats", headers=headers)
            assert answer.status_code == 401, headers
            assert answer.json()["error"]["type"] == "unauthorized"
        good = client.get("/v1/eviction/stats", headers={"Authorization": f"Bearer {API_KEY}"})
    assert good.status_code == 200 and "hit_rate" in good.json()


def test_the_key_is_not_on_the_engines_command_line(engine: Engine) -> None:
    with engine.unix() as client:
        pid = client.get("/health").json()["pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert API_KEY.encode() not in cmdline


def test_the_cli_reaches_a_tcp_engine_with_url_and_key(engine: Engine) -> None:
    result = engine.sage("llm", "eviction", "stats", "--url", engine.url, "--api-key", API_KEY, "--json")
    assert result.returncode == 0, result.stderr
    assert "hit_rate" in json.loads(result.stdout)
    env = {k: v for k, v in engine.env.items() if k != "SAGE_API_KEY"}
    refused = engine.sage("llm", "eviction", "stats", "--url", engine.url, env=env)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "API key" in lines[0], refused.stderr


def test_tcp_without_a_key_is_refused_unless_waived() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sg-", dir="/tmp"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
        env.update(SAGE_HOME=str(folder), PYTHONPATH=str(REPO))
        args = ["llm", "engine", "start", "sage-tiny", "--host", "127.0.0.1", "--port", str(free_port())]
        result = subprocess.run(
            [sys.executable, "-m", "sage_cli.app", *args], env=env, capture_output=True, text=True, cwd=REPO
        )
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "without an API key" in result.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_tls_serves_the_same_api() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sg-tls-", dir="/tmp"))
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    engine = start_engine(
        "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), scheme="https",
        env_extra={"SAGE_API_KEY": API_KEY, "SAGE_CA_FILE": str(cert)},
    )  # fmt: skip
    try:
        with httpx.Client(base_url=engine.url, verify=False, timeout=30) as client:
            answer = client.get("/v1/engine", headers={"Authorization": f"Bearer {API_KEY}"})
        assert answer.status_code == 200 and answer.json()["model"] == "sage-tiny"
        result = engine.sage("llm", "engine", "status", "--url", engine.url, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["model"] == "sage-tiny"
        assert_still_serves(engine)
    finally:
        stop_engine(engine)
        shutil.rmtree(folder, ignore_errors=True)
