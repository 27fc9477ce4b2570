"""The workload as columns (`RequestTable`) against the list of `SimRequest`s it replaces.

- The table reads back the requests it was given (index, negative index, slice, iteration,
  equality with the list), and derives what the simulator derives from the lookup stream
  (distinct blocks by bitmap and by sort, the lookups, Belady's next-use positions, each
  request's end, `Workload.describe`) exactly as the list's functions do.
- Rows: a hypothesis-generated workload simulated from the table and from the list gives the same
  row, field for field (timings aside), radix and flat, lru and Belady (the offline policy whose
  future comes from the table's arrays), with tenants, sessions and priorities.
- The Mooncake reader's table and the streamed reader's list of the same file give the same rows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.mooncake_trace import mooncake_stream, read_mooncake
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import (
    SimRequest,
    Workload,
    lookup_keys,
    next_use_positions,
    request_ends,
    total_block_lookups,
    unique_blocks,
)

_TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}

keys = st.integers(0, 30) | st.integers(-(2**63), 2**63 - 1) | st.sampled_from([2**64, 7, 8])
requests_lists = st.lists(
    st.builds(
        lambda i, t, ks, out, tenant, pr, ses: SimRequest(
            i, t, tuple(ks), 16 * len(ks), out, tenant, pr, ses
        ),
        st.integers(0, 10**6),
        st.floats(0.0, 50.0),
        st.lists(keys, max_size=6),
        st.integers(0, 9),
        st.none() | st.sampled_from(["a", "b"]),
        st.integers(0, 2),
        st.none() | st.sampled_from(["s1", "s2", "s3"]),
    ),
    max_size=25,
)


def _derived(requests: Any) -> tuple[Any, ...]:
    return (
        unique_blocks(requests),
        total_block_lookups(requests),
        lookup_keys(requests),
        list(next_use_positions(requests)),
        list(request_ends(requests)),
    )


@settings(max_examples=150, deadline=None)
@given(requests=requests_lists)
def test_the_table_reads_back_and_derives_as_the_list(requests: list[SimRequest]) -> None:
    table = RequestTable.of(requests)
    assert len(table) == len(requests) and table == requests and list(table) == requests
    for i in range(-len(requests), len(requests)):
        assert table[i] == requests[i]
    assert table[1:-1] == requests[1:-1] and table[::2] == requests[::2]
    with pytest.raises(IndexError):
        table[len(requests)]
    assert _derived(table) == _derived(requests)
    ordered = sorted(requests, key=lambda r: r.arrival_s)  # stable, as the readers sort
    assert table.sorted_by_arrival() == ordered
    workload = Workload(requests, 16, "synthetic")
    assert Workload(table, 16, "synthetic").describe() == workload.describe()


def test_sparse_keys_are_counted_by_sorting_and_wide_keys_widen_the_array() -> None:
    table = RequestTable.of(
        [SimRequest(0, 0.0, (5, 10**12, 5), 48, 1), SimRequest(1, 1.0, (-3, 10**12), 32, 1)]
    )
    assert table._keys.typecode == "q" and unique_blocks(table) == 3
    wider = RequestTable.of([SimRequest(0, 0.0, (1, 2**64), 32, 1), SimRequest(1, 1.0, (("x", 1), 1), 32, 1)])
    assert isinstance(wider._keys, list) and wider[1].block_hashes == (("x", 1), 1)
    assert unique_blocks(wider) == 3 and list(next_use_positions(wider)) == [3, 4, 4, 4]


def _same_rows(a: Workload, b: Workload, policy: str, cache_model: str, **options: Any) -> None:
    capacity = max(min_capacity(a), unique_blocks(a.requests) // 3)
    row = simulate(a, policy, capacity, cache_model=cache_model, **options).to_dict()
    again = simulate(b, policy, capacity, cache_model=cache_model, **options).to_dict()
    assert {k: v for k, v in again.items() if k not in _TIMINGS} == {
        k: v for k, v in row.items() if k not in _TIMINGS
    }


@settings(max_examples=20, deadline=None)
@given(
    requests=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    tenants=st.none() | st.integers(1, 3),
    policy=st.sampled_from(["lru", "belady", "s3fifo"]),
    cache_model=st.sampled_from(["radix", "flat"]),
)
def test_a_workload_as_a_table_gives_the_rows_of_the_list(
    requests: int, seed: int, tenants: int | None, policy: str, cache_model: str
) -> None:
    params: dict[str, Any] = {"requests": requests, "seed": seed, "priority_weights": [1.0, 2.0]}
    generated = synthetic(**params, **({} if tenants is None else {"tenants": tenants}))  # a table
    listed = Workload(list(generated.requests), generated.block_size, generated.source)
    table = Workload(RequestTable.of(listed.requests), listed.block_size, listed.source)
    _same_rows(listed, table, policy, cache_model, max_running=8)


def test_the_mooncake_table_gives_the_rows_of_the_streamed_list(tmp_path: Path) -> None:
    generated = synthetic(requests=300, seed=3, tenants=2)
    path = tmp_path / "trace.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for r in generated:
            record = {
                "timestamp": r.arrival_s * 1000.0,
                "input_length": 512 * len(r.block_hashes),
                "output_length": r.output_len,
                "hash_ids": list(r.block_hashes),
                "tenant": r.tenant,
                "priority": r.priority,
            }
            out.write(json.dumps(record) + "\n")
    table = read_mooncake(path)
    assert isinstance(table.requests, RequestTable)
    listed = Workload(list(mooncake_stream(path)), table.block_size, "mooncake")
    for policy in ("lru", "belady"):
        _same_rows(listed, table, policy, "radix")


def test_sorting_by_arrival_keeps_the_order_of_ties() -> None:
    """Many requests arriving at a few times (a sort that is not stable reorders ties here)."""
    requests = [SimRequest(i, float((7 * i) % 3), (i,), 16, 1) for i in range(300)]
    ordered = RequestTable.of(requests).sorted_by_arrival()
    assert [r.request_id for r in ordered] == [
        r.request_id for r in sorted(requests, key=lambda r: r.arrival_s)
    ]
    in_order = RequestTable.of(sorted(requests, key=lambda r: r.arrival_s))
    assert in_order.sorted_by_arrival() is in_order  # already sorted: no copy


def test_the_queue_holds_a_window_of_a_tables_arrivals_and_the_row_is_the_lists() -> None:
    """A generated workload whose arrivals outrun the server: from a table, `waiting` holds at
    most the window (the rest are indices), from the list every arrival; the rows are equal."""
    from engine_adapter.sim.simulator import Simulator

    generated = synthetic(requests=400, seed=5)  # a table since issue 34; the list made here
    listed = Workload(list(generated.requests), generated.block_size, generated.source)
    table = Workload(RequestTable.of(listed.requests), listed.block_size, listed.source)
    capacity = max(min_capacity(listed), unique_blocks(listed.requests) // 4)
    longest = {}
    rows = {}
    for name, workload in (("list", listed), ("table", table)):
        sim = Simulator(workload, "lru", capacity, max_running=4)
        st = sim.start_run()
        longest[name] = 0
        end = workload.requests[-1].arrival_s
        for i in range(1, 201):  # the run in slices of time, the queue looked at in between
            sim.advance(st, end * i / 100)
            longest[name] = max(longest[name], len(st.waiting))
        sim.advance(st, math.inf)
        rows[name] = {k: v for k, v in sim.row(st, 1.0).to_dict().items() if k not in _TIMINGS}
        assert st.finished == 400
    assert longest["table"] <= 4 + 4 + 1 < 100 < longest["list"]
    assert rows["table"] == rows["list"]
