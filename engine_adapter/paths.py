"""Where an engine's files live: the one definition of ``$SAGE_HOME``, engine names and their paths.

    $SAGE_HOME                      default ~/.sage
    ├── run/<name>.sock             the control socket (mode 0600)
    ├── run/<name>.pid              the engine's pid, next to the socket
    └── logs/<name>/
        ├── engine.log              stdout and stderr of a detached engine
        └── evictions.jsonl         eviction events, one JSON object a line

One function each: `sage_home`, `run_dir`, `default_socket`, `pid_path`, `default_log_dir`,
`engine_log_path`, `eviction_log_path`; `validate_name` says what may name an engine.

Standard library only, and the one module of `engine_adapter` that `sage_cli` imports on its
light commands (its own ``sage_cli/paths.py`` adds only which engine a command talks to); the
cache core and the serving config use it too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "DEFAULT_NAME",
    "ENGINE_NAME",
    "default_log_dir",
    "default_socket",
    "engine_log_path",
    "eviction_log_path",
    "is_engine_name",
    "pid_path",
    "run_dir",
    "sage_home",
    "validate_name",
]

DEFAULT_NAME = "default"
# An engine name becomes a file name: letters, digits, '.', '_', '-', at most 64, not hidden.
ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def sage_home() -> Path:
    """``$SAGE_HOME``, or ``~/.sage``."""
    home = os.environ.get("SAGE_HOME")
    return Path(home).expanduser() if home else Path.home() / ".sage"


def is_engine_name(name: str) -> bool:
    """Whether `name` can name an engine (and so a socket, a pid file and a log folder)."""
    return bool(ENGINE_NAME.match(name))


def validate_name(name: str) -> str:
    """`name`, when it can name an engine.

    Raises:
        ValueError: The name could not be a file name; the message names it.
    """
    if not is_engine_name(name):
        raise ValueError(
            f"engine name {name!r} is not valid: use up to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def run_dir() -> Path:
    """``$SAGE_HOME/run``: the sockets and pid files."""
    return sage_home() / "run"


def default_socket(name: str) -> Path:
    """``$SAGE_HOME/run/<name>.sock``: the control socket of the engine `name` unless it is given one."""
    return run_dir() / f"{name}.sock"


def pid_path(socket: Path) -> Path:
    """The pid file an engine writes next to its socket: ``<dir>/<stem>.pid``."""
    return socket.with_name(f"{socket.stem}.pid")


def default_log_dir(name: str) -> Path:
    """``$SAGE_HOME/logs/<name>``: the log folder of the engine `name` unless it is given one."""
    return sage_home() / "logs" / name


def engine_log_path(log_dir: Path) -> Path:
    """The output of a detached engine in its log folder."""
    return log_dir / "engine.log"


def eviction_log_path(log_dir: Path) -> Path:
    """The eviction events (``--log-evictions``) in an engine's log folder."""
    return log_dir / "evictions.jsonl"
