"""The root app ``sage``, its group ``llm``, and ``main()``, the console script's entry point.

``main()`` runs the Click command that Typer builds without Click's own error handling, so
that every failure goes through `sage_cli.errors`: one line on stderr and an exit code.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated

import typer
from typer.core import TyperGroup

from sage_cli import __version__, engine, eviction
from sage_cli.benchmark.command import benchmark
from sage_cli.benchmark.options import BENCHMARK_PANELS
from sage_cli.help_panels import panelled

__all__ = ["app", "build_command", "llm_app", "main"]

app = typer.Typer(
    name="sage",
    help="KV-cache eviction for LLM serving: run an engine, watch and swap its eviction policy, "
    "benchmark policies.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

llm_app = typer.Typer(
    name="llm",
    help="LLM serving: the engine, its eviction policy, and policy benchmarks.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
llm_app.add_typer(engine.app, name="engine")
llm_app.add_typer(eviction.app, name="eviction")
llm_app.command("benchmark", cls=panelled("Benchmark", BENCHMARK_PANELS))(benchmark)
app.add_typer(llm_app, name="llm")


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"sage {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """KV-cache eviction for LLM serving: run an engine, watch and swap its eviction policy,
    benchmark policies."""


def build_command() -> TyperGroup:
    """The Click command tree of ``sage`` (the docs generator walks it too)."""
    from sage_cli._params import install_plain_conversion

    command = typer.main.get_command(app)
    if not isinstance(command, TyperGroup):
        raise TypeError(f"the root of sage is a {type(command).__name__}, not a group")
    install_plain_conversion(command)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sage`` with `argv` (default: ``sys.argv[1:]``); the exit code."""
    from sage_cli.errors import EXIT_INTERRUPTED, report

    command = build_command()
    try:
        result = command.main(
            args=list(argv) if argv is not None else None, prog_name="sage", standalone_mode=False
        )
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return EXIT_INTERRUPTED
    except (Exception, KeyboardInterrupt) as exc:  # the one place that reports every failure
        return report(exc)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


if __name__ == "__main__":
    raise SystemExit(main())
