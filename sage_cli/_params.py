"""Plain conversion of option values, so that a command does not import pydantic.

Typer (0.2x) converts every non-flag value through a pydantic ``TypeAdapter``: importing
pydantic and building the adapters costs about 0.1 s of CPU per run, a third of the cold start of
``sage llm eviction stats`` (target: <= 0.4 s in a new process, docs/architecture.md, "Targets").
The options of ``sage`` are plain ``str``, ``int``, ``float``, ``Path`` or ``list[str]``; this
module converts those itself, with Click's messages, and leaves every other parameter to Typer. It
relies on Typer's per-parameter hook ``_runtime_param``; if a Typer release drops it, nothing is
installed and Typer converts as usual (slower, same results).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

__all__ = ["install_plain_conversion"]

_SIMPLE = (str, int, float, bool, Path)
_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")
_PATH_SETTINGS_DEFAULT = {"writable": False, "readable": True, "allow_dash": False, "path_type": None}


def _describe_range(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"{low}<=x<={high}"
    return f"x>={low}" if low is not None else f"x<={high}"


def _is_simple(descriptor: Any) -> bool:
    annotation = descriptor.annotation
    info = descriptor.parameter_info
    if descriptor.is_file or descriptor.choices is not None or getattr(info, "parser", None) is not None:
        return False
    if descriptor.is_list:
        return typing.get_args(annotation) == (str,)
    if annotation is Path:
        return all(getattr(info, k, v) == v for k, v in _PATH_SETTINGS_DEFAULT.items())
    return annotation in _SIMPLE


def _plain_runtime_param_class() -> type:
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam

    class PlainRuntimeParam(RuntimeParam):
        """Converts ``str``, ``int``, ``float``, ``bool``, ``Path`` and ``list[str]`` without pydantic."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            annotation = self.annotation
            info = self.parameter_info
            if isinstance(value, list | tuple):
                return [str(item) for item in value]
            if annotation is str:
                return str(value)
            if annotation is bool:
                if isinstance(value, bool):
                    return value
                word = str(value).strip().lower()
                if word in _TRUE or word in _FALSE:
                    return word in _TRUE
                raise BadParameter(f"{value!r} is not a valid boolean.", ctx=ctx, param=param)
            if annotation is int or annotation is float:
                kind = "integer" if annotation is int else "float"
                try:
                    number = annotation(value) if not isinstance(value, bool) else None
                except (TypeError, ValueError):
                    number = None
                if number is None or (annotation is float and number != number):
                    raise BadParameter(f"{value!r} is not a valid {kind}.", ctx=ctx, param=param)
                low, high = info.min, info.max
                if (low is not None and number < low) or (high is not None and number > high):
                    if info.clamp:
                        return low if low is not None and number < low else high
                    raise BadParameter(
                        f"{value} is not in the range {_describe_range(low, high)}.", ctx=ctx, param=param
                    )
                return number
            path = Path(value)
            if info.resolve_path:
                path = path.resolve()
            if not path.exists():
                if info.exists:
                    raise BadParameter(f"Path {str(value)!r} does not exist.", ctx=ctx, param=param)
            elif not info.dir_okay and path.is_dir():
                raise BadParameter(f"Path {str(value)!r} is a directory.", ctx=ctx, param=param)
            elif not info.file_okay and not path.is_dir():
                raise BadParameter(f"Path {str(value)!r} is a file.", ctx=ctx, param=param)
            return path

    return PlainRuntimeParam


def _install(param: Any, plain: type) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or not hasattr(param, "_runtime_param"):
        return False
    try:
        if not _is_simple(descriptor):
            return False
        param._runtime_param = plain(
            parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
        )
    except (AttributeError, TypeError):
        return False
    return True


def install_plain_conversion(command: Any) -> int:
    """Give the plain converter to every simple parameter under `command`, the help options
    (made per context) included; how many parameters got it."""
    try:
        plain = _plain_runtime_param_class()
    except ImportError:
        return 0
    installed = 0
    stack = [command]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        installed += sum(_install(param, plain) for param in getattr(cmd, "params", []))
        original = getattr(cmd, "get_help_option", None)
        if original is not None:

            def get_help_option(ctx: Any, _original: Any = original) -> Any:
                option = _original(ctx)
                if option is not None:
                    _install(option, plain)
                return option

            cmd.get_help_option = get_help_option
    return installed
