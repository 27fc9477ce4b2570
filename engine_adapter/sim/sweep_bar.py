"""The simulator benchmark's progress bar: Rich on stderr over every row's requests, drawn only
when stderr is a terminal and only when told (no refresh thread, so workers can be forked)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine_adapter.sim.sweep import RowSpec

__all__ = ["SweepBar", "sweep_progress"]


class SweepBar:
    """A Rich progress bar on stderr over every row's requests, whichever executor runs them
    (`sweep.RowProgress`); nothing when stderr is not a terminal.

    It redraws only when told (no refresh thread), so that worker processes can be forked while
    it is shown: rows run here tick it per request; rows in workers or on Ray complete it a row
    at a time, and the executor redraws it while it waits.
    """

    def __init__(self, progress: Any, rows: int, n_requests: int, where: str) -> None:
        self._progress = progress
        self._n_requests = n_requests
        self._done_rows = 0
        self._task = progress.add_task(f"simulating {rows} rows{where}", total=rows * n_requests)

    def started(self, spec: RowSpec) -> None:
        self._progress.update(self._task, description=spec.label, refresh=True)

    def requests_done(self, spec: RowSpec, done: int) -> None:
        completed = self._done_rows * self._n_requests + done
        self._progress.update(self._task, completed=completed, refresh=True)

    def finished(self, spec: RowSpec) -> None:
        self._done_rows += 1
        self._progress.update(self._task, completed=self._done_rows * self._n_requests, refresh=True)

    def refresh(self) -> None:
        self._progress.refresh()


@contextmanager
def sweep_progress() -> Iterator[Any]:
    """A Rich progress on stderr without a refresh thread (nothing when stderr is not a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        auto_refresh=False,
        disable=not console.is_terminal,
    ) as progress:
        yield progress
