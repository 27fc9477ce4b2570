"""Per-lookup records (``--lookup-log PATH``): one JSON line per admitted lookup, bounded, rotated.

Off by default. Each admission writes what its prompt matched and where the match stopped
(docs/architecture.md, "Lookup records")::

    {"ts", "request_id", "sequence_id", "tenant", "policy", "prompt_tokens", "prompt_blocks",
     "matched_blocks", "matched_tokens", "stop", "eviction", "lookup_us"}

`stop` is ``end`` (every block it may match was cached), ``absent`` (the first missing block was
never cached, or evicted too long ago for the ghost set to remember) or ``evicted`` (it was
evicted: `eviction` is then ``{"id", "block", "evicted_at", "policy", "seconds_ago"}``, the ``id``
of its ``evict`` event in the eviction log). `matched_tokens` is the request's
``usage.prompt_tokens_details.cached_tokens`` on its first admission.

The file rotates when it passes `max_bytes`: ``PATH`` -> ``PATH.1`` ... ``PATH.{backups}``, the
oldest dropped, so it never holds more than ``(backups + 1) * max_bytes``; the CLI reads them
back (``sage llm eviction explain --lookup``, sage_cli/eviction/lookups.py). Imports nothing of
the cache.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, TextIO

__all__ = ["DEFAULT_BACKUPS", "DEFAULT_MAX_BYTES", "LookupLog"]

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""A lookup log file's size before it rotates."""

DEFAULT_BACKUPS = 3
"""Rotated files kept beside the current one."""


class LookupLog:
    """Appends lookup records to `path` as JSON lines, rotating by size.

    Args:
        path: The file (its folder is created).
        max_bytes: Rotate once the file reaches this size (at least 1 KiB).
        backups: Rotated files kept (``PATH.1`` the newest).
    """

    def __init__(
        self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes < 1024:
            raise ValueError(f"lookup log max_bytes={max_bytes} must be at least 1024")
        if backups < 0:
            raise ValueError(f"lookup log backups={backups} must be at least 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.records = 0
        self._lock = threading.Lock()  # the cache lock covers the engine; a test may share a log
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("a", encoding="utf-8")
        self._size = self._file.tell()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (flushed, so that a reader sees it at once)."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line.encode("utf-8"))
            self.records += 1

    def _rotate(self) -> None:
        self._file.close()
        if self.backups:
            for i in range(self.backups - 1, 0, -1):
                older = Path(f"{self.path}.{i}")
                if older.exists():
                    os.replace(older, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        self._file = self.path.open("w", encoding="utf-8")
        self._size = 0

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()
