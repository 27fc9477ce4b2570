"""The Azure LLM inference trace reader: `read_azure(path, prefix_model=PrefixModel())`.

The CSV has arrival times and lengths only (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`,
any order, other columns ignored), so a seeded `PrefixModel` supplies the prefix structure.
The file is streamed line by line (`engine_adapter.sim.trace_file`); a malformed row is a
one-line `WorkloadError` ``path:line: what is wrong``.

Pure Python and numpy; imports the workload records, the prefix model and the trace-file reader.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from engine_adapter.sim.prefix_model import PrefixModel, apply_prefix_model
from engine_adapter.sim.trace_file import TraceLines, WorkloadError, csv_rows, shown
from engine_adapter.sim.workloads import Workload, check_limit, sorted_by_arrival

__all__ = ["AZURE_COLUMNS", "read_azure"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns an Azure trace must have."""


_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)")


def _azure_time(stamp: str, days: dict[str, int]) -> tuple[int, float]:
    """Day ordinal and seconds into the day of a naive ``YYYY-MM-DD HH:MM:SS[.fffffff]``.

    Kept apart so that seconds since the trace start keep the trace's 100 ns resolution, which a
    float of seconds since year 1 would not.
    """
    match = _AZURE_TIME.fullmatch(stamp.strip())
    if match is None:
        raise ValueError
    day, hours, minutes, seconds = match.groups()
    ordinal = days.get(day)
    if ordinal is None:
        ordinal = days[day] = date.fromisoformat(day).toordinal()
    if int(hours) > 23 or int(minutes) > 59 or float(seconds) >= 61:
        raise ValueError
    return ordinal, int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _azure_columns(header: list[str] | None, path: str | Path) -> tuple[int, int, int, int]:
    """Indices of the TIMESTAMP, ContextTokens and GeneratedTokens columns, and the row width."""
    if header is None:
        raise WorkloadError(f"{path}: empty file, expected the header {','.join(AZURE_COLUMNS)}")
    columns = [name.strip() for name in header]
    missing = [name for name in AZURE_COLUMNS if name not in columns]
    if missing:
        raise WorkloadError(
            f"{path}:1: header lacks column(s) {', '.join(missing)} (found: {shown(', '.join(columns))})"
        )
    i_time, i_context, i_generated = (columns.index(name) for name in AZURE_COLUMNS)
    return i_time, i_context, i_generated, len(columns)


@dataclass(slots=True)
class _AzureRows:
    """The columns the reader keeps of an Azure trace, row by row."""

    stamps: list[tuple[int, float]] = field(default_factory=list)
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)


def _read_azure_rows(lines: TraceLines, path: str | Path, limit: int | None) -> _AzureRows:
    """Parse the rows of an Azure CSV as they stream by, up to `limit` of them."""
    reader = csv.reader(lines)
    rows = csv_rows(reader, path)
    i_time, i_context, i_generated, width = _azure_columns(next(rows, None), path)
    out = _AzureRows()
    days: dict[str, int] = {}
    for row in rows if limit != 0 else ():
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{path}:{reader.line_num}"
        if len(row) != width:
            raise WorkloadError(f"{where}: {len(row)} fields, the header has {width}")
        try:
            out.stamps.append(_azure_time(row[i_time], days))
        except ValueError:
            raise WorkloadError(f"{where}: bad TIMESTAMP {shown(row[i_time])}") from None
        for name, column, lens in (
            ("ContextTokens", i_context, out.input_lens),
            ("GeneratedTokens", i_generated, out.output_lens),
        ):
            try:
                value = int(row[column])
            except ValueError:
                raise WorkloadError(f"{where}: {name} must be an integer, got {shown(row[column])}") from None
            if value < 0:
                raise WorkloadError(f"{where}: {name} is negative ({value})")
            lens.append(value)
        if limit is not None and len(out.stamps) >= limit:
            break
    return out


def read_azure(
    path: str | Path, *, prefix_model: PrefixModel | None = None, limit: int | None = None
) -> Workload:
    """Read an Azure LLM inference trace (CSV) and give it prefixes from a `PrefixModel`.

    Columns (any order, others ignored): `TIMESTAMP` (``YYYY-MM-DD HH:MM:SS.fffffff``),
    `ContextTokens`, `GeneratedTokens`. Arrivals are seconds after the earliest timestamp.
    The file is read as a stream of lines (docs/architecture.md, "Simulator").

    Args:
        path: The `.csv` file.
        prefix_model: The prefix structure; `PrefixModel()` (seed 0) when omitted.
        limit: Read at most this many rows (in file order).

    Returns:
        The workload, sorted by arrival; `request_id` is the row's index in the file.

    Raises:
        WorkloadError: The file cannot be read or a row is malformed (``path:line: ...``).
    """
    check_limit(limit)
    model = prefix_model if prefix_model is not None else PrefixModel()
    with TraceLines(path) as lines:
        rows = _read_azure_rows(lines, path, limit)
        digest = lines.sha256()
    if not rows.stamps and limit != 0:
        raise WorkloadError(f"{path}: no rows after the header")
    first_day, first_s = min(rows.stamps, default=(0, 0.0))
    arrivals = [round((day - first_day) * 86400 + s - first_s, 7) for day, s in rows.stamps]
    requests = apply_prefix_model(model, arrivals, rows.input_lens, rows.output_lens)
    return Workload(
        requests=sorted_by_arrival(requests),
        block_size=model.block_size,
        source="azure",
        path=str(path),
        params={"limit": limit, "prefix_model": model.to_dict()},
        sha256=digest,
    )
