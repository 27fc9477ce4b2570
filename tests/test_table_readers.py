"""The Azure reader and the generators fill a `RequestTable` (issue 34, item 3), against the lists
of `SimRequest`s they built before.

- References kept here: the list-building code the table replaced (the Azure reader's rows, its
  arrivals and `apply_prefix_model` as a list; the synthetic generator's loop; the spec
  benchmark's list), and frozen fingerprints of workloads the list code built before the change
  (`_GOLDEN`: every field of every request, seed for seed).
- Hypothesis: `read_azure` over small CSVs (out of order, across midnight, short fractions,
  `limit`) and `PrefixModel` parameters, `synthetic` and `spec_benchmark` over their parameters:
  the table equals the reference list, request for request, and its keys are one int32 array.
- Rows: the same row, field for field (timings aside), from the table and from the list, radix
  and flat, lru, s3fifo and Belady (whose future comes from the table's arrays).
- Errors: a malformed row is refused with ``path:line:``, the rows after it unread; a length
  beyond int64 likewise.
- Memory: what the reader keeps of an Azure-like trace (tracemalloc, in process) is under a bound
  the list of objects exceeds in the same test; slow: the peak RSS of reading or generating 10^5
  requests in a child process.
"""

from __future__ import annotations

import csv
import gc
import hashlib
import json
import math
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_strategies import synthetic_params

from engine_adapter.sim.azure_trace import _azure_time, read_azure
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.prefix_model import PrefixBuilder, PrefixModel
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import (
    _arrival_times,
    _lognormal_tokens,
    _prefix_model,
    _Traffic,
    preset,
    spec_benchmark,
    synthetic,
)
from engine_adapter.sim.trace_file import TraceLines
from engine_adapter.sim.workloads import (
    SimRequest,
    Workload,
    WorkloadError,
    sorted_by_arrival,
    total_block_lookups,
    unique_blocks,
)

ROOT = Path(__file__).resolve().parents[1]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}

# ---------------------------------------------------------------------- the list references


def _azure_list(path: Path, model: PrefixModel, limit: int | None = None) -> list[SimRequest]:
    """`read_azure` as it was: the rows' stamps as a list of tuples, the arrivals from the
    earliest, the prefix model's requests as a list, sorted in place."""
    with TraceLines(path) as lines:
        rows = list(csv.reader(lines))
    names = [name.strip() for name in rows[0]]
    i_time, i_in, i_out = (names.index(n) for n in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    days: dict[str, int] = {}
    stamps: list[tuple[int, float]] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    for row in rows[1:]:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if limit is not None and len(stamps) >= limit:
            break
        stamps.append(_azure_time(row[i_time], days))
        input_lens.append(int(row[i_in]))
        output_lens.append(int(row[i_out]))
    first_day, first_s = min(stamps, default=(0, 0.0))
    arrivals = [round((day - first_day) * 86400 + s - first_s, 7) for day, s in stamps]
    builder = PrefixBuilder(model, len(arrivals), np.random.default_rng(model.seed))
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
        requests.append(SimRequest(*builder.turn(i, arrival_s, blocks, input_len, output_len, conversation)))
    return sorted_by_arrival(requests)


_TRAFFIC_DEFAULTS: dict[str, Any] = {
    "requests": 1000,
    "rate": 10.0,
    "duration": None,
    "arrival": "poisson",
    "burstiness": 4.0,
    "input_tokens": 512.0,
    "input_sigma": 1.0,
    "turn_tokens": 128.0,
    "output_tokens": 128.0,
    "output_sigma": 0.8,
    "max_input_tokens": 32768,
    "seed": 0,
}
"""`synthetic`'s defaults for what `_Traffic` holds."""


def _synthetic_list(**params: Any) -> list[SimRequest]:
    """`synthetic`'s requests as its loop built them, a `SimRequest` each."""
    prefix = {k: params.pop(k) for k in list(params) if k not in _Traffic.__slots__}
    traffic = _Traffic(**{**_TRAFFIC_DEFAULTS, **params})
    model = _prefix_model(traffic.seed, prefix)
    seeds = np.random.SeedSequence(traffic.seed).spawn(3)
    arrival_rng, length_rng, prefix_rng = (np.random.default_rng(s) for s in seeds)
    t = traffic
    arrivals = _arrival_times(t.arrival, t.rate, t.burstiness, t.requests, t.duration, arrival_rng).tolist()
    n = len(arrivals)
    user = _lognormal_tokens(length_rng, t.input_tokens, t.input_sigma, n, 1).tolist()
    new = _lognormal_tokens(length_rng, t.turn_tokens, t.input_sigma, n, 1).tolist()
    out = _lognormal_tokens(length_rng, t.output_tokens, t.output_sigma, n, 1).tolist()
    builder = PrefixBuilder(model, n, prefix_rng)
    requests = []
    for i, arrival_s in enumerate(arrivals):
        slot, conversation = builder.slot(i)
        if conversation is not None:
            input_len = conversation.input_len + conversation.output_len + new[i]
            if input_len > t.max_input_tokens:
                conversation = None
            else:
                blocks = builder.next_turn(conversation, input_len)
        if conversation is None:
            conversation, system = builder.start(slot)
            input_len = min((model.system_prompt_tokens if system else 0) + user[i], t.max_input_tokens)
            blocks = builder.first_turn(conversation, system, input_len)
        requests.append(SimRequest(*builder.turn(i, arrival_s, blocks, input_len, out[i], conversation)))
    return requests


def _spec_list(
    sequences: int, blocks: int, accesses: int, priorities: int, tenants: int, seed: int
) -> list[SimRequest]:
    """`spec_benchmark`'s requests as its list built them (duration 60, output 32, block 16)."""
    rng = np.random.default_rng(seed)
    priority_of = rng.integers(0, priorities, size=sequences).tolist()
    count_of = rng.integers(1, accesses + 1, size=sequences)
    sequence_of = np.repeat(np.arange(sequences), count_of)
    arrivals = rng.uniform(0.0, 60.0, size=len(sequence_of))
    order = np.argsort(arrivals, kind="stable")
    keys = [tuple(range(i * blocks, (i + 1) * blocks)) for i in range(sequences)]
    return [
        SimRequest(
            rid,
            float(arrivals[k]),
            keys[seq],
            blocks * 16,
            32,
            f"t{seq % tenants}" if tenants else None,
            priority_of[seq],
            f"seq{seq}",
        )
        for rid, (k, seq) in enumerate(zip(order.tolist(), sequence_of[order].tolist(), strict=True))
    ]


# ---------------------------------------------------------------------- frozen fingerprints


def _fingerprint(requests: Any) -> str:
    digest = hashlib.sha256()
    for r in requests:
        fields = (r.request_id, r.arrival_s, r.block_hashes, r.input_len, r.output_len)
        digest.update(repr((*fields, r.tenant, r.priority, r.session, r.token_ids)).encode())
    return digest.hexdigest()[:16]


_GOLDEN = {
    # Built by the list code before the table (commit 0353b31), seed for seed.
    "synthetic-0": "050cf54df2529b67",
    "synthetic-7": "d3d000beda84be5c",
    "synthetic-bursty-1": "a9c8b4cb838fc425",
    "synthetic-duration-7": "c0c3701a3cd543d5",
    "spec-1": "4fae53ead13edcc9",
    "preset-spec-0": "0b2c81e3cb2207c4",
    "azure-small-7": "5d57aa7760686a5f",
    "azure-code-2000-1": "503e91e551459af6",
}


def _golden_workload(name: str) -> Workload:
    if name.startswith("synthetic-bursty"):
        return synthetic(requests=300, seed=1, arrival="bursty", tenants=3, priority_weights=[1, 2])
    if name.startswith("synthetic-duration"):
        return synthetic(requests=None, duration=30.0, turns=1.0, seed=7)
    if name.startswith("synthetic"):
        return synthetic(requests=300, seed=int(name.rsplit("-", 1)[1]))
    if name == "spec-1":
        return spec_benchmark(sequences=200, seed=1, tenants=1)
    if name == "preset-spec-0":
        return preset("spec", seed=0)
    if name == "azure-small-7":
        return read_azure(
            ROOT / "tests" / "data" / "azure_small.csv", prefix_model=PrefixModel(seed=7, sessions=3)
        )
    model = PrefixModel(seed=1, tenants=1, priority_weights=(1, 2))
    return read_azure(shipped_trace("azure:code")[0], prefix_model=model, limit=2000)


@pytest.mark.parametrize("name", sorted(_GOLDEN))
def test_the_tables_hold_the_requests_the_lists_held_before(name: str) -> None:
    workload = _golden_workload(name)
    assert isinstance(workload.requests, RequestTable)
    assert _fingerprint(workload.requests) == _GOLDEN[name]


# ---------------------------------------------------------------------- the Azure reader


def _stamp(day: int, ticks: int, digits: int) -> str:
    """A TIMESTAMP `day` days after 2023-11-16, `ticks` of 100 ns into it, `digits` fraction digits."""
    seconds, fraction = divmod(ticks, 10**7)
    text = f"2023-11-{16 + day:02d} {seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return text + (f".{fraction:07d}"[: digits + 1] if digits else "")


azure_rows = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, 86400 * 10**7 - 1),
        st.sampled_from([0, 2, 7]),
        st.integers(0, 400),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=30,
)
prefix_models = st.builds(
    PrefixModel,
    seed=st.integers(0, 10_000),
    block_size=st.integers(1, 64),
    sessions=st.integers(1, 8),
    session_skew=st.floats(0.0, 2.0),
    turns=st.floats(1.0, 6.0),
    system_prompts=st.integers(0, 3),
    system_prompt_tokens=st.integers(0, 200),
    p_system=st.floats(0.0, 1.0),
    tenants=st.integers(0, 3),
    priority_weights=st.sampled_from([(1.0,), (1.0, 2.0), (0.0, 1.0, 3.0)]),
)


def _write_azure(path: Path, rows: list[tuple[int, int, int, int, int]], order: list[int]) -> Path:
    """An Azure CSV of `rows`, its columns (and a Note column) in the order `order` gives."""
    names = [*HEADER.split(","), "Note"]
    with path.open("w", encoding="utf-8") as out:
        out.write(",".join(names[i] for i in order) + "\n")
        for n, (day, ticks, digits, context, generated) in enumerate(rows):
            fields = [_stamp(day, ticks, digits), str(context), str(generated), f"row {n}"]
            out.write(",".join(fields[i] for i in order) + ("\n\n" if n % 7 == 3 else "\n"))
    return path


@settings(max_examples=60, deadline=None)
@given(
    rows=azure_rows,
    model=prefix_models,
    order=st.permutations(range(4)),
    limit=st.none() | st.integers(0, 35),
)
def test_the_azure_table_is_the_list_it_replaced(
    rows: list[tuple[int, int, int, int, int]], model: PrefixModel, order: list[int], limit: int | None
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write_azure(Path(folder) / "trace.csv", rows, list(order))
        table = read_azure(path, prefix_model=model, limit=limit).requests
        expected = _azure_list(path, model, limit)
    assert isinstance(table, RequestTable) and table._keys.typecode == "i"
    assert len(table) == len(expected) and list(table) == expected


def _same_rows(listed: Workload, table: Workload, policy: str, cache_model: str) -> None:
    capacity = max(min_capacity(listed), unique_blocks(listed.requests) // 3)
    rows = [
        simulate(w, policy, capacity, cache_model=cache_model, max_running=8).to_dict()
        for w in (listed, table)
    ]
    assert [{k: v for k, v in row.items() if k not in _TIMINGS} for row in rows[1:]] == [
        {k: v for k, v in rows[0].items() if k not in _TIMINGS}
    ]


@settings(max_examples=16, deadline=None)
@given(
    rows=azure_rows.filter(lambda rows: any(r[3] >= 64 for r in rows)),
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["lru", "s3fifo", "belady"]),
    cache_model=st.sampled_from(["radix", "flat"]),
)
def test_an_azure_table_gives_the_rows_of_the_list(
    rows: list[tuple[int, int, int, int, int]], seed: int, policy: str, cache_model: str
) -> None:
    model = PrefixModel(seed=seed, block_size=16, sessions=4, system_prompt_tokens=64, tenants=2)
    with tempfile.TemporaryDirectory() as folder:
        path = _write_azure(Path(folder) / "trace.csv", rows, [0, 1, 2, 3])
        table = read_azure(path, prefix_model=model)
        listed = Workload(_azure_list(path, model), table.block_size, "azure")
    assert isinstance(table.requests, RequestTable)
    _same_rows(listed, table, policy, cache_model)


def test_an_azure_length_beyond_int64_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    good = "2023-11-16 18:17:03.9799600,48,10"
    path.write_text(f"{HEADER}\n{good}\n2023-11-16 18:17:04.5,48,{2**63}\n{good}\n")
    with pytest.raises(WorkloadError, match=rf"^{path}:3: GeneratedTokens is too large \({2**63}\)$"):
        read_azure(path)
    path.write_text(f"{HEADER}\n{good}\n{good}\n2023-11-16 18:17:04.5,{2**63 - 1}0,4\n")
    with pytest.raises(WorkloadError, match=rf"^{path}:4: ContextTokens is too large"):
        read_azure(path)


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_bad_azure_row_near_the_start_is_refused_without_reading_the_rest(tmp_path: Path) -> None:
    good = "2023-11-16 18:17:03.9799600,4808,10\n"
    path = tmp_path / "big.csv"
    with path.open("w", encoding="utf-8") as out:
        out.write(HEADER + "\n" + good * 3 + "2023-11-16 18:17:04,4808,ten\n" + good * 400_000)
    before = _bytes_read()
    with pytest.raises(WorkloadError, match=r"big\.csv:5: GeneratedTokens must be an integer, got 'ten'"):
        read_azure(path)
    assert _bytes_read() - before < 2**20 < path.stat().st_size // 10  # a buffer, not the file


def test_the_azure_reader_makes_no_request_object_per_row() -> None:
    """What it returns holds no `SimRequest` (the table builds one when asked, and keeps the last)."""
    gc.collect()
    before = sum(type(o) is SimRequest for o in gc.get_objects())
    workload = read_azure(shipped_trace("azure:conversation")[0], limit=3000)
    gc.collect()
    assert len(workload) == 3000 and sum(type(o) is SimRequest for o in gc.get_objects()) == before
    assert workload.requests[5] == _azure_list(shipped_trace("azure:conversation")[0], PrefixModel(), 3000)[5]


# ---------------------------------------------------------------------- the generators


@settings(max_examples=30, deadline=None)
@given(params=synthetic_params(block_sizes=(1, 16, 64)))
def test_the_synthetic_table_is_the_list_it_replaced(params: dict[str, Any]) -> None:
    table = synthetic(**params).requests
    assert isinstance(table, RequestTable) and table._keys.typecode == "i"
    assert list(table) == _synthetic_list(**params)


@settings(max_examples=30, deadline=None)
@given(
    sequences=st.integers(1, 40),
    blocks=st.integers(1, 12),
    accesses=st.integers(1, 5),
    priorities=st.integers(1, 4),
    tenants=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_the_spec_table_is_the_list_it_replaced(
    sequences: int, blocks: int, accesses: int, priorities: int, tenants: int, seed: int
) -> None:
    workload = spec_benchmark(
        sequences=sequences, blocks_per_sequence=blocks, max_access_count=accesses,
        priorities=priorities, tenants=tenants, seed=seed,
    )  # fmt: skip
    assert isinstance(workload.requests, RequestTable)
    assert list(workload.requests) == _spec_list(sequences, blocks, accesses, priorities, tenants, seed)


@settings(max_examples=16, deadline=None)
@given(
    requests=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    tenants=st.integers(0, 3),
    policy=st.sampled_from(["lru", "s3fifo", "belady"]),
    cache_model=st.sampled_from(["radix", "flat"]),
)
def test_a_synthetic_table_gives_the_rows_of_the_list(
    requests: int, seed: int, tenants: int, policy: str, cache_model: str
) -> None:
    params: dict[str, Any] = {
        "requests": requests,
        "seed": seed,
        "tenants": tenants,
        "priority_weights": [1.0, 2.0],
    }
    table = synthetic(**params)
    listed = Workload(_synthetic_list(**params), table.block_size, "synthetic")
    _same_rows(listed, table, policy, cache_model)


# ---------------------------------------------------------------------- memory


def _azure_like(path: Path, rows: int, mean_tokens: float = 1000.0) -> Path:
    """An Azure-like trace of `rows` rows: Poisson arrivals at 20/s, lognormal lengths (mean
    `mean_tokens`, about 60 blocks of 16 at the default; the shipped traces have 70 to 130)."""
    rng = np.random.default_rng(0)
    ticks = np.cumsum(np.rint(rng.exponential(0.05 * 10**7, rows))).astype(np.int64)
    context = np.maximum(np.rint(rng.lognormal(math.log(mean_tokens) - 0.5, 1.0, rows)), 1).astype(np.int64)
    generated = np.maximum(np.rint(rng.lognormal(math.log(200) - 0.32, 0.8, rows)), 1).astype(np.int64)
    with path.open("w", encoding="ascii") as out:
        out.write(HEADER + "\n")
        out.writelines(
            f"{_stamp(t // (86400 * 10**7), t % (86400 * 10**7), 7)},{c},{g}\n"
            for t, c, g in zip(ticks.tolist(), context.tolist(), generated.tolist(), strict=True)
        )
    return path


def _kept(build: Any) -> tuple[Any, int]:
    """`build()` and the bytes (tracemalloc) it leaves allocated."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        return built, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_an_azure_table_keeps_under_a_bound_the_list_exceeds(tmp_path: Path) -> None:
    """Per lookup the table keeps its 4-byte key and a share of ~60 bytes of columns a request;
    the list kept an 8-byte pointer, a tuple and a `SimRequest` per request and an int object
    per distinct key. Measured (2,000 rows, ~57 lookups each): the table 5.7 bytes a lookup,
    the list 24.5; the bound, 8, sits between."""
    path = _azure_like(tmp_path / "azure.csv", 2_000, mean_tokens=900.0)
    model = PrefixModel()
    workload, table_bytes = _kept(lambda: read_azure(path, prefix_model=model))
    lookups = total_block_lookups(workload.requests)
    listed, list_bytes = _kept(lambda: _azure_list(path, model))
    assert lookups > 10**5 and workload.requests == listed
    assert table_bytes < 8 * lookups < list_bytes, (table_bytes / lookups, list_bytes / lookups)


_CHILD = """
import json, sys
def status(name):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(name))
from engine_adapter.sim.azure_trace import read_azure
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import total_block_lookups
base = status("VmRSS")
kind, arg = sys.argv[1], sys.argv[2]
workload = read_azure(arg) if kind == "azure" else synthetic(requests=int(arg), seed=0)
print(json.dumps({"base": base, "peak": status("VmHWM"), "requests": len(workload),
                  "lookups": total_block_lookups(workload.requests)}))
"""


def peak_rss(kind: str, requests: int, folder: Path) -> dict[str, int]:
    """The peak RSS of reading an Azure-like trace of `requests` rows (`kind` "azure") or
    generating `synthetic(requests=...)`, in a child process, with its RSS after the imports."""
    arg = str(_azure_like(folder / "azure.csv", requests)) if kind == "azure" else str(requests)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, arg],
        capture_output=True, text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    figures: dict[str, int] = json.loads(done.stdout)
    return figures


# Measured with `peak_rss(kind, 100_000, folder)` (PYTHONPATH=.:tests, 10^5 requests), above the
# child's RSS after its imports: reading the Azure-like trace (6.2 x 10^6 lookups) 46 MiB, 7.8
# bytes a lookup, with the table; 161 MiB, 27.1, with the list it replaced. Generating
# synthetic(requests=10^5) (13.1 x 10^6 lookups) 78 MiB, 6.3 bytes a lookup; 201 MiB, 16.1, with
# the list. The bound, 11 bytes a lookup, holds with room and fails both lists.
_BYTES_A_LOOKUP = 11


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the child reads its own peak from /proc/self/status")
@pytest.mark.parametrize("kind", ["azure", "synthetic"])
def test_a_hundred_thousand_requests_are_read_or_generated_in_bounded_memory(
    kind: str, tmp_path: Path
) -> None:
    figures = peak_rss(kind, 100_000, tmp_path)
    assert figures["requests"] == 100_000 and figures["lookups"] > 6 * 10**6
    assert figures["peak"] - figures["base"] < _BYTES_A_LOOKUP * figures["lookups"], figures


def test_a_turn_that_reaches_the_longest_prompt_exactly_still_extends_its_conversation() -> None:
    """The boundary of `max_input_tokens` (inclusive), which random lengths seldom hit exactly:
    the second turn's natural length taken as the limit."""
    params: dict[str, Any] = {"requests": 2, "sessions": 1, "turns": 100.0, "seed": 3}
    free = synthetic(**params, max_input_tokens=10**6).requests
    assert [r.session for r in free] == ["s0", "s0"] and free[0].input_len < free[1].input_len
    params["max_input_tokens"] = free[1].input_len
    bounded = synthetic(**params).requests
    assert list(bounded) == list(free) == _synthetic_list(**params)
    params["max_input_tokens"] -= 1  # one token short: a new conversation
    assert [r.session for r in synthetic(**params).requests] == ["s0", "s1"]
