"""``sage llm eviction explain --lookup REQUEST_ID``: a request's lookups and the evictions that
cost their hits.

Reads the engine's lookup log (``--lookup-log PATH``: JSON lines, rotated into ``PATH.1`` ...;
the record's shape: docs/architecture.md, "Lookup records") with its rotated files, oldest
first, and finds, for a lookup whose match stopped at an evicted block, that block's ``evict``
event in the eviction log by its ``id`` (the cache's count of evicted blocks in that engine run).
Imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sage_cli.errors import CLIUsageError
from sage_cli.eviction.log_file import parse_log_line

__all__ = ["eviction_for", "lookup_lines", "read_lookups"]


def _log_files(path: Path) -> list[Path]:
    """The log's files that exist, oldest first (``PATH.N`` ... ``PATH.1``, ``PATH``)."""
    prefix = path.name + "."
    rotated = [p for p in path.parent.glob(prefix + "*") if p.name[len(prefix) :].isdigit()]
    rotated.sort(key=lambda p: -int(p.name[len(prefix) :]))
    return [*rotated, *([path] if path.exists() else [])]


def read_lookups(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of the lookup log at `path` and its rotated files, oldest first.

    Raises:
        CLIUsageError: No file of the log, an unreadable file, or a line that is not a JSON object.
    """
    files = _log_files(path)
    if not files:
        raise CLIUsageError(f"no lookup log at {path} (start the engine with --lookup-log {path})")
    for file in files:
        try:
            handle = file.open(encoding="utf-8")
        except OSError as exc:
            raise CLIUsageError(f"cannot read {file}: {exc.strerror or exc}") from None
        with handle:
            for lineno, line in enumerate(handle, 1):
                record = parse_log_line(file, lineno, line)
                if record is not None:
                    yield record


def eviction_for(record: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``evict`` event of the block that stopped `record`'s match (the last one with its id
    and block), or None when the match did not stop at an evicted block or the log lacks it."""
    eviction = record.get("eviction")
    if not isinstance(eviction, dict):
        return None
    found = [
        e
        for e in events
        if e.get("event") == "evict"
        and e.get("id") == eviction.get("id")
        and e.get("block") == eviction.get("block")
    ]
    return found[-1] if found else None


def lookup_lines(record: dict[str, Any]) -> list[str]:
    """A lookup record for people: what it matched, how long it took, where it stopped."""
    who = f"request {record.get('request_id')} (seq {record.get('sequence_id')}"
    who += f", tenant {record['tenant']})" if record.get("tenant") is not None else ")"
    lines = [
        f"lookup of {who} under {record.get('policy', '?')}: matched {record.get('matched_blocks')} of "
        f"{record.get('prompt_blocks')} blocks ({record.get('matched_tokens')} of "
        f"{record.get('prompt_tokens')} tokens) in {record.get('lookup_us')} µs"
    ]
    stop = record.get("stop")
    eviction = record.get("eviction")
    if stop == "end":
        lines.append("  stopped at the end of what it may match: every block was cached")
    elif stop == "evicted" and isinstance(eviction, dict):
        lines.append(
            f"  stopped at block {str(eviction.get('block'))[:16]}, evicted by "
            f"{str(eviction.get('policy', '?')).upper()} {float(eviction.get('seconds_ago') or 0):.3g} s "
            f"before (eviction #{eviction.get('id')}): that eviction cost this hit"
        )
    else:
        lines.append("  stopped at a block never cached (or evicted too long ago to be remembered)")
    return lines
