"""The Azure LLM inference trace reader: `read_azure(path, prefix_model=PrefixModel())`.

The CSV has arrival times and lengths only (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`,
any order, other columns ignored), so a seeded `PrefixModel` supplies the prefix structure.
The file is streamed line by line (`engine_adapter.sim.trace_file`); a malformed row is a
one-line `WorkloadError` ``path:line: what is wrong``, the rows after it unread.

Memory: the rows are parsed into four typed arrays as the file streams by (a timestamp's day and
seconds, the two lengths: 28 bytes a row, no object per row), then the prefix model fills a
`RequestTable` from them (every request's keys in one int32 or int64 array). The rows are read
whole before the first key is drawn because the model's seeded draws are sized by the number of
requests (`PrefixBuilder`), and the arrivals are measured from the earliest timestamp, which
the last row may hold.

Pure Python and numpy; imports the workload records, the prefix model and the trace-file reader.
"""

from __future__ import annotations

import csv
import re
from array import array
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from engine_adapter.sim.prefix_model import PrefixModel, apply_prefix_model
from engine_adapter.sim.trace_file import TraceLines, WorkloadError, csv_rows, shown
from engine_adapter.sim.workloads import Workload, check_limit

__all__ = ["AZURE_COLUMNS", "read_azure"]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns an Azure trace must have."""


_INT64_MAX = 2**63 - 1
"""The largest length the table's int64 columns hold."""

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
    """The columns the reader keeps of an Azure trace, row by row, as typed arrays (no object
    per row): a timestamp as its day ordinal and seconds into the day (`_azure_time`)."""

    days: array[int] = field(default_factory=lambda: array("q"))
    seconds: array[float] = field(default_factory=lambda: array("d"))
    input_lens: array[int] = field(default_factory=lambda: array("q"))
    output_lens: array[int] = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.days)

    def arrivals(self) -> array[float]:
        """Seconds after the earliest timestamp, rounded to the trace's 100 ns, row by row: in
        Python floats as a list of the rows' stamps had them (numpy rounds differently)."""
        days, seconds = self.days, self.seconds
        first_day = min(days, default=0)
        first_s = min((s for d, s in zip(days, seconds, strict=True) if d == first_day), default=0.0)
        return array(
            "d", (round((d - first_day) * 86400 + s - first_s, 7) for d, s in zip(days, seconds, strict=True))
        )


def _length(row: list[str], column: int, name: str, where: str) -> int:
    """A row's ContextTokens or GeneratedTokens: an integer within [0, 2^63)."""
    try:
        value = int(row[column])
    except ValueError:
        raise WorkloadError(f"{where}: {name} must be an integer, got {shown(row[column])}") from None
    if value < 0:
        raise WorkloadError(f"{where}: {name} is negative ({value})")
    if value > _INT64_MAX:
        raise WorkloadError(f"{where}: {name} is too large ({shown(value)})")
    return value


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
            day, seconds = _azure_time(row[i_time], days)
        except ValueError:
            raise WorkloadError(f"{where}: bad TIMESTAMP {shown(row[i_time])}") from None
        input_len = _length(row, i_context, "ContextTokens", where)
        output_len = _length(row, i_generated, "GeneratedTokens", where)
        out.days.append(day)
        out.seconds.append(seconds)
        out.input_lens.append(input_len)
        out.output_lens.append(output_len)
        if limit is not None and len(out) >= limit:
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
        The workload, sorted by arrival (a `RequestTable`); `request_id` is the row's index in
        the file.

    Raises:
        WorkloadError: The file cannot be read or a row is malformed (``path:line: ...``).
    """
    check_limit(limit)
    model = prefix_model if prefix_model is not None else PrefixModel()
    with TraceLines(path) as lines:
        rows = _read_azure_rows(lines, path, limit)
        digest = lines.sha256()
    if not rows and limit != 0:
        raise WorkloadError(f"{path}: no rows after the header")
    table = apply_prefix_model(model, rows.arrivals(), rows.input_lens, rows.output_lens)
    del rows  # the columns are in the table now
    return Workload(
        requests=table.sorted_by_arrival(),
        block_size=model.block_size,
        source="azure",
        path=str(path),
        params={"limit": limit, "prefix_model": model.to_dict()},
        sha256=digest,
    )
