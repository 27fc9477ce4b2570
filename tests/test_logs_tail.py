"""``sage llm eviction logs --tail N`` counts printed lines and never cuts one (issue 48, item 8).

Before, ``--tail N`` asked for the last N *events*: the text log prints one line per eviction call
(several events), so ``--tail 5`` printed one line, cut in the middle, naming some victims beside
the blocks all of them freed. A log with nothing evicted printed nothing at all; now it says so.
The property tests drive `tail_events` with logs of random calls; the process tests run `sage`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sage_cli.eviction.log_tail import tail_events
from sage_cli.eviction.render import line_groups

ROOT = Path(__file__).resolve().parent.parent


def _log(call_sizes: list[int]) -> list[dict[str, Any]]:
    """A log of eviction calls: call i evicts `call_sizes[i]` blocks of sequence i, then frees them."""
    events: list[dict[str, Any]] = []
    total = 0
    for call, size in enumerate(call_sizes):
        common = {"ts": 1.0e9 + call, "policy": "lru", "reason": "alloc"}
        for block in range(size):
            victim = {"block": f"{call:04d}{block:04d}", "sequence_id": call, "last_access": 1.0}
            events.append({"event": "evict", **common, **victim})
        total += size
        events.append({"event": "freed", **common, "blocks_freed": size, "total_freed": total})
    return events


def _fetch(log: list[dict[str, Any]]) -> Any:
    return lambda k: log[-k:] if k else []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=30), st.integers(0, 40))
def test_the_tail_is_whole_lines_and_as_many_as_asked(call_sizes: list[int], tail: int) -> None:
    log = _log(call_sizes)
    empty, events = tail_events(_fetch(log), _fetch(log), tail, follow=False, unit="call")
    groups = list(line_groups(events))
    assert len(groups) == min(tail, len(call_sizes))  # N lines, or all the log has
    assert empty == (not groups)
    for group in groups:  # each line whole: its victims add up to what it freed
        assert group[-1]["event"] == "freed" and len(group) - 1 == group[-1]["blocks_freed"]
    assert events == (log[len(log) - len(events) :] if events else [])  # the log's last lines


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=20), st.integers(0, 30), st.integers(0, 5))
def test_follow_begins_on_a_whole_line(call_sizes: list[int], tail: int, arrived: int) -> None:
    """--follow: events that arrive between reading the backlog and subscribing move the stream's
    window later, perhaps into a call: that call's part is skipped, never printed cut."""
    log = _log(call_sizes)
    later = _log([*call_sizes, *([3] * arrived)])  # the log when the stream subscribes
    _, events = tail_events(_fetch(log), _fetch(later), tail, follow=True, unit="call")
    for group in line_groups(list(events)):
        assert group[-1]["event"] == "freed" and len(group) - 1 == group[-1]["blocks_freed"]


def test_explain_counts_victims_and_json_counts_events() -> None:
    log = _log([3, 2, 4])
    _, victims = tail_events(_fetch(log), _fetch(log), 5, follow=False, unit="victim")
    assert [e["event"] for e in victims] == ["evict"] * 5
    _, raw = tail_events(_fetch(log), _fetch(log), 5, follow=False, unit="event")
    assert list(raw) == log[-5:]


# -- the program --------------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    return {**clean, "SAGE_HOME": str(tmp_path / "home"), "TZ": "UTC", "PYTHONPATH": str(ROOT)}


def _sage(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sage_cli.app", "llm", "eviction", "logs", *args]
    return subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_tail_prints_the_last_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in _log([3, 4, 5, 6])))
    done = _sage(tmp_path, "--file", str(log), "--tail", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert "Sequence 2 (5 blocks) evicted" in lines[0] and "freed 5 blocks, total freed: 12 " in lines[0]
    assert "Sequence 3 (6 blocks) evicted" in lines[1] and "freed 6 blocks, total freed: 18 " in lines[1]
    five = _sage(tmp_path, "--file", str(log), "--tail", "5").stdout.splitlines()
    assert len(five) == 4 and five[-2:] == lines  # all four calls, none cut


def test_an_empty_log_says_nothing_was_evicted(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    log.write_text("")
    done = _sage(tmp_path, "--file", str(log))
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.strip() == f"no evictions yet (in {log})"
    command = [sys.executable, "-m", "sage_cli.app", "llm", "eviction", "logs", "--file", str(log), "-f"]
    proc = subprocess.Popen(command, env=_env(tmp_path), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # said at once, then it waits
        assert line.strip() == f"no evictions yet (in {log}); waiting for the first (Ctrl-C stops)"
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
