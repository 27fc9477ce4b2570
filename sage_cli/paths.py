"""Which engine a command talks to: the CLI's precedence over `engine_adapter.paths`.

A command finds its engine from, first to last: ``--socket PATH``, ``--name NAME``,
``$SAGE_SOCKET``, ``$SAGE_NAME``, then the name ``default``. Where the files of an engine live
(``$SAGE_HOME``, its socket, pid file and logs) is `engine_adapter.paths`, the one module of the
engine that the light commands import (standard library only).
"""

from __future__ import annotations

import os
from pathlib import Path

from engine_adapter.paths import DEFAULT_NAME, default_socket, validate_name

__all__ = ["resolve_name", "resolve_socket"]


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
        return default_socket(validate_name(name))
    env_socket = os.environ.get("SAGE_SOCKET")
    if env_socket:
        return Path(env_socket).expanduser()
    return default_socket(resolve_name(None))
