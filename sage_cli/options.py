"""Options shared by the commands, as `Annotated` aliases, and the helpers that read them.

def stats(socket: SocketOpt = None, name: NameOpt = None, json_out: JsonOpt = False): ...

A command whose options are declared elsewhere (the fields of a record, the rows of a table)
takes ``**options`` and gets them as its parameters from `with_parameters`: ``sage llm
benchmark`` from `BenchmarkArgs` (`record_parameters`), ``sage llm engine start`` from the
config's keys.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from sage_cli.errors import CLIUsageError

if TYPE_CHECKING:
    from sage_cli.client import ControlClient

__all__ = [
    "JsonOpt",
    "NameOpt",
    "ParamOpt",
    "OldPolicyOpt",
    "PolicyOpt",
    "PreemptionOrderOpt",
    "SocketOpt",
    "UrlOpt",
    "ApiKeyOpt",
    "client_for",
    "parse_params",
    "record_parameters",
    "start_hint",
    "with_parameters",
]

Command = TypeVar("Command", bound=Callable[..., Any])

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
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        metavar="URL",
        envvar="SAGE_URL",
        help="Reach an engine over TCP at http(s)://HOST:PORT instead of its socket ($SAGE_URL).",
        show_default=False,
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        metavar="KEY",
        envvar="SAGE_API_KEY",
        help="API key of an engine reached with --url ($SAGE_API_KEY).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
PolicyOpt = Annotated[
    str | None,
    typer.Argument(
        metavar="NAME",
        help="Eviction policy, e.g. lru, lfu, arc (see 'sage llm eviction policies').",
        show_default=False,
    ),
]
OldPolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        "-p",
        metavar="NAME",
        help="Deprecated: give NAME as the argument, as set-token-policy takes its SPEC "
        "(--policy is accepted, with a warning, until the next release).",
        show_default=False,
    ),
]
PreemptionOrderOpt = Annotated[
    str,
    typer.Option(
        "--preemption-order",
        metavar="NAME",
        help="Which running request the scheduler preempts first when the pool is short: 'policy' "
        "(each policy's own order) or a named order: lru, mru, fifo, filo, lfu, priority, seen_once_first, "
        "s3fifo, gdsf, predictive, slo (sage_eviction.preemption; a plugin may add more).",
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


def client_for(
    socket: Path | None,
    name: str | None,
    *,
    timeout: float | None = None,
    url: str | None = None,
    api_key: str | None = None,
) -> ControlClient:
    """A control client for the engine that ``--socket``/``--name`` (or the environment) name,
    or for the TCP engine at ``--url`` (with ``--api-key``; ``$SAGE_CA_FILE`` trusts a private CA).
    """
    import os

    from sage_cli.client import DEFAULT_TIMEOUT_S, ControlClient
    from sage_cli.paths import resolve_socket

    if url is not None:
        if socket is not None:
            raise CLIUsageError("--url and --socket are exclusive: reach the engine one way")
        if not re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", url):
            raise CLIUsageError(f"--url {url!r} is not http(s)://HOST:PORT")
    try:
        path = resolve_socket(socket, name)
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    return ControlClient(
        path,
        timeout=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
        start_hint=start_hint(socket, name),
        url=url,
        api_key=api_key,
        ca_file=os.environ.get("SAGE_CA_FILE") or None,
    )


def record_parameters(record: type) -> list[inspect.Parameter]:
    """The fields of the dataclass `record` as keyword parameters, with their annotations (the
    `Annotated` options) and defaults."""
    hints = typing.get_type_hints(record, include_extras=True)
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(f.name, keyword, default=f.default, annotation=hints[f.name])
        for f in dataclasses.fields(record)
    ]


def with_parameters(parameters: Iterable[inspect.Parameter]) -> Callable[[Command], Command]:
    """Give a command that takes ``**options`` these parameters, which Typer reads as its options
    and arguments (in this order), so that options declared elsewhere are declared once."""
    signature = inspect.Signature(list(parameters))

    def decorate(command: Command) -> Command:
        command.__signature__ = signature  # type: ignore[attr-defined]
        return command

    return decorate
