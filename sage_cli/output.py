"""The one output sink: text or a Rich table for people, JSON with ``--json``.

Commands build their result as the JSON-able object the engine returned (or a dict of their
own) and a function that renders it for people; `Output` picks one. Rich is imported only
when a table is printed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = ["WIDE_COLUMNS", "Output", "dump_json", "format_cell"]

WIDE_COLUMNS = 160
"""The width of a wide result (a benchmark's table) written to a file or a pipe."""


def dump_json(payload: Any, *, compact: bool = False) -> str:
    """JSON as the CLI prints it: UTF-8, keys in the engine's order, indented unless `compact`."""
    if compact:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(payload, ensure_ascii=False, indent=2)


def format_cell(value: Any, kind: str) -> str:
    """One cell of a benchmark table: `kind` is "yesno", "text", "percent0" (a fraction as a
    whole percentage), "percent" (to a tenth), "ratio" (two decimals), "int" (rounded), or
    anything else for three significant digits. None is "-"; a value that is no number, as is."""
    if kind == "yesno":
        return "yes" if value else "no"
    if value is None:
        return "-"
    if kind == "text" or isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if kind == "percent0":
        return f"{value * 100:.0f}%"
    if kind == "percent":
        return f"{value * 100:.1f}%"
    if kind == "ratio":
        return f"{value:.2f}"
    if kind == "int":
        return f"{value:.0f}"
    return f"{value:.3g}"


class Output:
    """Where a command's result goes.

    Args:
        json_mode: Print JSON instead of text.
        stream: Defaults to ``sys.stdout`` (looked up when writing, so tests can swap it).
    """

    def __init__(self, json_mode: bool = False, stream: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self._stream = stream
        self._console: Console | None = None

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    @property
    def console(self) -> Console:
        """A Rich console on the same stream, no markup or highlighting of engine strings."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False, markup=False)
        return self._console

    def is_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def result(self, payload: Any, render: Callable[[], str | RenderableType], *, wide: bool = False) -> None:
        """Print one result: `payload` as JSON, or what `render` makes of it.

        `wide`: a table as wide as its columns need (up to `WIDE_COLUMNS`) when the stream is not
        a terminal (a file, a pipe), where Rich would otherwise squeeze it into 80 columns and
        cut its cells; on a terminal, the terminal's width.
        """
        if self.json_mode:
            self.write(dump_json(payload))
            return
        rendered = render()
        if isinstance(rendered, str):
            self.write(rendered)
        elif wide and not self.is_terminal():
            from rich.console import Console

            Console(file=self.stream, highlight=False, markup=False, width=WIDE_COLUMNS).print(rendered)
        else:
            self.console.print(rendered)

    def item(self, payload: Any, render: Callable[[], str]) -> None:
        """Print one item of a stream: a compact JSON line (NDJSON), or one rendered line."""
        self.write(dump_json(payload, compact=True) if self.json_mode else render())
        self.stream.flush()

    def write(self, text: str) -> None:
        """Plain text (never parsed as Rich markup), with a final newline."""
        self.stream.write(text if text.endswith("\n") else text + "\n")

    @staticmethod
    def note(text: str) -> None:
        """A message for the user that is not the result: on stderr, so stdout stays parseable."""
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
