"""Trace files read as a stream of lines, and the error every workload source raises.

`TraceLines` yields a file's lines one at a time, decoded as UTF-8, and takes the file's sha256
as they go by, so a reader's memory is what it parses, never the file's text: a line longer
than `MAX_LINE_BYTES` is refused after reading that many bytes of it, however long it is (a
trace of one 1 GB line without a newline costs 1 MiB, not 2 GB). A gzipped file (by its magic
bytes, whatever its name: the traces sage ships are) is read through `gzip` as it streams; its
sha256 is then that of the uncompressed data, as the trace's publisher gives it. `csv_rows`
turns a `csv` module error into a ``path:line: ...`` `WorkloadError`; `shown` cuts a value from
a file short for a one-line message (a list nested hundreds deep, a field of megabytes).

Pure Python; imports nothing of `engine_adapter`.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import reprlib
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["MAX_LINE_BYTES", "TraceLines", "WorkloadError", "csv_rows", "shown"]


class WorkloadError(ValueError):
    """A trace that cannot be read or a workload parameter that cannot be used."""


_CHUNK = 1 << 18
"""Bytes per read when the rest of a trace is only hashed (past `limit`)."""

MAX_LINE_BYTES = 1 << 20
"""The longest line a trace may have (1 MiB; the published traces' longest is 2 KB): one request
per line, so anything longer is not a trace, and reading it whole could exhaust memory."""

_GZIP_MAGIC = b"\x1f\x8b"


class TraceLines:
    """A trace file read as a stream of lines, its sha256 taken as they go by.

    Memory is one line at a time, never the whole text. Iterating yields each line decoded as
    UTF-8 (with its line end); `line` is the number of the last one yielded. Use as a context
    manager; I/O and decoding errors are `WorkloadError` (``path:line: ...`` for a line).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.line = 0
        self._digest = hashlib.sha256()
        try:
            raw = Path(path).open("rb")  # noqa: SIM115 (closed by __exit__)
        except FileNotFoundError:
            raise WorkloadError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise WorkloadError(f"{path}: is a directory, not a trace file") from None
        except OSError as exc:
            raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self._raw = raw
        try:
            gzipped = raw.peek(2)[:2] == _GZIP_MAGIC
        except OSError as exc:
            raw.close()
            raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self._file: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw

    def __enter__(self) -> TraceLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._file.close()
        self._raw.close()

    def _read(self, read: Callable[[int], bytes], size: int) -> bytes:
        """`read(size)`, its I/O and gzip errors as one-line `WorkloadError`s."""
        try:
            return read(size)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise WorkloadError(f"{self.path}: not a readable gzip file: {exc}") from None
        except OSError as exc:
            raise WorkloadError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    def __iter__(self) -> Iterator[str]:
        update = self._digest.update
        readline = self._file.readline
        while True:
            # At most one byte past the limit: enough to know a line is too long, never more.
            raw = self._read(readline, MAX_LINE_BYTES + 1)
            if not raw:
                return
            self.line += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise WorkloadError(
                    f"{self.path}:{self.line}: line longer than {MAX_LINE_BYTES:,} bytes; "
                    "a trace has one request per line"
                )
            update(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise WorkloadError(f"{self.path}:{self.line}: not UTF-8 text") from None
            yield text

    def sha256(self) -> str:
        """Digest of the whole file: what `limit` left unread is hashed in chunks, not parsed, so
        that the digest names the file whatever the limit."""
        while chunk := self._read(self._file.read, _CHUNK):
            self._digest.update(chunk)
        return self._digest.hexdigest()


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 6, 4, 40, 40


def shown(value: object) -> str:
    """`repr(value)` cut short: a trace's value in a one-line message, whatever its size or depth."""
    return _SHORT.repr(value)


def csv_rows(reader: Any, path: str | Path) -> Iterator[list[str]]:
    """The reader's rows, a malformed one (an over-long field, say) as ``path:line: ...``."""
    while True:
        try:
            row: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise WorkloadError(f"{path}:{reader.line_num}: bad CSV: {exc}") from None
        yield row
