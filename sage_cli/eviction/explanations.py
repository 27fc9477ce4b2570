"""Why blocks left, for people: one line per victim, or a past eviction in full.

Pure functions of the eviction events the engine writes with ``--explain`` (docs/architecture.md,
"Explaining an eviction"); ``logs --explain``, ``explain`` and ``top`` print them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

__all__ = ["by_run", "explain_lines", "explain_one_line", "is_eviction_of", "run_heading", "short_block"]

_COMMON = ("policy", "evictable", "last_access", "priority", "tenant")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    return str(value)


def _values(values: Any, *, skip: tuple[str, ...] = _COMMON) -> str:
    if not isinstance(values, dict):
        return "-"
    return " ".join(f"{k}={_value(v)}" for k, v in values.items() if k not in skip) or "-"


def short_block(block: Any) -> str:
    """A block key cut to 10 hex digits, enough to tell blocks apart on one screen."""
    return str(block)[:10] if block else "?"


def _who(event: dict[str, Any]) -> str:
    parts = [f"block {short_block(event.get('block'))}"]
    extra = []
    if event.get("sequence_id") is not None:
        extra.append(f"seq {event['sequence_id']}")
    if event.get("tenant") is not None:
        extra.append(f"tenant {event['tenant']}")
    if extra:
        parts.append(f"({', '.join(extra)})")
    return " ".join(parts)


def _counts(counts: Any) -> str:
    if not isinstance(counts, dict):
        return ""
    names = {"referenced": "in use", "pinned": "pinned", "shared": "shared prefix"}
    return ", ".join(f"{n} {names.get(k, k)}" for k, n in counts.items() if n)


def explain_one_line(event: dict[str, Any]) -> str:
    """One readable line per victim (``sage llm eviction logs --explain``, ``top``)."""
    policy = str(event.get("policy") or "?").upper()
    head = f"{_who(event)} evicted by {policy} for {event.get('reason', '?')}"
    why = event.get("explain")
    if not isinstance(why, dict):
        return f"{head} (no explanation: the engine runs without --explain)"
    line = f"{head}: {_values(why.get('values'))}"
    preferred = why.get("preferred_to") or []
    if preferred:
        line += "; before " + ", ".join(
            f"{short_block(p.get('block'))} [{_values(p.get('values'))}]"
            for p in preferred
            if isinstance(p, dict)
        )
    skipped = why.get("skipped") or []
    if skipped:
        line += "; skipped " + ", ".join(
            f"{short_block(s.get('block'))} ({s.get('why')})" for s in skipped if isinstance(s, dict)
        )
    return line


def explain_lines(event: dict[str, Any]) -> list[str]:
    """A past eviction, explained in full (``sage llm eviction explain``)."""
    ts = event.get("ts")
    when = (
        dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(ts, int | float)
        else "?"
    )
    block_id = event.get("block_id")
    lines = [
        f"{_who(event)} [pool block {block_id}] evicted at {when} by "
        f"{str(event.get('policy') or '?').upper()} for {event.get('reason', '?')}"
    ]
    why = event.get("explain")
    if not isinstance(why, dict):
        lines.append("  no explanation recorded: start the engine with --explain")
        return lines
    lines.append(f"  ranked by: {why.get('ranks_by', '?')}")
    lines.append(f"  its values: {_values(why.get('values'), skip=('policy', 'evictable'))}")
    preferred = [p for p in why.get("preferred_to") or [] if isinstance(p, dict)]
    if preferred:
        lines.append("  chosen before the next candidates:")
        for p in preferred:
            seq = f" (seq {p['sequence_id']})" if p.get("sequence_id") is not None else ""
            lines.append(f"    {short_block(p.get('block'))}{seq}: {_values(p.get('values'))}")
    else:
        lines.append("  it was the last evictable block")
    skipped = [s for s in why.get("skipped") or [] if isinstance(s, dict)]
    before = why.get("skipped_before", 0)
    if skipped:
        lines.append(f"  passed over ({before} would have gone first but could not):")
        for s in skipped:
            lines.append(f"    {short_block(s.get('block'))}: {s.get('why')}, rank={_value(s.get('rank'))}")
    counts = _counts(why.get("skipped_counts"))
    if counts:
        lines.append(f"  not evictable then: {counts}")
    return lines


def is_eviction_of(event: dict[str, Any], target: str) -> bool:
    """Whether `event` evicted the sequence `target` (digits) or a block whose key starts with it."""
    if event.get("event") != "evict":
        return False
    if target.isdigit() and event.get("sequence_id") == int(target):
        return True
    block = event.get("block")
    return isinstance(block, str) and len(target) >= 4 and block.startswith(target.lower())


def by_run(events: list[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The events grouped by the engine run that wrote them (their ``run``; None for records
    written before events carried one), runs in the order they first appear, events in theirs."""
    runs: dict[str | None, list[dict[str, Any]]] = {}
    for event in events:
        run = event.get("run")
        runs.setdefault(run if isinstance(run, str) else None, []).append(event)
    return list(runs.items())


def run_heading(run: str | None, found: list[dict[str, Any]], target: str) -> str:
    """The line above one run's explanations: which run, how many evictions of `target`."""
    what = f"{len(found)} eviction{'s' if len(found) != 1 else ''} of {target}"
    if run is None:
        return f"== records without a run id (written before logs named their run): {what}"
    return f"== engine run {run}: {what}"
