"""The one place that turns an exception into a one-line message on stderr and an exit code.

Exit codes::

    0    success
    1    the operation failed (the engine failed, an internal error, I/O)
    2    bad input: a usage error, a bad option value, config file or policy param, or a
         request the engine refused as bad (HTTP 400 or 422)
    3    no engine reachable on the socket (the message says how to start one)
    4    the engine did not answer, start or stop in time
    130  interrupted (Ctrl-C)

``SAGE_DEBUG=1`` prints the traceback before the message.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typer._click.exceptions import ClickException, UsageError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NO_ENGINE",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "CLIError",
    "CLITimeout",
    "CLIUsageError",
    "exit_code_for",
    "message_for",
    "report",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NO_ENGINE = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A failure a command reports to the user as is; `exit_code` says which kind."""

    exit_code = EXIT_FAILURE


class CLIUsageError(CLIError):
    """Bad input the command found itself (a file it cannot read, values that do not fit)."""

    exit_code = EXIT_USAGE


class CLITimeout(CLIError):
    """Something did not happen in time (an engine that does not come up or go away)."""

    exit_code = EXIT_TIMEOUT


def _debug() -> bool:
    return os.environ.get("SAGE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def _loaded_class(module: str, name: str) -> type[BaseException] | None:
    """A class from a module that is already imported: an exception cannot come from a module
    that was never imported, and importing it here would defeat the lazy imports."""
    found: Any = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _click_exception_types() -> tuple[type[ClickException], type[UsageError]]:
    from typer._click.exceptions import ClickException, UsageError

    return ClickException, UsageError


# Exceptions of the modules below the CLI, looked up by name: (module, class, exit code).
_KNOWN: tuple[tuple[str, str, int], ...] = (
    ("sage_cli.client", "EngineUnavailable", EXIT_NO_ENGINE),
    ("sage_cli.client", "EngineTimeout", EXIT_TIMEOUT),
    ("sage_cli.client", "SageClientError", EXIT_FAILURE),
    ("engine_adapter.serving.config", "ConfigError", EXIT_USAGE),
    ("sage_eviction.errors", "PolicyConfigError", EXIT_USAGE),
    ("engine_adapter.sim.benchmark", "BenchmarkError", EXIT_USAGE),
    ("engine_adapter.sim.sweep", "SweepError", EXIT_FAILURE),
)


def _classify(exc: BaseException) -> tuple[int, bool]:
    """The exit code, and whether the exception is a reported failure rather than a bug."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, True
    if isinstance(exc, CLIError):
        return exc.exit_code, True
    click_exc, _ = _click_exception_types()
    if isinstance(exc, click_exc):
        code: int = getattr(exc, "exit_code", EXIT_FAILURE)
        return code, True
    engine_error = _loaded_class("sage_cli.client", "EngineError")
    if engine_error is not None and isinstance(exc, engine_error):
        # The engine refused the request itself (an unknown policy, a bad param): bad input.
        return (EXIT_USAGE if getattr(exc, "status_code", None) in (400, 422) else EXIT_FAILURE), True
    for module, name, code in _KNOWN:
        cls = _loaded_class(module, name)
        if cls is not None and isinstance(exc, cls):
            return code, True
    return EXIT_FAILURE, isinstance(exc, OSError)


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception that reached the top of the app."""
    return _classify(exc)[0]


def message_for(exc: BaseException) -> str:
    """The one line that tells the user what went wrong."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    click_exc, usage_exc = _click_exception_types()
    if isinstance(exc, usage_exc):
        text = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            text += f" (see '{ctx.command_path} --help')"
        return " ".join(text.split())
    if isinstance(exc, click_exc):
        return " ".join(exc.format_message().split())
    if isinstance(exc, OSError) and not isinstance(exc, CLIError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    text = " ".join(str(exc).split())
    if not _classify(exc)[1]:
        return f"internal error: {type(exc).__name__}: {text} (SAGE_DEBUG=1 shows the traceback)"
    return text or type(exc).__name__


def report(exc: BaseException) -> int:
    """Print `exc` as one line on stderr (the traceback first under SAGE_DEBUG=1); its exit code."""
    if _debug():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    sys.stderr.write(f"Error: {message_for(exc)}\n")
    sys.stderr.flush()
    return exit_code_for(exc)
