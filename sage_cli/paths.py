"""Where an engine's files live, and which engine a command talks to.

    $SAGE_HOME                      default ~/.sage
    ├── run/<name>.sock             the control socket (mode 0600)
    ├── run/<name>.pid              the engine's pid, next to the socket
    └── logs/<name>/
        ├── engine.log              stdout and stderr of a detached engine
        └── evictions.jsonl         eviction events, one JSON object a line

A command finds its engine from, first to last: ``--socket PATH``, ``--name NAME``,
``$SAGE_SOCKET``, ``$SAGE_NAME``, then the name ``default``.

`engine_adapter.paths` is the engine side's definition of the same (the engine may not import this
package, nor may the light commands import the engine); tests/test_engine_config.py checks that the
two agree.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "DEFAULT_NAME",
    "engine_log_path",
    "eviction_log_path",
    "log_dir",
    "pid_path",
    "resolve_name",
    "resolve_socket",
    "run_dir",
    "sage_home",
    "socket_path",
    "validate_name",
]

DEFAULT_NAME = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def sage_home() -> Path:
    """``$SAGE_HOME``, or ``~/.sage``."""
    home = os.environ.get("SAGE_HOME")
    return Path(home).expanduser() if home else Path.home() / ".sage"


def validate_name(name: str) -> str:
    """An engine name: letters, digits, ``.``, ``_``, ``-``; it becomes a file name.

    Raises:
        ValueError: The name could not be a file name; the message names it.
    """
    if not _NAME.match(name):
        raise ValueError(
            f"engine name {name!r} is not valid: use up to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def run_dir() -> Path:
    return sage_home() / "run"


def socket_path(name: str = DEFAULT_NAME) -> Path:
    """The default control socket of the engine called `name`."""
    return run_dir() / f"{validate_name(name)}.sock"


def pid_path(socket: Path) -> Path:
    """The pid file the engine writes next to its socket: ``<dir>/<stem>.pid``."""
    return socket.with_name(f"{socket.stem}.pid")


def log_dir(name: str = DEFAULT_NAME) -> Path:
    return sage_home() / "logs" / validate_name(name)


def eviction_log_path(name: str = DEFAULT_NAME) -> Path:
    return log_dir(name) / "evictions.jsonl"


def engine_log_path(name: str = DEFAULT_NAME) -> Path:
    return log_dir(name) / "engine.log"


def resolve_name(name: str | None) -> str:
    """``--name``, else ``$SAGE_NAME``, else ``default``.

    Raises:
        ValueError: The name is not valid.
    """
    return validate_name(name or os.environ.get("SAGE_NAME") or DEFAULT_NAME)


def resolve_socket(socket: Path | None = None, name: str | None = None) -> Path:
    """The socket a command talks to: ``--socket``, ``--name``, ``$SAGE_SOCKET``, ``$SAGE_NAME``.

    Args:
        socket: The ``--socket`` flag.
        name: The ``--name`` flag.

    Raises:
        ValueError: Both flags were given, or the name is not valid.
    """
    if socket is not None and name is not None:
        raise ValueError("give either --socket or --name, not both")
    if socket is not None:
        return socket.expanduser()
    if name is not None:
        return socket_path(validate_name(name))
    env_socket = os.environ.get("SAGE_SOCKET")
    if env_socket:
        return Path(env_socket).expanduser()
    return socket_path(resolve_name(None))
