"""How a config key becomes an option (or the MODEL argument) of ``sage llm engine start``.

`ConfigFlag` is one row of the generated table `sage_cli.engine.start_options.START_OPTIONS`,
the CLI's copy of ``engine_adapter.serving.config.flags.START_FLAGS`` with each key's help;
`parameter` makes the Typer parameter of a row (None is its default: "not given", so that the
environment, the YAML file and the config's own defaults apply); `config_values` turns what the
command received back into config keys.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["ConfigFlag", "config_values", "parameter"]


@dataclass(frozen=True, slots=True)
class ConfigFlag:
    """One config key as ``sage llm engine start`` takes it.

    Attributes:
        key: The `EngineConfig` key it sets.
        param: The command's parameter name (``explain`` for ``explain_evictions``).
        decls: The option's names as Click declares them; empty for the argument.
        kind: argument, text, int, float, switch, file, dir or items (repeated K=V).
        help: The help, the shown default included.
        metavar: The value's name in the help.
        min: The smallest value Click accepts, for an int.
        max: The largest.
    """

    key: str
    param: str
    decls: tuple[str, ...]
    kind: str
    help: str
    metavar: str | None = None
    min: int | None = None
    max: int | None = None


# The value type of each kind; None is always "not given".
_TYPES: dict[str, Any] = {
    "argument": str | None,
    "text": str | None,
    "int": int | None,
    "float": float | None,
    "switch": bool | None,
    "file": Path | None,
    "dir": Path | None,
    "items": list[str] | None,
}


def parameter(flag: ConfigFlag) -> inspect.Parameter:
    """The keyword parameter whose `Annotated` type is the Typer option (or argument) of `flag`."""
    if flag.kind == "argument":
        info: Any = typer.Argument(metavar=flag.metavar, help=flag.help, show_default=False)
    else:
        bounds = {k: v for k, v in (("min", flag.min), ("max", flag.max)) if v is not None}
        paths = {"file": {"dir_okay": False}, "dir": {"file_okay": False}}.get(flag.kind, {})
        info = typer.Option(
            *flag.decls, help=flag.help, metavar=flag.metavar, show_default=False, **bounds, **paths
        )
    annotation = Annotated[_TYPES[flag.kind], info]
    return inspect.Parameter(flag.param, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def config_values(flags: tuple[ConfigFlag, ...], options: Mapping[str, Any]) -> dict[str, Any]:
    """The config keys the command received, keyed like `EngineConfig`; None is "not given" (an
    empty list of K=V items too)."""
    return {
        flag.key: (options[flag.param] or None) if flag.kind == "items" else options[flag.param]
        for flag in flags
    }
