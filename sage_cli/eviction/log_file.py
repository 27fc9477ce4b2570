"""Reading an eviction log file (``logs --file``, ``explain --file``): JSON lines, tail and follow.

The engine writes the file with ``--log-evictions`` (``$SAGE_HOME/logs/<name>/evictions.jsonl``,
rotated); reading it needs no engine.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sage_cli.errors import CLIUsageError

__all__ = ["parse_log_line", "read_log_file"]


def parse_log_line(path: Path, lineno: int, line: str) -> dict[str, Any] | None:
    """One line of a JSON-lines log: its object, None for a blank line.

    Raises:
        CLIUsageError: A line that is not a JSON object (the message names the file and line).
    """
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise CLIUsageError(f"{path}:{lineno}: not a JSON line") from None
    if not isinstance(event, dict):
        raise CLIUsageError(f"{path}:{lineno}: not a JSON object")
    return event


def read_log_file(path: Path, tail: int, follow: bool) -> Iterator[dict[str, Any]]:
    """The last `tail` events of a JSON-lines log file, then (with `follow`) new ones, across
    rotations (a new inode or a shorter file starts over)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise CLIUsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        last: deque[tuple[int, str]] = deque(maxlen=tail)
        lineno = 0
        for line in handle:
            lineno += 1
            if line.strip():
                last.append((lineno, line))
        for n, line in last:
            event = parse_log_line(path, n, line)
            if event is not None:
                yield event
        if not follow:
            return
        inode = os.fstat(handle.fileno()).st_ino
        partial = ""
        while True:
            line = handle.readline()
            if line:
                partial += line
                if partial.endswith("\n"):
                    lineno += 1
                    event = parse_log_line(path, lineno, partial)
                    partial = ""
                    if event is not None:
                        yield event
                continue
            time.sleep(0.2)
            try:
                now = path.stat()
            except FileNotFoundError:
                continue  # between the rename and the new file of a rotation
            if now.st_ino != inode or now.st_size < handle.tell():
                handle.close()
                handle = path.open(encoding="utf-8")
                inode, lineno, partial = os.fstat(handle.fileno()).st_ino, 0, ""
    finally:
        handle.close()
