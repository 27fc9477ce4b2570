"""Options shared by the commands, as `Annotated` aliases, and the helpers that read them.

def stats(socket: SocketOpt = None, name: NameOpt = None, json_out: JsonOpt = False): ...
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sage_cli.errors import CLIUsageError

if TYPE_CHECKING:
    from sage_cli.client import ControlClient

__all__ = [
    "JsonOpt",
    "NameOpt",
    "ParamOpt",
    "PolicyOpt",
    "SocketOpt",
    "client_for",
    "parse_params",
    "start_hint",
]

SocketOpt = Annotated[
    Path | None,
    typer.Option(
        "--socket",
        metavar="PATH",
        help="Control socket of the engine (default: $SAGE_SOCKET, else $SAGE_HOME/run/<name>.sock).",
        show_default=False,
        dir_okay=False,
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        "-n",
        metavar="NAME",
        help="Name of the engine (default: $SAGE_NAME, else 'default'); picks its socket.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
PolicyOpt = Annotated[
    str,
    typer.Option(
        "--policy",
        "-p",
        metavar="NAME",
        help="Eviction policy, e.g. lru, lfu, arc (see 'sage llm eviction policies').",
    ),
]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        metavar="K=V",
        help="A policy param, e.g. --param protected_threshold=3; repeat for more.",
        show_default=False,
    ),
]


def parse_params(items: list[str] | None, flag: str = "--param") -> dict[str, str]:
    """``["k=v", ...]`` as a dict; values stay strings (the policy registry coerces them).

    Raises:
        CLIUsageError: An item is not of the form k=v, or a key repeats.
    """
    params: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CLIUsageError(f"{flag} {item!r} is not of the form k=v")
        if key in params:
            raise CLIUsageError(f"{flag} {key} is given twice")
        params[key] = value.strip()
    return params


def start_hint(socket: Path | None, name: str | None) -> str:
    """The command that starts the engine these flags point at."""
    if socket is not None:
        return f"sage llm engine start --socket {socket} --detach"
    if name is not None:
        return f"sage llm engine start --name {name} --detach"
    return "sage llm engine start --detach"


def client_for(socket: Path | None, name: str | None, *, timeout: float | None = None) -> ControlClient:
    """A control client for the engine that ``--socket``/``--name`` (or the environment) name."""
    from sage_cli.client import DEFAULT_TIMEOUT_S, ControlClient
    from sage_cli.paths import resolve_socket

    try:
        path = resolve_socket(socket, name)
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return ControlClient(
        path,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
        start_hint=start_hint(socket, name),
    )
