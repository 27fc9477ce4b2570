"""Start an engine process in the background and wait until it answers: the one way the CLI does it.

`sage llm engine start --detach` and the temporary engines of `sage llm benchmark --mode engine`
both use `spawn_engine`. The engine runs ``python -m engine_adapter.serving.server`` in a session
of its own (a terminal's Ctrl-C does not reach it), its output goes to a log file whose handle the
parent closes at once, and `TemporaryEngine` removes its private folder when it stops.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage_cli.client import ControlClient, EngineTimeout, EngineUnavailable
from sage_cli.errors import CLIError, CLITimeout

__all__ = ["EngineProcess", "TemporaryEngine", "spawn_engine"]

POLL_S = 0.1


@dataclass
class EngineProcess:
    """A started engine: its process, the socket it answers on, its log and its health answer."""

    process: subprocess.Popen[bytes]
    socket: Path
    log_path: Path
    health: dict[str, Any]


def spawn_engine(
    config_json: str, *, socket: Path, log_path: Path, timeout: float, api_key: str = ""
) -> EngineProcess:
    """Start an engine with `config_json` (an `EngineConfig` as JSON) and wait for its health.

    `api_key` (of a TCP listener) goes to the engine in its environment, never on its command
    line, where any local user could read it.

    Raises:
        CLIError: The engine exited while starting; the message gives its last log line.
        CLITimeout: It did not answer within `timeout` seconds; the message gives the log.
    """
    # The log may carry prompts and tenants: the folder and the file are the user's alone.
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    socket.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with open(fd, "ab") as log:  # the child keeps its own copy of the descriptor
        offset = log.tell()
        process = subprocess.Popen(
            [sys.executable, "-m", "engine_adapter.serving.server", "--config-json", config_json],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, "SAGE_API_KEY": api_key} if api_key else None,
        )
    deadline = time.monotonic() + timeout
    with ControlClient(socket, timeout=2.0) as client:
        while True:
            code = process.poll()
            if code is not None:
                last = _log_tail(log_path, offset)
                why = f": {last}" if last else ""
                raise CLIError(f"the engine exited with code {code} while starting{why} (log: {log_path})")
            try:
                health = client.health()
                if health.get("pid") == process.pid:
                    return EngineProcess(process, socket, log_path, health)
            except (EngineUnavailable, EngineTimeout):
                client.close()  # not bound yet, or bound while the model loads: ask again
            if time.monotonic() > deadline:
                process.kill()
                raise CLITimeout(
                    f"the engine (pid {process.pid}) did not answer on {socket} within {timeout:g} s; "
                    f"see its log: {log_path}"
                )
            time.sleep(POLL_S)


class TemporaryEngine:
    """An engine on a private socket in a folder of its own, for one benchmark run.

    Args:
        config: `EngineConfig` fields; name, socket and log folder are set here.
        timeout: Seconds to wait for it to answer.
    """

    def __init__(self, config: dict[str, Any], timeout: float = 120.0) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sage-bench-", dir="/tmp"))
        self.socket = self.folder / "bench.sock"
        values = {"name": "bench", "socket": str(self.socket), "log_dir": str(self.folder / "logs"), **config}
        try:
            self.engine = spawn_engine(
                json.dumps(values), socket=self.socket, log_path=self.folder / "engine.log", timeout=timeout
            )
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def stop(self) -> None:
        """Shut the engine down (drained), or kill it when it does not answer; remove the folder."""
        process = self.engine.process
        try:
            with ControlClient(self.socket, timeout=5.0) as client:
                client.shutdown()
            process.wait(timeout=60)
        except Exception:
            process.kill()
            process.wait()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> TemporaryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _log_tail(path: Path, offset: int) -> str:
    """The last non-empty line the engine wrote to its log since `offset`."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
