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


def _when(event: dict[str, Any]) -> str:
    ts = event.get("ts")
    if not isinstance(ts, int | float):
        return "?"
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _compressed_lines(event: dict[str, Any]) -> list[str]:
    """A cached prefix compressed instead of evicted, or a compressed prefix given up."""
    blocks = [short_block(b) for b in event.get("blocks") or []]
    chain = f"{len(blocks)} block{'s' if len(blocks) != 1 else ''} ({', '.join(blocks)})"
    if event.get("event") == "drop_compressed":
        return [
            f"compressed prefix of {chain} dropped at {_when(event)} for {event.get('reason', '?')}",
            f"  why: {event.get('why', '?')}",
            f"  it kept {event.get('tokens_kept', '?')} tokens, served {event.get('hits', '?')} hits, "
            f"and freed {event.get('blocks_freed', '?')} blocks",
        ]
    reason = str(event.get("reason", "?")).removeprefix("evict:")
    chooser = str(event.get("chosen_by") or "?").upper()
    lines = [
        f"cached prefix of {chain} compressed, not evicted, at {_when(event)}: "
        f"{chooser} chose block {short_block(event.get('block'))} for {reason}",
        f"  {event.get('policy') or '?'} kept {event.get('tokens_after', '?')} of "
        f"{event.get('tokens_before', '?')} tokens and freed {event.get('blocks_freed', '?')} blocks",
    ]
    why = event.get("explain")
    if not isinstance(why, dict) or "ranks_by" not in why:
        lines.append("  no explanation recorded: start the engine with --explain")
        return lines
    return lines + _why_lines(why)


def explain_lines(event: dict[str, Any]) -> list[str]:
    """A past eviction, explained in full (``sage llm eviction explain``)."""
    if event.get("event") in ("compress", "drop_compressed"):
        return _compressed_lines(event)
    block_id = event.get("block_id")
    lines = [
        f"{_who(event)} [pool block {block_id}] evicted at {_when(event)} by "
        f"{str(event.get('policy') or '?').upper()} for {event.get('reason', '?')}"
    ]
    why = event.get("explain")
    if not isinstance(why, dict):
        lines.append("  no explanation recorded: start the engine with --explain")
        return lines
    return lines + _why_lines(why)


def _why_lines(why: dict[str, Any]) -> list[str]:
    """The policy's reasons for one victim: its values, the candidates after it, what it skipped."""
    lines = []
    if isinstance(why.get("then"), str) and why["then"] != "compress":
        lines.append(f"  then: {why['then']}")
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
    """Whether `event` evicted the sequence `target` (digits) or a block whose key starts with it;
    with compress-on-evict, also a cached prefix compressed or dropped that holds such a block."""
    kind = event.get("event")
    if kind in ("compress", "drop_compressed"):
        blocks = event.get("blocks")
        return isinstance(blocks, list) and _names_block(blocks, target)
    if kind != "evict":
        return False
    if target.isdigit() and event.get("sequence_id") == int(target):
        return True
    return _names_block([event.get("block")], target)


def _names_block(blocks: list[Any], target: str) -> bool:
    prefix = target.lower()
    return len(target) >= 4 and any(isinstance(b, str) and b.startswith(prefix) for b in blocks)


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
