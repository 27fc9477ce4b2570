"""Request streams for the simulator: the records every source returns, and their checks.

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

Sources, one module each:

- `read_mooncake(path)` (`engine_adapter.sim.mooncake_trace`): the native format
  (docs/architecture.md, "Simulator"), one JSON object per line.
- `read_azure(path, prefix_model=PrefixModel())` (`engine_adapter.sim.azure_trace`): the Azure
  LLM inference CSV; it has arrival times and lengths only, so a seeded `PrefixModel`
  (`engine_adapter.sim.prefix_model`) supplies the prefix structure.
- `synthetic(...)` and `preset("spec")` (`engine_adapter.sim.synthetic`): Poisson, bursty or
  periodic arrivals over the same `PrefixModel`, with lognormal lengths and multi-turn sessions;
  the module spec's benchmark scenario (1000 sequences of 10 blocks).
- `load(source, path=..., **params)` (`engine_adapter.sim.sources`): one entry point by name,
  for the CLI.

The trace readers stream the file line by line (`engine_adapter.sim.trace_file`): memory holds
the parsed requests and one line, never the file's text (a 300 MB Mooncake trace of 200,000
requests: 86 MB peak RSS, against 673 MB when the text was read whole). The readers and the
generators fill a `RequestTable` (`engine_adapter.sim.request_table`): every request's keys in
one int32 or int64 array, its fields as columns, each `SimRequest` built when asked for (the
Azure reader and the generators from the prefix model's turns, no `SimRequest` or tuple of keys
per request held); `mooncake_stream` and `synthetic_stream` yield `SimRequest`s one at a time.
What a row derives from the lookup stream is computed from the table's arrays where there is
one, and built only for the rows that need it (`lookup_keys`, the future of an offline policy;
`next_use_positions`, the radix Belady's one int64 array):
docs/performance.md, "Simulator throughput and memory" and "Traces as arrays". Requests are
sorted only when the file is not already in arrival order (the Mooncake traces are:
`sorted_by_arrival`, `RequestTable.sorted_by_arrival`). With `limit`, parsing stops after that
many requests; the rest of the file is only hashed (in 256 KiB chunks), so `Workload.sha256` is
the whole file's digest whatever the limit.

Bad input raises `WorkloadError` (a `ValueError`) with a one-line message; for a file it
reads ``path:line: what is wrong``, values from the file cut short. That includes a line nested
deeper than the JSON parser recurses (``bad JSON: nested too deeply``) and a CSV field beyond
the `csv` module's limit. `check_int`, `check_float` and `check_limit` are the parameter checks
the sources share.

Pure Python; imports only `engine_adapter.sim.trace_file` and `sage_eviction.flat` (its int64
key check), never torch or the rest of `engine_adapter`.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine_adapter.sim.trace_file import WorkloadError
from sage_eviction.flat import int64_keys as flat_int64_keys

__all__ = [
    "SimRequest",
    "Workload",
    "WorkloadError",
    "check_float",
    "check_int",
    "check_limit",
    "RequestColumns",
    "any_contract",
    "any_tenant",
    "int64_keys",
    "lookup_keys",
    "next_use_positions",
    "request_ends",
    "sorted_by_arrival",
    "total_block_lookups",
    "unique_blocks",
]


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
        token_ids: The prompt's tokens followed by the tokens generated for it, where the source
            carries tokens (`engine_adapter.sim.twins.chats`); the engine twins hash every block
            the request fills from them, decode blocks included. None: block keys only.
        cache_salt: Its isolation key (`engine_adapter.sim.contracts`): the trace readers have
            applied it to `block_hashes` already (`salted_keys`); kept for the row and the cache.
        cache_ttl_s: The minimum lifetime (s) it asks for the blocks it writes or hits; None: none.
        cache_breakpoint: Explicit mode: only its first `cache_breakpoint` prompt tokens are
            written to the cache; None: the whole prompt (implicit mode).
    """

    request_id: int
    arrival_s: float
    block_hashes: tuple[Hashable, ...]
    input_len: int
    output_len: int
    tenant: str | None = None
    priority: int = 0
    session: str | None = None
    token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None
    cache_ttl_s: float | None = None
    cache_breakpoint: int | None = None

    @property
    def has_contract(self) -> bool:
        """Whether it carries a prompt-cache contract field (salt, lifetime or breakpoint)."""
        fields = (self.cache_salt, self.cache_ttl_s, self.cache_breakpoint)
        return any(field is not None for field in fields)


@runtime_checkable
class RequestColumns(Protocol):
    """Requests held as columns (`engine_adapter.sim.request_table.RequestTable`): what the
    functions below derive from the lookup stream, computed from its arrays."""

    def unique_blocks(self) -> int: ...
    def total_block_lookups(self) -> int: ...
    def lookup_keys(self) -> list[Hashable]: ...
    def next_use_positions(self) -> array[int]: ...
    def request_ends(self) -> array[int]: ...
    def summary(self) -> dict[str, Any]: ...
    def has_tenants(self) -> bool: ...
    def int64_keys(self) -> bool: ...
    def has_contracts(self) -> bool: ...


class RequestList(Protocol):
    """What a run keeps of its requests (`RunState.requests`): a list, a fleet replica's that
    grows as requests are routed to it, or a workload's `RequestTable`."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> SimRequest: ...
    def append(self, request: SimRequest, /) -> None: ...


def unique_blocks(requests: Iterable[SimRequest]) -> int:
    """Distinct block keys over all requests (the compulsory misses of an unbounded cache)."""
    if isinstance(requests, RequestColumns):
        return requests.unique_blocks()
    seen: set[Hashable] = set()
    for request in requests:
        seen.update(request.block_hashes)
    return len(seen)


def any_contract(requests: Iterable[SimRequest]) -> bool:
    """Whether some request carries a prompt-cache contract field (`SimRequest.has_contract`)."""
    if isinstance(requests, RequestColumns):
        return requests.has_contracts()
    return any(r.has_contract for r in requests)


def total_block_lookups(requests: Iterable[SimRequest]) -> int:
    """Block keys looked up over all requests, repeats included."""
    if isinstance(requests, RequestColumns):
        return requests.total_block_lookups()
    return sum(len(request.block_hashes) for request in requests)


def int64_keys(requests: Iterable[SimRequest]) -> bool:
    """Whether every block key is an int within int64 (every shipped source's are: Mooncake hash
    ids, the generators' counters), so the flat cache may keep its policy's state in C. A
    `RequestTable` knows from its key array; a list's keys are looked over once
    (`sage_eviction.flat.int64_keys`)."""
    if isinstance(requests, RequestColumns):
        return requests.int64_keys()
    return flat_int64_keys(lookup_keys(requests))


def lookup_keys(requests: Iterable[SimRequest]) -> list[Hashable]:
    """The block lookup sequence: every request's keys in order, the future an offline policy is
    given. Built only for the rows that need it (8 bytes a lookup: 160 MB for 2 x 10^7)."""
    if isinstance(requests, RequestColumns):
        return requests.lookup_keys()
    return [key for request in requests for key in request.block_hashes]


def next_use_positions(requests: Sequence[SimRequest]) -> array[int]:
    """For each position of the block lookup sequence (`lookup_keys`), the position of the same
    key's next lookup, or the sequence's length when there is none: one int64 array (8 bytes a
    lookup), filled in one pass from the end; memory besides it is one entry per distinct key.
    A `RequestTable` computes it from its key array (a stable sort)."""
    if isinstance(requests, RequestColumns):
        return requests.next_use_positions()
    n = total_block_lookups(requests)
    after = array("q", bytes(8 * n))
    seen: dict[Hashable, int] = {}
    position = n
    for request in reversed(requests):
        for key in reversed(request.block_hashes):
            position -= 1
            after[position] = seen.get(key, n)
            seen[key] = position
    return after


@dataclass(slots=True)
class Workload:
    """A request stream sorted by arrival, and where it came from.

    Iterating yields the `SimRequest`s in arrival order; `len()` is their number.

    Attributes:
        requests: The requests, sorted by `arrival_s`: a list of `SimRequest`s, or a
            `RequestTable` (the trace readers': the keys in one integer array, the fields as
            columns, each `SimRequest` built when asked for).
        block_size: Tokens that one block key stands for.
        source: `"mooncake"`, `"azure"`, `"synthetic"` or a preset name.
        path: The trace file, for the file sources.
        params: The parameters the workload was built with (JSON-serialisable).
        sha256: Digest of the trace file, for the file sources.
    """

    requests: Sequence[SimRequest]
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
        head = {
            "source": self.source,
            "path": self.path,
            "sha256": self.sha256,
            "params": dict(self.params),
            "block_size": self.block_size,
            "requests": len(requests),
            "unique_blocks": unique_blocks(requests),
            "total_block_lookups": total_block_lookups(requests),
        }
        if isinstance(requests, RequestColumns):
            return {**head, **requests.summary()}
        arrivals = [r.arrival_s for r in requests]
        return {
            **head,
            "prompt_tokens": sum(r.input_len for r in requests),
            "output_tokens": sum(r.output_len for r in requests),
            "duration_s": (arrivals[-1] - arrivals[0]) if arrivals else 0.0,
            "tenants": len({r.tenant for r in requests if r.tenant is not None}),
            "sessions": len({r.session for r in requests if r.session is not None}),
        }


def any_tenant(requests: Iterable[SimRequest]) -> bool:
    """Whether some request has a tenant."""
    if isinstance(requests, RequestColumns):
        return requests.has_tenants()
    return any(r.tenant is not None for r in requests)


def request_ends(requests: Sequence[SimRequest]) -> array[int]:
    """Each request's end in the block lookup sequence (the running sum of its lengths)."""
    if isinstance(requests, RequestColumns):
        return requests.request_ends()
    return array("q", itertools.accumulate(len(r.block_hashes) for r in requests))


def sorted_by_arrival(requests: list[SimRequest]) -> list[SimRequest]:
    """The requests in arrival order: the list itself, sorted in place only when it is not already
    (the Mooncake traces are), so no second copy of a large trace is made."""
    if any(a.arrival_s > b.arrival_s for a, b in itertools.pairwise(requests)):
        requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep their source order
    return requests


def check_limit(limit: int | None) -> None:
    """A trace reader's `limit`: None or an integer >= 0."""
    if limit is not None and (type(limit) is not int or limit < 0):
        raise WorkloadError(f"limit must be a non-negative integer or None, got {limit!r}")


def check_int(name: str, value: object, low: int) -> None:
    """A parameter that must be an integer >= `low` (bool refused)."""
    if type(value) is not int or value < low:
        raise WorkloadError(f"{name} must be an integer >= {low}, got {value!r}")


def check_float(name: str, value: object, low: float, high: float | None = None) -> None:
    """A parameter that must be a finite number within [`low`, `high`] (bool refused)."""
    if not isinstance(value, int | float) or type(value) is bool or not math.isfinite(value) or value < low:
        raise WorkloadError(f"{name} must be a number >= {low}, got {value!r}")
    if high is not None and value > high:
        raise WorkloadError(f"{name} must be a number <= {high}, got {value!r}")
