"""Request streams for the simulator: Mooncake and Azure traces, seeded synthetic workloads, presets.

Every source returns a `Workload`: the `SimRequest`s sorted by arrival (stable, so requests
that arrive together keep their file order), the `block_size` in tokens that one block key
stands for, and a description for the benchmark's JSON output (`Workload.describe()`).

A request's `block_hashes` are the keys of its prompt blocks in prefix order: block `i`
covers prompt tokens `[i * block_size, min((i + 1) * block_size, input_len))`, so the prompt
tokens that `n` hit blocks serve are `min(n * block_size, input_len)`. Equal keys are the same
KV content *and* the same prefix before it (Mooncake's hash ids are chained that way; the
generated workloads allocate a fresh key for every block whose prefix is new). Mooncake hashes
`ceil(input_len / 512)` blocks, the last one possibly partial; the generated workloads hash
full blocks only (`input_len // block_size`), as a paged cache does.

Sources:

- `read_mooncake(path)`: the native format (docs/architecture.md, "Simulator"), one JSON object per line.
- `read_azure(path, prefix_model=PrefixModel())`: the Azure LLM inference CSV; it has arrival
  times and lengths only, so a seeded `PrefixModel` supplies the prefix structure.
- `synthetic(...)` and `preset("spec")` (`engine_adapter.sim.synthetic`): Poisson, bursty or
  periodic arrivals over the same `PrefixModel`, with lognormal lengths and multi-turn sessions;
  the module spec's benchmark scenario (1000 sequences of 10 blocks).
- `load(source, path=..., **params)` (`engine_adapter.sim.sources`): one entry point by name,
  for the CLI.

The trace readers stream the file line by line: memory holds the parsed requests and one line,
never the file's text (a 300 MB Mooncake trace of 200,000 requests: 86 MB peak RSS, against
673 MB when the text was read whole). The requests are kept in one list, sorted in place only
when the file is not already in arrival order (the Mooncake traces are). With `limit`, parsing
stops after that many requests; the rest of the file is only hashed (in 256 KiB chunks), so
`Workload.sha256` is the whole file's digest whatever the limit.

Bad input raises `WorkloadError` (a `ValueError`) with a one-line message; for a file it
reads ``path:line: what is wrong``, values from the file cut short. That includes a line nested
deeper than the JSON parser recurses (``bad JSON: nested too deeply``) and a CSV field beyond
the `csv` module's limit.

Pure Python and numpy; imports neither torch nor the rest of `engine_adapter`.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from engine_adapter.sim.trace_file import TraceLines, WorkloadError, csv_rows, shown

__all__ = [
    "AZURE_COLUMNS",
    "MOONCAKE_BLOCK_SIZE",
    "PrefixModel",
    "SimRequest",
    "Workload",
    "WorkloadError",
    "read_azure",
    "read_mooncake",
    "total_block_lookups",
    "unique_blocks",
]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per `hash_ids` entry in the Mooncake traces."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""Arrival processes of `synthetic`."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a workload.

    Attributes:
        request_id: Index of the request in its source (file order for traces, generation
            order otherwise).
        arrival_s: Seconds from the start of the trace.
        block_hashes: Keys of the prompt's blocks in prefix order (see the module docstring).
        input_len: Prompt tokens.
        output_len: Tokens to generate.
        tenant: Tenant the request is accounted to; `None` when the source has none.
        priority: Higher is more important (0 low, 1 normal, 2 high), as in `EntryMeta`.
        session: Conversation the request belongs to; `None` for a one-off request.
    """

    request_id: int
    arrival_s: float
    block_hashes: tuple[Hashable, ...]
    input_len: int
    output_len: int
    tenant: str | None = None
    priority: int = 0
    session: str | None = None


def unique_blocks(requests: Iterable[SimRequest]) -> int:
    """Distinct block keys over all requests (the compulsory misses of an unbounded cache)."""
    seen: set[Hashable] = set()
    for request in requests:
        seen.update(request.block_hashes)
    return len(seen)


def total_block_lookups(requests: Iterable[SimRequest]) -> int:
    """Block keys looked up over all requests, repeats included."""
    return sum(len(request.block_hashes) for request in requests)


@dataclass(slots=True)
class Workload:
    """A request stream sorted by arrival, and where it came from.

    Iterating yields the `SimRequest`s in arrival order; `len()` is their number.

    Attributes:
        requests: The requests, sorted by `arrival_s`.
        block_size: Tokens that one block key stands for.
        source: `"mooncake"`, `"azure"`, `"synthetic"` or a preset name.
        path: The trace file, for the file sources.
        params: The parameters the workload was built with (JSON-serialisable).
        sha256: Digest of the trace file, for the file sources.
    """

    requests: list[SimRequest]
    block_size: int
    source: str
    path: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    sha256: str | None = None

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    def describe(self) -> dict[str, Any]:
        """The `{"workload": {...}}` part of the benchmark's JSON output."""
        requests = self.requests
        arrivals = [r.arrival_s for r in requests]
        return {
            "source": self.source,
            "path": self.path,
            "sha256": self.sha256,
            "params": dict(self.params),
            "block_size": self.block_size,
            "requests": len(requests),
            "unique_blocks": unique_blocks(requests),
            "total_block_lookups": total_block_lookups(requests),
            "prompt_tokens": sum(r.input_len for r in requests),
            "output_tokens": sum(r.output_len for r in requests),
            "duration_s": (arrivals[-1] - arrivals[0]) if arrivals else 0.0,
            "tenants": len({r.tenant for r in requests if r.tenant is not None}),
            "sessions": len({r.session for r in requests if r.session is not None}),
        }


def _sorted_by_arrival(requests: list[SimRequest]) -> list[SimRequest]:
    """The requests in arrival order: the list itself, sorted in place only when it is not already
    (the Mooncake traces are), so no second copy of a large trace is made."""
    if any(a.arrival_s > b.arrival_s for a, b in itertools.pairwise(requests)):
        requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep their source order
    return requests


def _check_limit(limit: int | None) -> None:
    if limit is not None and (type(limit) is not int or limit < 0):
        raise WorkloadError(f"limit must be a non-negative integer or None, got {limit!r}")


# --------------------------------------------------------------------------- Mooncake


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; a trace's true/false is a type error


def _optional_label(value: object, name: str, where: str) -> str | None:
    """An optional tenant or session: a string, an integer (kept as its decimal string) or null."""
    if value is None or type(value) is str:
        return value
    if _is_int(value):
        return str(value)
    raise WorkloadError(f"{where}: {name!r} must be a string, an integer or null, got {shown(value)}")


def _mooncake_request(record: object, request_id: int, where: str) -> SimRequest:
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
    return SimRequest(
        request_id=request_id,
        arrival_s=timestamp / 1000.0,
        block_hashes=tuple(hash_ids),
        input_len=input_len,
        output_len=output_len,
        tenant=_optional_label(record.get("tenant"), "tenant", where),
        priority=priority,
        session=_optional_label(record.get("session"), "session", where),
    )


def read_mooncake(path: str | Path, *, limit: int | None = None) -> Workload:
    """Read a Mooncake JSON-lines trace.

    Fields: `timestamp` (ms from trace start), `input_length`, `output_length` (tokens),
    `hash_ids` (prefix-chained block keys, 512 tokens each); optional `tenant`, `session`
    (string or integer) and `priority` (integer). Blank lines are skipped. The file is read as a
    stream of lines (module docstring).

    Args:
        path: The `.jsonl` file.
        limit: Read at most this many requests (in file order).

    Returns:
        The workload, sorted by arrival; `request_id` is the record's index in the file.

    Raises:
        WorkloadError: The file cannot be read or a line is malformed (``path:line: ...``).
    """
    _check_limit(limit)
    requests: list[SimRequest] = []
    loads = json.loads
    with TraceLines(path) as lines:
        for line in lines if limit != 0 else ():
            if not line.strip():
                continue
            where = f"{path}:{lines.line}"
            try:
                record = loads(line)
            except ValueError as exc:
                raise WorkloadError(f"{where}: bad JSON: {exc}") from None
            except RecursionError:
                raise WorkloadError(f"{where}: bad JSON: nested too deeply") from None
            requests.append(_mooncake_request(record, len(requests), where))
            if limit is not None and len(requests) >= limit:
                break
        digest = lines.sha256()
    if not requests and limit != 0:
        raise WorkloadError(f"{path}: no requests in the file")
    return Workload(
        requests=_sorted_by_arrival(requests),
        block_size=MOONCAKE_BLOCK_SIZE,
        source="mooncake",
        path=str(path),
        params={"limit": limit},
        sha256=digest,
    )


# --------------------------------------------------------------------------- prefix model


def _zipf_weights(n: int, skew: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** skew
    normalised: np.ndarray = weights / weights.sum()
    return normalised


@dataclass(frozen=True, slots=True)
class PrefixModel:
    """A seeded model of shared prefixes, for sources that carry none (Azure) and `synthetic`.

    Requests belong to conversations. There are `sessions` conversation slots; each request
    picks a slot from a Zipf distribution with exponent `session_skew` (0: uniform), so a few
    conversations are hot (short reuse distances) and a long tail is cold (long ones). A slot
    holds one conversation at a time: it lasts a geometric number of turns with mean `turns`
    (1 makes every request a one-off), then the next request to that slot opens a new one with
    a new session id.

    A conversation's first turn starts, with probability `p_system`, with one of
    `system_prompts` shared system prompts (uniform) of `system_prompt_tokens` tokens, whose
    `system_prompt_tokens // block_size` blocks every such request shares. A later turn extends
    the previous prompt: it reuses the previous turn's blocks and adds new ones. Where a trace
    gives a next turn a shorter prompt (Azure's lengths are what they are), it reuses the blocks
    it has room for and the conversation keeps its longer prefix. Blocks written during decode
    are not modelled as reusable.

    Each conversation draws a tenant (uniform over `tenants`; 0 means no tenant, `None`) and a
    priority (`priority_weights[i]` is the weight of priority `i`). New blocks get fresh integer
    keys in order of creation, so the stream is a pure function of the seed and the inputs.

    Attributes:
        seed: Seed of the model's random stream.
        block_size: Tokens per block key.
        sessions: Conversation slots.
        session_skew: Zipf exponent of the slot choice (0: uniform).
        turns: Mean turns per conversation (geometric, >= 1).
        system_prompts: Distinct shared system prompts (0: none).
        system_prompt_tokens: Length of each system prompt.
        p_system: Probability that a conversation starts with a system prompt.
        tenants: Tenants `"t0"`, `"t1"`, ... (0: no tenant).
        priority_weights: Relative weights of priorities 0, 1, 2, ...
    """

    seed: int = 0
    block_size: int = 16
    sessions: int = 64
    session_skew: float = 1.0
    turns: float = 4.0
    system_prompts: int = 4
    system_prompt_tokens: int = 1024
    p_system: float = 0.8
    tenants: int = 0
    priority_weights: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        _check_int("seed", self.seed, 0)
        _check_int("block_size", self.block_size, 1)
        _check_int("sessions", self.sessions, 1)
        _check_float("session_skew", self.session_skew, 0.0)
        _check_float("turns", self.turns, 1.0)
        _check_int("system_prompts", self.system_prompts, 0)
        _check_int("system_prompt_tokens", self.system_prompt_tokens, 0)
        _check_float("p_system", self.p_system, 0.0, 1.0)
        _check_int("tenants", self.tenants, 0)
        weights = self.priority_weights
        if (
            not isinstance(weights, tuple | list)
            or not weights
            or any(type(w) not in (int, float) or not math.isfinite(w) or w < 0 for w in weights)
            or sum(weights) <= 0
        ):
            raise WorkloadError(
                f"priority_weights must be a non-empty list of non-negative weights with a positive sum, "
                f"got {weights!r}"
            )
        object.__setattr__(self, "priority_weights", tuple(float(w) for w in weights))

    def to_dict(self) -> dict[str, Any]:
        """The parameters, JSON-serialisable."""
        params = asdict(self)
        params["priority_weights"] = list(self.priority_weights)
        return params


def _check_int(name: str, value: object, low: int) -> None:
    if type(value) is not int or value < low:
        raise WorkloadError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_float(name: str, value: object, low: float, high: float | None = None) -> None:
    if not isinstance(value, int | float) or type(value) is bool or not math.isfinite(value) or value < low:
        raise WorkloadError(f"{name} must be a number >= {low}, got {value!r}")
    if high is not None and value > high:
        raise WorkloadError(f"{name} must be a number <= {high}, got {value!r}")


@dataclass(slots=True)
class _Conversation:
    session: str
    tenant: str | None
    priority: int
    turns_left: int
    blocks: tuple[int, ...]
    input_len: int
    output_len: int


class _PrefixBuilder:
    """Runs a `PrefixModel` over a stream of requests.

    Per request: `slot()`; then `start()` and `first_turn()` for a new conversation, or
    `next_turn()` for an open one; then `request()`.
    """

    def __init__(self, model: PrefixModel, n_requests: int, rng: np.random.Generator) -> None:
        self.model = model
        self.next_key = 0
        system_blocks = model.system_prompt_tokens // model.block_size
        self.system_prompts = [self.fresh(system_blocks) for _ in range(model.system_prompts)]
        n = max(n_requests, 1)
        # Everything random is drawn up front, one array per quantity, indexed by request or by
        # conversation start (at most one per request), so that each is a pure function of the seed.
        self.slot_of = rng.choice(model.sessions, size=n, p=_zipf_weights(model.sessions, model.session_skew))
        self.turns_of = rng.geometric(1.0 / model.turns, size=n)
        self.system_of = np.where(
            rng.random(size=n) < model.p_system,
            rng.integers(0, max(model.system_prompts, 1), size=n),
            -1,
        )
        self.tenant_of = rng.integers(0, max(model.tenants, 1), size=n)
        weights = np.asarray(model.priority_weights)
        self.priority_of = rng.choice(len(weights), size=n, p=weights / weights.sum())
        self.slots: dict[int, _Conversation] = {}
        self.conversations = 0

    def fresh(self, n: int) -> tuple[int, ...]:
        start = self.next_key
        self.next_key += n
        return tuple(range(start, start + n))

    def slot(self, index: int) -> tuple[int, _Conversation | None]:
        """The slot request `index` goes to, and its open conversation (None: start a new one)."""
        slot = int(self.slot_of[index])
        conversation = self.slots.get(slot)
        if conversation is not None and conversation.turns_left <= 0:
            conversation = None
        return slot, conversation

    def start(self, slot: int) -> tuple[_Conversation, tuple[int, ...]]:
        """Open a new conversation in `slot`; returns it and its system-prompt blocks."""
        c = self.conversations
        self.conversations += 1
        model = self.model
        system = int(self.system_of[c])
        conversation = _Conversation(
            session=f"s{c}",
            tenant=f"t{int(self.tenant_of[c])}" if model.tenants else None,
            priority=int(self.priority_of[c]),
            turns_left=int(self.turns_of[c]),
            blocks=(),
            input_len=0,
            output_len=0,
        )
        self.slots[slot] = conversation
        return conversation, (self.system_prompts[system] if system >= 0 and self.system_prompts else ())

    def first_turn(
        self, conversation: _Conversation, system: tuple[int, ...], input_len: int
    ) -> tuple[int, ...]:
        """Blocks of a conversation's first turn: the system prompt's (as many as fit), then new ones."""
        n = input_len // self.model.block_size
        shared = system[:n]
        conversation.blocks = shared + self.fresh(n - len(shared))
        return conversation.blocks

    def next_turn(self, conversation: _Conversation, input_len: int) -> tuple[int, ...]:
        """Blocks of a later turn of `input_len` tokens; the conversation keeps the longer prefix."""
        n = input_len // self.model.block_size
        previous = conversation.blocks
        if n <= len(previous):
            return previous[:n]
        conversation.blocks = previous + self.fresh(n - len(previous))
        return conversation.blocks

    def request(
        self,
        index: int,
        arrival_s: float,
        blocks: tuple[int, ...],
        input_len: int,
        output_len: int,
        conversation: _Conversation,
    ) -> SimRequest:
        conversation.turns_left -= 1
        conversation.input_len = input_len
        conversation.output_len = output_len
        return SimRequest(
            request_id=index,
            arrival_s=arrival_s,
            block_hashes=blocks,
            input_len=input_len,
            output_len=output_len,
            tenant=conversation.tenant,
            priority=conversation.priority,
            session=conversation.session,
        )


def _apply_prefix_model(
    model: PrefixModel, arrivals: Sequence[float], input_lens: Sequence[int], output_lens: Sequence[int]
) -> list[SimRequest]:
    """Requests with given arrivals and lengths (Azure), their prefixes drawn from `model`."""
    builder = _PrefixBuilder(model, len(arrivals), np.random.default_rng(model.seed))
    requests = []
    for i, (arrival_s, input_len, output_len) in enumerate(
        zip(arrivals, input_lens, output_lens, strict=True)
    ):
        slot, conversation = builder.slot(i)
        if conversation is None:
            conversation, system = builder.start(slot)
            blocks = builder.first_turn(conversation, system, input_len)
        else:
            blocks = builder.next_turn(conversation, input_len)
        requests.append(builder.request(i, arrival_s, blocks, input_len, output_len, conversation))
    return requests


# --------------------------------------------------------------------------- Azure

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
    """The columns the reader keeps of an Azure trace, row by row."""

    stamps: list[tuple[int, float]] = field(default_factory=list)
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)


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
            out.stamps.append(_azure_time(row[i_time], days))
        except ValueError:
            raise WorkloadError(f"{where}: bad TIMESTAMP {shown(row[i_time])}") from None
        for name, column, lens in (
            ("ContextTokens", i_context, out.input_lens),
            ("GeneratedTokens", i_generated, out.output_lens),
        ):
            try:
                value = int(row[column])
            except ValueError:
                raise WorkloadError(f"{where}: {name} must be an integer, got {shown(row[column])}") from None
            if value < 0:
                raise WorkloadError(f"{where}: {name} is negative ({value})")
            lens.append(value)
        if limit is not None and len(out.stamps) >= limit:
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
        The workload, sorted by arrival; `request_id` is the row's index in the file.

    Raises:
        WorkloadError: The file cannot be read or a row is malformed (``path:line: ...``).
    """
    _check_limit(limit)
    model = prefix_model if prefix_model is not None else PrefixModel()
    with TraceLines(path) as lines:
        rows = _read_azure_rows(lines, path, limit)
        digest = lines.sha256()
    if not rows.stamps and limit != 0:
        raise WorkloadError(f"{path}: no rows after the header")
    first_day, first_s = min(rows.stamps, default=(0, 0.0))
    arrivals = [round((day - first_day) * 86400 + s - first_s, 7) for day, s in rows.stamps]
    requests = _apply_prefix_model(model, arrivals, rows.input_lens, rows.output_lens)
    return Workload(
        requests=_sorted_by_arrival(requests),
        block_size=model.block_size,
        source="azure",
        path=str(path),
        params={"limit": limit, "prefix_model": model.to_dict()},
        sha256=digest,
    )
