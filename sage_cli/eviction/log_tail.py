"""``logs --tail N``: the last N printed lines of the eviction log, never a line cut in the middle.

The engine (and a log file) hands out the last K *events*, but the text log prints one line per
eviction call (its ``evict`` events and the ``freed`` that ends them) and ``--explain`` one line
per victim: N events are not N lines, and the first of them may fall inside a call, whose line then
names some of its victims beside the blocks all of them freed (issue 48: ``--tail 5`` printed one
such line, whose counts did not add up). `tail_events` asks for a window of events large enough
to hold N whole lines (growing it until it does, or holds the whole log) and drops a call the
window may have cut. With ``--follow`` it then streams from where those lines begin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from sage_cli.eviction.render import line_groups

__all__ = ["LARGEST_WINDOW", "Unit", "tail_events"]

Event = dict[str, Any]
Fetch = Callable[[int], list[Event]]
Stream = Callable[[int], Iterable[Event]]
Unit = Literal["event", "call", "victim"]

LARGEST_WINDOW = 1_000_000
"""The most events one request asks for (the engine's limit on ``tail``)."""

_CALL_PARTS = ("evict", "freed")


def _groups(events: list[Event], unit: Unit) -> list[list[Event]]:
    """`events` grouped one group per printed line."""
    if unit == "call":
        return list(line_groups(events))
    if unit == "victim":
        return [[e] for e in events if e.get("event") == "evict"]
    return [[e] for e in events]


def last_lines(fetch: Fetch, tail: int, unit: Unit) -> tuple[list[Event], int]:
    """The events of the log's last `tail` lines, oldest first, each line whole, and how many
    of the log's last events they span (what a follow asks for to begin where they begin).

    Args:
        fetch: The log's last K events, oldest first (fewer when the log holds fewer).
        tail: How many lines.
        unit: What one line shows: an event (``--json``), an eviction call (the text log) or
            a victim (``--explain``).
    """
    if tail == 0:
        return [], 0
    window = min(max(8 * tail, 64), LARGEST_WINDOW)
    while True:
        events = fetch(window)
        whole_log = len(events) < window
        groups = _groups(events, unit)
        if unit == "call" and not whole_log and groups and groups[0][0].get("event") in _CALL_PARTS:
            groups = groups[1:]  # the window may begin inside this call
        if len(groups) >= tail or whole_log or window >= LARGEST_WINDOW:
            kept = [event for group in groups[-tail:] for event in group]
            start = next((i for i, e in enumerate(events) if kept and e is kept[0]), len(events))
            return kept, len(events) - start
        window = min(window * 4, LARGEST_WINDOW)


def _from_first(stream: Iterable[Event], first: Event | None, unit: Unit) -> Iterator[Event]:
    """`stream` from a whole line on: when events arrived between reading the backlog and
    subscribing, the stream's window begins later than `first`, perhaps inside a call, whose
    part is skipped."""
    events = iter(stream)
    head = next(events, None)
    if head is None:
        return
    if unit != "call" or first is None or head == first or head.get("event") not in _CALL_PARTS:
        yield head
    else:
        while head is not None and head.get("event") != "freed":
            head = next(events, None)
    yield from events


def tail_events(
    fetch: Fetch, stream: Stream, tail: int, *, follow: bool, unit: Unit
) -> tuple[bool, Iterable[Event]]:
    """The events to print for ``logs --tail N`` (``--follow``: then the new ones as they come).

    Returns:
        Whether the log's backlog printed nothing (for the "no evictions yet" line), and the
        events.
    """
    backlog, span = last_lines(fetch, tail, unit)
    if not follow:
        return not backlog, backlog
    return not backlog, _from_first(stream(span), backlog[0] if backlog else None, unit)
