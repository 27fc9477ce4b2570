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
- `synthetic(...)`: Poisson, bursty or periodic arrivals over the same `PrefixModel`, with
  lognormal lengths and multi-turn sessions.
- `preset("spec")`: the module spec's benchmark scenario (1000 sequences of 10 blocks).
- `load(source, path=..., **params)`: one entry point by name, for the CLI.

Bad input raises `WorkloadError` (a `ValueError`) with a one-line message; for a file it
reads ``path:line: what is wrong``.

Pure Python and numpy; imports neither torch nor the rest of `engine_adapter`.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import itertools
import json
import math
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ARRIVALS",
    "AZURE_COLUMNS",
    "MOONCAKE_BLOCK_SIZE",
    "PRESETS",
    "SOURCES",
    "PrefixModel",
    "SimRequest",
    "Workload",
    "WorkloadError",
    "load",
    "preset",
    "read_azure",
    "read_mooncake",
    "spec_benchmark",
    "synthetic",
    "total_block_lookups",
    "unique_blocks",
]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per `hash_ids` entry in the Mooncake traces."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
ARRIVALS = ("poisson", "bursty", "periodic")
"""Arrival processes of `synthetic`."""


class WorkloadError(ValueError):
    """A trace that cannot be read or a workload parameter that cannot be used."""


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
    if any(a.arrival_s > b.arrival_s for a, b in itertools.pairwise(requests)):
        requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep their source order
    return requests


def _read_text(path: str | Path) -> tuple[str, str]:
    """The file's text and sha256, with I/O and decoding errors as `WorkloadError`."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise WorkloadError(f"{path}:{line}: not UTF-8 text") from None
    return text, hashlib.sha256(raw).hexdigest()


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
    raise WorkloadError(f"{where}: {name!r} must be a string, an integer or null, got {value!r}")


def _mooncake_request(record: object, request_id: int, where: str) -> SimRequest:
    if not isinstance(record, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in record:
            raise WorkloadError(f"{where}: missing field {name!r}")
    timestamp = record["timestamp"]
    if type(timestamp) not in (int, float) or not math.isfinite(timestamp):
        raise WorkloadError(f"{where}: 'timestamp' must be a number of milliseconds, got {timestamp!r}")
    if timestamp < 0:
        raise WorkloadError(f"{where}: 'timestamp' is negative ({timestamp})")
    input_len = record["input_length"]
    output_len = record["output_length"]
    for name, value in (("input_length", input_len), ("output_length", output_len)):
        if not _is_int(value):
            raise WorkloadError(f"{where}: {name!r} must be an integer, got {value!r}")
        if value < 0:
            raise WorkloadError(f"{where}: {name!r} is negative ({value})")
    hash_ids = record["hash_ids"]
    if type(hash_ids) is not list:
        raise WorkloadError(f"{where}: 'hash_ids' must be a list of integers, got {hash_ids!r}")
    for hash_id in hash_ids:
        if not _is_int(hash_id):
            raise WorkloadError(f"{where}: 'hash_ids' must hold integers, found {hash_id!r}")
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
        raise WorkloadError(f"{where}: 'priority' must be an integer, got {priority!r}")
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
    (string or integer) and `priority` (integer). Blank lines are skipped.

    Args:
        path: The `.jsonl` file.
        limit: Read at most this many requests (in file order).

    Returns:
        The workload, sorted by arrival; `request_id` is the record's index in the file.

    Raises:
        WorkloadError: The file cannot be read or a line is malformed (``path:line: ...``).
    """
    _check_limit(limit)
    text, digest = _read_text(path)
    requests: list[SimRequest] = []
    loads = json.loads
    for lineno, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        try:
            record = loads(line)
        except ValueError as exc:
            raise WorkloadError(f"{path}:{lineno}: bad JSON: {exc}") from None
        requests.append(_mooncake_request(record, len(requests), f"{path}:{lineno}"))
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


def read_azure(
    path: str | Path, *, prefix_model: PrefixModel | None = None, limit: int | None = None
) -> Workload:
    """Read an Azure LLM inference trace (CSV) and give it prefixes from a `PrefixModel`.

    Columns (any order, others ignored): `TIMESTAMP` (``YYYY-MM-DD HH:MM:SS.fffffff``),
    `ContextTokens`, `GeneratedTokens`. Arrivals are seconds after the earliest timestamp.

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
    text, digest = _read_text(path)
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None:
        raise WorkloadError(f"{path}: empty file, expected the header {','.join(AZURE_COLUMNS)}")
    columns = [name.strip() for name in header]
    missing = [name for name in AZURE_COLUMNS if name not in columns]
    if missing:
        raise WorkloadError(
            f"{path}:1: header lacks column(s) {', '.join(missing)} (found: {', '.join(columns)})"
        )
    i_time, i_context, i_generated = (columns.index(name) for name in AZURE_COLUMNS)
    width = len(columns)
    stamps: list[tuple[int, float]] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    days: dict[str, int] = {}
    for row in reader:
        if limit is not None and len(stamps) >= limit:
            break
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{path}:{reader.line_num}"
        if len(row) != width:
            raise WorkloadError(f"{where}: {len(row)} fields, the header has {width}")
        try:
            stamps.append(_azure_time(row[i_time], days))
        except ValueError:
            raise WorkloadError(f"{where}: bad TIMESTAMP {row[i_time]!r}") from None
        for name, column, out in (
            ("ContextTokens", i_context, input_lens),
            ("GeneratedTokens", i_generated, output_lens),
        ):
            try:
                value = int(row[column])
            except ValueError:
                raise WorkloadError(f"{where}: {name} must be an integer, got {row[column]!r}") from None
            if value < 0:
                raise WorkloadError(f"{where}: {name} is negative ({value})")
            out.append(value)
    if not stamps and limit != 0:
        raise WorkloadError(f"{path}: no rows after the header")
    first_day, first_s = min(stamps, default=(0, 0.0))
    arrivals = [round((day - first_day) * 86400 + s - first_s, 7) for day, s in stamps]
    requests = _apply_prefix_model(model, arrivals, input_lens, output_lens)
    return Workload(
        requests=_sorted_by_arrival(requests),
        block_size=model.block_size,
        source="azure",
        path=str(path),
        params={"limit": limit, "prefix_model": model.to_dict()},
        sha256=digest,
    )


# --------------------------------------------------------------------------- synthetic


def _arrival_times(
    kind: str,
    rate: float,
    burstiness: float,
    requests: int | None,
    duration: float | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times from 0: `requests` of them, or those before `duration`, whichever ends first."""

    def gaps(n: int) -> np.ndarray:
        if kind == "poisson":
            drawn: np.ndarray = rng.exponential(1.0 / rate, size=n)
        elif kind == "bursty":  # gamma inter-arrivals with coefficient of variation `burstiness`
            shape = 1.0 / burstiness**2
            drawn = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        else:
            drawn = np.full(n, 1.0 / rate)
        return drawn

    if requests is not None:
        times = np.concatenate(([0.0], np.cumsum(gaps(requests - 1)))) if requests else np.zeros(0)
        if duration is not None:
            times = times[times < duration]
        return times
    assert duration is not None  # checked by the caller
    chunk = int(rate * duration * 1.1) + 64
    times = np.concatenate(([0.0], np.cumsum(gaps(chunk))))
    while times[-1] < duration:
        times = np.concatenate((times, times[-1] + np.cumsum(gaps(chunk))))
    end: int = int(np.searchsorted(times, duration, side="left"))
    return times[:end]


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, n: int, low: int) -> np.ndarray:
    """Integer lengths from a lognormal with the given mean, at least `low`."""
    mu = math.log(mean) - sigma**2 / 2
    drawn: np.ndarray = np.maximum(np.rint(rng.lognormal(mu, sigma, size=n)), low).astype(np.int64)
    return drawn


def synthetic(
    *,
    requests: int | None = 1000,
    rate: float = 10.0,
    duration: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 4.0,
    input_tokens: float = 512.0,
    input_sigma: float = 1.0,
    turn_tokens: float = 128.0,
    output_tokens: float = 128.0,
    output_sigma: float = 0.8,
    max_input_tokens: int = 32768,
    seed: int = 0,
    block_size: int = 16,
    sessions: int = 64,
    session_skew: float = 1.0,
    turns: float = 4.0,
    system_prompts: int = 4,
    system_prompt_tokens: int = 1024,
    p_system: float = 0.8,
    tenants: int = 1,
    priority_weights: Sequence[float] = (1.0,),
) -> Workload:
    """A seeded synthetic workload: arrivals, lengths and the `PrefixModel`'s prefix structure.

    A first turn's prompt is its system prompt (if any) plus lognormal user tokens (mean
    `input_tokens`); a later turn's prompt is the previous prompt, the previous output and
    lognormal new tokens (mean `turn_tokens`), so it extends the previous prompt's blocks. A
    turn that would exceed `max_input_tokens` opens a new conversation instead. Outputs are
    lognormal (mean `output_tokens`, at least 1). Arrivals, lengths and prefixes use separate
    random streams derived from `seed`, so changing the rate does not change the prefixes.

    Args:
        requests: Number of requests (None: as many as arrive within `duration`).
        rate: Mean arrival rate, requests per second.
        duration: Stop at this many seconds (None: stop after `requests`).
        arrival: `"poisson"` (exponential gaps), `"bursty"` (gamma gaps with coefficient of
            variation `burstiness`) or `"periodic"` (a request every `1 / rate` seconds).
        burstiness: Coefficient of variation of the gaps for `"bursty"` (> 1 is burstier than
            Poisson).
        input_tokens: Mean user tokens of a first turn.
        input_sigma: Sigma of the lognormal of user tokens (first and later turns).
        turn_tokens: Mean new user tokens of a later turn.
        output_tokens: Mean output tokens.
        output_sigma: Sigma of the lognormal of output tokens.
        max_input_tokens: Longest prompt a conversation may grow to.
        seed: Seed of everything random.
        block_size, sessions, session_skew, turns, system_prompts, system_prompt_tokens,
            p_system, tenants, priority_weights: The `PrefixModel` fields (`tenants` defaults
            to 1 here: a single tenant `"t0"`).

    Returns:
        The workload, sorted by arrival.

    Raises:
        WorkloadError: A parameter is out of range.
    """
    if requests is None and duration is None:
        raise WorkloadError("synthetic needs requests or duration (or both)")
    if requests is not None:
        _check_int("requests", requests, 1)
    if duration is not None:
        _check_float("duration", duration, 0.0)
        if duration <= 0:
            raise WorkloadError(f"duration must be > 0, got {duration!r}")
    _check_float("rate", rate, 0.0)
    if rate <= 0:
        raise WorkloadError(f"rate must be > 0 requests/s, got {rate!r}")
    if arrival not in ARRIVALS:
        raise WorkloadError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    _check_float("burstiness", burstiness, 0.0)
    if burstiness <= 0:
        raise WorkloadError(f"burstiness must be > 0, got {burstiness!r}")
    for name, value in (
        ("input_tokens", input_tokens),
        ("turn_tokens", turn_tokens),
        ("output_tokens", output_tokens),
    ):
        _check_float(name, value, 1.0)
    _check_float("input_sigma", input_sigma, 0.0)
    _check_float("output_sigma", output_sigma, 0.0)
    _check_int("max_input_tokens", max_input_tokens, 1)
    _check_int("seed", seed, 0)
    model = PrefixModel(
        seed=seed,
        block_size=block_size,
        sessions=sessions,
        session_skew=session_skew,
        turns=turns,
        system_prompts=system_prompts,
        system_prompt_tokens=system_prompt_tokens,
        p_system=p_system,
        tenants=tenants,
        priority_weights=tuple(priority_weights),
    )
    arrival_rng, length_rng, prefix_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    arrivals = _arrival_times(arrival, rate, burstiness, requests, duration, arrival_rng).tolist()
    n = len(arrivals)
    user_tokens = _lognormal_tokens(length_rng, input_tokens, input_sigma, n, 1).tolist()
    new_tokens = _lognormal_tokens(length_rng, turn_tokens, input_sigma, n, 1).tolist()
    output_lens = _lognormal_tokens(length_rng, output_tokens, output_sigma, n, 1).tolist()

    builder = _PrefixBuilder(model, n, prefix_rng)
    system_tokens = model.system_prompt_tokens
    out: list[SimRequest] = []
    for i, arrival_s in enumerate(arrivals):
        slot, conversation = builder.slot(i)
        if conversation is not None:
            input_len = conversation.input_len + conversation.output_len + new_tokens[i]
            if input_len > max_input_tokens:
                conversation = None
            else:
                blocks = builder.next_turn(conversation, input_len)
        if conversation is None:
            conversation, system = builder.start(slot)
            input_len = min((system_tokens if system else 0) + user_tokens[i], max_input_tokens)
            blocks = builder.first_turn(conversation, system, input_len)
        out.append(builder.request(i, arrival_s, blocks, input_len, output_lens[i], conversation))
    params: dict[str, Any] = {
        "requests": requests,
        "rate": rate,
        "duration": duration,
        "arrival": arrival,
        "burstiness": burstiness,
        "input_tokens": input_tokens,
        "input_sigma": input_sigma,
        "turn_tokens": turn_tokens,
        "output_tokens": output_tokens,
        "output_sigma": output_sigma,
        "max_input_tokens": max_input_tokens,
        **model.to_dict(),
    }
    return Workload(requests=out, block_size=model.block_size, source="synthetic", params=params)


# --------------------------------------------------------------------------- presets


def spec_benchmark(
    *,
    sequences: int = 1000,
    blocks_per_sequence: int = 10,
    max_access_count: int = 10,
    priorities: int = 3,
    duration: float = 60.0,
    output_tokens: int = 32,
    block_size: int = 16,
    tenants: int = 0,
    seed: int = 0,
) -> Workload:
    """The module spec's benchmark scenario ("Benchmark 场景" of the module spec) as a request stream.

    Sequence `i` owns blocks `i*10 .. i*10+9` (the spec's `block_ids`), has a priority drawn
    uniformly from `0 .. priorities-1` and an access count drawn uniformly from
    `1 .. max_access_count`. Each access is one request for the whole sequence prefix (session
    `"seq{i}"`), at a time uniform over `[0, duration)` (the spec's `--duration 60`); an access
    after the first finds the blocks in cache unless they were evicted, which is the
    re-prefill the spec measures. The spec names no tenants; `tenants > 0` assigns sequence
    `i` to tenant `"t{i % tenants}"`.

    Args:
        sequences: Number of sequences.
        blocks_per_sequence: Blocks of each sequence's prompt.
        max_access_count: Largest access count (the spec's `random.randint(1, 10)`).
        priorities: Number of priority levels (the spec's `random.randint(0, 2)`).
        duration: Seconds over which the accesses arrive.
        output_tokens: Output tokens of every request (the spec names none).
        block_size: Tokens per block.
        tenants: Tenants to spread the sequences over (0: none).
        seed: Seed of the draws.

    Returns:
        The workload, sorted by arrival.
    """
    for name, value, low in (
        ("sequences", sequences, 1),
        ("blocks_per_sequence", blocks_per_sequence, 1),
        ("max_access_count", max_access_count, 1),
        ("priorities", priorities, 1),
        ("output_tokens", output_tokens, 0),
        ("block_size", block_size, 1),
        ("tenants", tenants, 0),
        ("seed", seed, 0),
    ):
        _check_int(name, value, low)
    _check_float("duration", duration, 0.0)
    rng = np.random.default_rng(seed)
    priority_of = rng.integers(0, priorities, size=sequences).tolist()
    count_of = rng.integers(1, max_access_count + 1, size=sequences)
    sequence_of = np.repeat(np.arange(sequences), count_of)
    arrivals = rng.uniform(0.0, duration, size=len(sequence_of))
    order = np.argsort(arrivals, kind="stable")
    blocks = [tuple(range(i * blocks_per_sequence, (i + 1) * blocks_per_sequence)) for i in range(sequences)]
    input_len = blocks_per_sequence * block_size
    requests = [
        SimRequest(
            request_id=request_id,
            arrival_s=float(arrivals[k]),
            block_hashes=blocks[seq],
            input_len=input_len,
            output_len=output_tokens,
            tenant=f"t{seq % tenants}" if tenants else None,
            priority=priority_of[seq],
            session=f"seq{seq}",
        )
        for request_id, (k, seq) in enumerate(zip(order.tolist(), sequence_of[order].tolist(), strict=True))
    ]
    params = {
        "sequences": sequences,
        "blocks_per_sequence": blocks_per_sequence,
        "max_access_count": max_access_count,
        "priorities": priorities,
        "duration": duration,
        "output_tokens": output_tokens,
        "block_size": block_size,
        "tenants": tenants,
        "seed": seed,
    }
    return Workload(requests=requests, block_size=block_size, source="spec", params=params)


PRESETS: dict[str, Callable[..., Workload]] = {"spec": spec_benchmark}
"""Named workloads: name -> function taking keyword params (all with defaults) and `seed`."""


def preset(name: str, *, seed: int = 0, **params: Any) -> Workload:
    """A named workload from `PRESETS`, e.g. ``preset("spec", seed=1)``.

    Raises:
        WorkloadError: An unknown name or param.
    """
    try:
        build = PRESETS[name]
    except KeyError:
        raise WorkloadError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
    _reject_unknown(_annotations(build), params, f"preset {name!r}")
    return build(seed=seed, **params)


# --------------------------------------------------------------------------- by name

SOURCES = ("mooncake", "azure", "synthetic")


def _annotations(build: Callable[..., Any]) -> dict[str, str]:
    """Keyword params of `build` (a source function) and their annotations, as strings."""
    return {
        name: str(param.annotation)
        for name, param in inspect.signature(build).parameters.items()
        if param.kind is param.KEYWORD_ONLY
    }


def _reject_unknown(accepted: Iterable[str], params: dict[str, Any], what: str) -> None:
    names = list(accepted)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise WorkloadError(f"{what} takes no param(s) {', '.join(unknown)}; params: {', '.join(names)}")


def _coerce(what: str, name: str, value: Any, annotation: str) -> Any:
    """A CLI string turned into the type its annotation names; other values pass unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "None" in annotation and text.lower() in ("none", "null", ""):
        return None
    try:
        if annotation.startswith(("int", "float")):
            number = float(text) if annotation.startswith("float") else int(text)
            return number
        if "[float" in annotation:  # a list of weights: "0.5/0.3/0.2" (a comma may separate params)
            return tuple(float(item) for item in re.split(r"[/;\s]+", text) if item)
    except ValueError:
        raise WorkloadError(f"{what}: param {name}={value!r} is not a valid {annotation}") from None
    return value


def _checked_params(what: str, accepted: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
    _reject_unknown(accepted, params, what)
    return {name: _coerce(what, name, value, accepted[name]) for name, value in params.items()}


def load(source: str, *, path: str | Path | None = None, **params: Any) -> Workload:
    """A workload by source name, for the CLI.

    String values (as a CLI reads them) are converted to the param's type: numbers, ``none``
    for an optional param, and weights as ``0.5/0.3/0.2``.

    Args:
        source: `"mooncake"`, `"azure"`, `"synthetic"` or a preset name (`PRESETS`). A path
            ending in `.jsonl` or `.csv` stands for `mooncake` or `azure` with that path.
        path: The trace file of `mooncake` and `azure`.
        **params: The source's keyword params; for `azure`, `limit` and the `PrefixModel`
            fields.

    Raises:
        WorkloadError: An unknown source or param, a missing path, or a bad trace.
    """
    if path is None and source.endswith((".jsonl", ".csv")):
        source, path = ("mooncake" if source.endswith(".jsonl") else "azure"), source
    if source in ("mooncake", "azure"):
        if path is None:
            raise WorkloadError(f"the {source} source needs a trace file path")
        if source == "mooncake":
            return read_mooncake(path, **_checked_params("mooncake", _annotations(read_mooncake), params))
        model_fields = {f.name: str(f.type) for f in fields(PrefixModel)}
        checked = _checked_params("azure", {"limit": "int | None", **model_fields}, params)
        limit = checked.pop("limit", None)
        return read_azure(path, prefix_model=PrefixModel(**checked), limit=limit)
    if path is not None:
        raise WorkloadError(f"the {source} source reads no file (got path {str(path)!r})")
    if source == "synthetic":
        return synthetic(**_checked_params("synthetic", _annotations(synthetic), params))
    if source in PRESETS:
        return preset(source, **_checked_params(f"preset {source!r}", _annotations(PRESETS[source]), params))
    known = ", ".join([*SOURCES, *sorted(PRESETS)])
    raise WorkloadError(f"unknown workload source {source!r}; sources: {known}")
