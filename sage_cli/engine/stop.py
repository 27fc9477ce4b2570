"""``sage llm engine stop``: ask an engine to drain and exit, and wait until it is gone.

Gone is: its socket and pid file removed (``engine_adapter.paths.pid_path``, next to the socket),
or, for an engine reached with ``--url``, its port no longer answering. Files left by an engine
that died while draining are removed after a grace period.

Stopping is idempotent: with no engine running (no socket file, or a stale one nothing listens
on) it says so and exits 0, ``{"status": "not_running", ...}`` with ``--json``, so scripts can
stop before they start. A path that is not a socket, or an engine that cannot be reached for
another reason, is still an error.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine_adapter.paths import pid_path
from sage_cli.errors import CLITimeout
from sage_cli.options import ApiKeyOpt, JsonOpt, NameOpt, SocketOpt, UrlOpt, client_for
from sage_cli.output import Output

if TYPE_CHECKING:
    from sage_cli.client import ControlClient, EngineNotRunning

__all__ = ["stop"]

_POLL_S = 0.1


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_until_unreachable(client: ControlClient, health: dict[str, Any], timeout: float) -> None:
    """A remote engine is gone when its port stops answering (its files are not ours to see)."""
    from sage_cli.client import EngineUnavailable

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.close()
            client.health()
        except EngineUnavailable:
            return
        time.sleep(_POLL_S)
    raise CLITimeout(
        f"the engine (pid {health.get('pid', '?')}) at {client.address} did not exit within {timeout:g} s"
    )


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _not_running(out: Output, exc: EngineNotRunning, url: str | None) -> None:
    """Nothing to stop: say so (exit 0)."""
    where = {"url": url} if url is not None else {"socket": str(exc.socket)}
    stale = " (a stale socket file: the next start replaces it)" if exc.stale else ""
    result = {"status": "not_running", **where, "stale_socket": exc.stale}
    out.result(result, lambda: f"No engine running on {url or exc.socket}{stale}; nothing to stop")


def stop(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.0, metavar="SECONDS", help="How long to wait for the engine to exit."
        ),
    ] = 60.0,
    json_out: JsonOpt = False,
) -> None:
    """Stop a running engine: it finishes the requests in flight, then exits.

    Waits until the engine has removed its socket and pid file (with --url: until it stops
    answering). With no engine running it says so and exits 0.
    """
    from sage_cli.client import EngineNotRunning

    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        try:
            health = client.health()
        except EngineNotRunning as exc:
            _not_running(out, exc, url)
            return
        client.shutdown()
    if url is not None:
        _wait_until_unreachable(client, health, timeout)
        result = {"status": "stopped", "name": health.get("name"), "pid": health.get("pid"), "url": url}
        out.result(result, lambda: f"Engine {health.get('name', '?')!s} (pid {health.get('pid')}) stopped")
        return
    sock = client.socket
    pid_file = pid_path(sock)
    pid = health.get("pid") if isinstance(health.get("pid"), int) else _read_pid(pid_file)
    deadline = time.monotonic() + timeout
    dead_since: float | None = None
    while sock.exists() or pid_file.exists():
        now = time.monotonic()
        if pid is not None and not _pid_alive(pid):
            # Exited without cleaning up (killed while draining): after a grace period the
            # files are stale; remove them so the next start does not trip on them.
            dead_since = dead_since or now
            if now - dead_since > 1.0:
                for path in (sock, pid_file):
                    path.unlink(missing_ok=True)
                break
        if now > deadline:
            raise CLITimeout(
                f"the engine (pid {pid if pid is not None else '?'}) on {sock} did not exit within "
                f"{timeout:g} s; it may still be draining requests"
            )
        time.sleep(_POLL_S)
    result = {"status": "stopped", "name": health.get("name"), "pid": pid, "socket": str(sock)}
    out.result(result, lambda: f"Engine {health.get('name', '?')!s} (pid {pid}) stopped")
