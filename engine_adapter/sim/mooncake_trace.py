"""The Mooncake trace reader: `read_mooncake(path)`, the simulator's native format, and
`mooncake_stream(path)`, its requests one at a time.

One JSON object per line (docs/architecture.md, "Simulator"): `timestamp` (ms from the trace's
start), `input_length`, `output_length`, `hash_ids` (prefix-chained block keys of
`MOONCAKE_BLOCK_SIZE` tokens each, the last block possibly partial); optional `tenant`,
`session` and `priority`; and the optional prompt-cache contract fields `cache_salt`,
`cache_ttl_s` and `cache_breakpoint` (`engine_adapter.sim.contracts`: a salted request's keys
are its hash ids salted). The file is streamed line by line (`engine_adapter.sim.trace_file`);
a malformed line is a one-line `WorkloadError` ``path:line: what is wrong``, the lines after it
unread. `read_mooncake` fills a `RequestTable` record by record (the hash ids in one int32 or
int64 array, no object per request or per id); `mooncake_stream` yields `SimRequest`s.

Pure Python; imports the workload records and the trace-file reader only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from engine_adapter.sim.contracts import ContractFields, contract_fields, salted_keys
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.trace_file import TraceLines, WorkloadError, shown
from engine_adapter.sim.workloads import SimRequest, Workload, check_limit

__all__ = ["MOONCAKE_BLOCK_SIZE", "mooncake_stream", "read_mooncake"]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per `hash_ids` entry in the Mooncake traces."""


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; a trace's true/false is a type error


def _optional_label(value: object, name: str, where: str) -> str | None:
    """An optional tenant or session: a string, an integer (kept as its decimal string) or null."""
    if value is None or type(value) is str:
        return value
    if _is_int(value):
        return str(value)
    raise WorkloadError(f"{where}: {name!r} must be a string, an integer or null, got {shown(value)}")


_Fields = tuple[float, list[int], int, int, "str | None", int, "str | None", ContractFields]
"""A record's fields as `RequestTable.add` takes them after the request id: arrival (s), hash
ids (salted), input and output lengths, tenant, priority, session; and its contract (salt,
lifetime, breakpoint)."""


def _mooncake_fields(record: object, where: str) -> _Fields:
    """A record's fields, checked; a malformed one is a `WorkloadError` ``where: ...``."""
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in record:
            raise WorkloadError(f"{where}: missing field {name!r}")
    timestamp = record["timestamp"]
    if type(timestamp) not in (int, float) or not math.isfinite(timestamp):
        raise WorkloadError(f"{where}: 'timestamp' must be a number of milliseconds, got {shown(timestamp)}")
    if timestamp < 0:
        raise WorkloadError(f"{where}: 'timestamp' is negative ({timestamp})")
    input_len = record["input_length"]
    output_len = record["output_length"]
    for name, value in (("input_length", input_len), ("output_length", output_len)):
        if not _is_int(value):
            raise WorkloadError(f"{where}: {name!r} must be an integer, got {shown(value)}")
        if value < 0:
            raise WorkloadError(f"{where}: {name!r} is negative ({value})")
    hash_ids = record["hash_ids"]
    if type(hash_ids) is not list:
        raise WorkloadError(f"{where}: 'hash_ids' must be a list of integers, got {shown(hash_ids)}")
    for hash_id in hash_ids:
        if not _is_int(hash_id):
            raise WorkloadError(f"{where}: 'hash_ids' must hold integers, found {shown(hash_id)}")
    # ceil(input / 512) in the published traces; floor (full blocks only) is accepted too.
    full, covering = input_len // MOONCAKE_BLOCK_SIZE, -(-input_len // MOONCAKE_BLOCK_SIZE)
    if not full <= len(hash_ids) <= covering:
        expected = str(covering) if full == covering else f"{full} or {covering}"
        raise WorkloadError(
            f"{where}: {len(hash_ids)} hash_ids for input_length {input_len}: expected {expected} "
            f"({MOONCAKE_BLOCK_SIZE} tokens per block)"
        )
    priority = record.get("priority", 0)
    if not _is_int(priority):
        raise WorkloadError(f"{where}: 'priority' must be an integer, got {shown(priority)}")
    tenant = _optional_label(record.get("tenant"), "tenant", where)
    session = _optional_label(record.get("session"), "session", where)
    contract: ContractFields = contract_fields(record, input_len, where)
    if contract[0] is not None:
        hash_ids = salted_keys(contract[0], hash_ids)
    return (timestamp / 1000.0, hash_ids, input_len, output_len, tenant, priority, session, contract)


def read_mooncake(path: str | Path, *, limit: int | None = None) -> Workload:
    """Read a Mooncake JSON-lines trace.

    Fields: `timestamp` (ms from trace start), `input_length`, `output_length` (tokens),
    `hash_ids` (prefix-chained block keys, 512 tokens each); optional `tenant`, `session`
    (string or integer), `priority` (integer), and the prompt-cache contract's `cache_salt`
    (string), `cache_ttl_s` (seconds) and `cache_breakpoint` (tokens). Blank lines are skipped.
    The file is read as a stream of lines (module docstring).

    Args:
        path: The `.jsonl` file.
        limit: Read at most this many requests (in file order).

    Returns:
        The workload, sorted by arrival; `request_id` is the record's index in the file.

    Raises:
        WorkloadError: The file cannot be read or a line is malformed (``path:line: ...``).
    """
    check_limit(limit)
    table = RequestTable()
    with TraceLines(path) as lines:
        if limit != 0:
            for request_id, fields in enumerate(_records(lines, limit)):
                table.add(request_id, *fields[:-1], *fields[-1])
        digest = lines.sha256()
    if not table and limit != 0:
        raise WorkloadError(f"{path}: no requests in the file")
    return Workload(
        requests=table.sorted_by_arrival(),
        block_size=MOONCAKE_BLOCK_SIZE,
        source="mooncake",
        path=str(path),
        params={"limit": limit},
        sha256=digest,
    )


def mooncake_stream(path: str | Path, *, limit: int | None = None) -> Iterator[SimRequest]:
    """The requests of a Mooncake trace one at a time, in file order, without the list.

    What `read_mooncake` returns before it sorts (the published traces are in arrival order
    already, so the same requests in the same order), for a consumer that does not keep them
    all: memory is one line and one object per distinct hash id, whatever the trace's length.
    The file is opened and `limit` checked before the first request; a malformed line is a
    `WorkloadError` ``path:line: ...`` when the iteration reaches it, the lines after it unread.
    """
    check_limit(limit)
    lines = TraceLines(path)

    def stream() -> Iterator[SimRequest]:
        with lines:
            yield from _requests(lines, limit) if limit != 0 else ()

    return stream()


def _requests(lines: TraceLines, limit: int | None) -> Iterator[SimRequest]:
    """The requests of the lines in file order, at most `limit`, each a `SimRequest`."""
    # The JSON parser makes a new int object for every occurrence of a hash id; a trace repeats
    # its ids many times over (every turn of a conversation looks its prefix up again), so a
    # consumer that keeps the keys keeps one shared object per id.
    canonical: dict[int, int] = {}
    intern = canonical.setdefault
    for request_id, fields in enumerate(_records(lines, limit)):
        arrival, hash_ids, input_len, output_len, tenant, priority, session, contract = fields
        keys = tuple([intern(hash_id, hash_id) for hash_id in hash_ids])
        salt, ttl, breakpoint_ = contract
        yield SimRequest(
            request_id, arrival, keys, input_len, output_len, tenant, priority, session,
            cache_salt=salt, cache_ttl_s=ttl, cache_breakpoint=breakpoint_,
        )  # fmt: skip


def _records(lines: TraceLines, limit: int | None) -> Iterator[_Fields]:
    """The records of the lines in file order, at most `limit`; blank lines skipped. Each line
    is parsed when the iteration reaches it: a malformed one stops it, the rest unread."""
    loads = json.loads
    count = 0
    for line in lines:
        if not line.strip():
            continue
        where = f"{lines.path}:{lines.line}"
        try:
            record = loads(line)
        except ValueError as exc:
            raise WorkloadError(f"{where}: bad JSON: {exc}") from None
        except RecursionError:
            raise WorkloadError(f"{where}: bad JSON: nested too deeply") from None
        yield _mooncake_fields(record, where)
        count += 1
        if limit is not None and count >= limit:
            return
