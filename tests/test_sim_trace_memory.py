"""Traces in bounded memory (issue 34, item 3): what a row keeps per block lookup, and its answers.

- `next_use_positions` (Belady's one int64 array over the lookup stream) against a brute-force
  scan, and the radix model's Belady rows computed from it against the per-key index of positions
  it replaced (kept here as the reference): the same rows, field for field, timings aside.
- The Mooncake reader holds the hash ids in one integer array (`RequestTable`), with the ids and
  rows unchanged.
- A malformed line near the start of a large trace is refused with its line number after reading
  little of the file (bytes read, from /proc/self/io, not time).
- Slow: one lru radix row on a generated trace of 2 x 10^6 block lookups, read and run in a child
  process (`benchmarks/sim_throughput.py --generated`), stays under a peak RSS bound.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_strategies import synthetic_params

from engine_adapter.sim import cache_model_kinds
from engine_adapter.sim.cache_models import RadixBelady
from engine_adapter.sim.mooncake_trace import mooncake_stream, read_mooncake
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import min_capacity, simulate
from engine_adapter.sim.synthetic import synthetic, synthetic_stream
from engine_adapter.sim.workloads import (
    SimRequest,
    Workload,
    WorkloadError,
    lookup_keys,
    next_use_positions,
    unique_blocks,
)

_TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}


def _requests(blocks: list[list[int]]) -> list[SimRequest]:
    return [
        SimRequest(i, float(i), tuple(keys), len(keys) * 16, 4, session=f"s{i % 3}")
        for i, keys in enumerate(blocks)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=6), max_size=12))
def test_next_use_positions_are_each_lookups_next_occurrence(blocks: list[list[int]]) -> None:
    requests = _requests(blocks)
    keys = lookup_keys(requests)
    n = len(keys)
    expected = [next((j for j in range(i + 1, n) if keys[j] == keys[i]), n) for i in range(n)]
    after = next_use_positions(requests)
    assert after.typecode == "q" and after.itemsize == 8
    assert list(after) == expected


class _IndexedBelady(RadixBelady):
    """The radix Belady as it was: every key's positions in a list, bisected from the cursor."""

    def __init__(self, requests: Sequence[SimRequest]) -> None:
        super().__init__(requests)
        self._index: dict[Hashable, list[int]] = {}
        for position, key in enumerate(lookup_keys(requests)):
            self._index.setdefault(key, []).append(position)

    def _next(self, key: Hashable) -> int:
        positions = self._index.get(key, [])
        at = bisect_left(positions, self.cursor)
        return positions[at] if at < len(positions) else self._never


def _row(workload: Workload, capacity: int, **options: Any) -> dict[str, Any]:
    row = simulate(workload, "belady", capacity, **options).to_dict()
    return {name: value for name, value in row.items() if name not in _TIMINGS}


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    requests=st.integers(5, 60),
    sessions=st.integers(1, 8),
    fraction=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_radix_belady_from_the_next_use_array_gives_the_indexed_rows(
    seed: int, requests: int, sessions: int, fraction: float
) -> None:
    workload = synthetic(requests=requests, seed=seed, sessions=sessions, input_tokens=96.0, turn_tokens=32.0)
    need = min_capacity(workload)
    capacity = max(need, int(unique_blocks(workload.requests) * fraction))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_model_kinds, "RadixBelady", _IndexedBelady)
        reference = _row(workload, capacity, max_running=4)
    assert _row(workload, capacity, max_running=4) == reference


def test_radix_belady_serves_a_key_the_request_looks_up_twice() -> None:
    # Key 7 twice in request 0 (positions 0 and 2) and again at 4: from the cursor 3, its next use is 4.
    belady = RadixBelady(_requests([[7, 8, 7], [9, 7]]))
    belady.serve((7, 8, 7), 3)
    assert (belady._next(7), belady._next(8)) == (4, 5)
    belady.serve((9, 7), 5)  # past the end of the lookups: never again
    assert (belady._next(7), belady._next(9)) == (5, 5)


def test_radix_belady_scores_a_key_outside_the_served_request_by_its_positions() -> None:
    belady = RadixBelady(_requests([[1, 2], [3, 1], [1]]))
    belady.serve((1, 2), 2)
    assert (belady._next(3), belady._next(1), belady._next(99)) == (2, 3, 5)


def test_the_mooncake_reader_holds_the_ids_in_one_integer_array(tmp_path: Path) -> None:
    """The ids of every request in one int32 array (int64 once an id needs it), no object per id
    or per request; the requests read back as before."""
    path = tmp_path / "trace.jsonl"
    records = [
        {"timestamp": t, "input_length": 512 * len(ids), "output_length": 4, "hash_ids": ids}
        for t, ids in enumerate([[100001, 100002], [100001, 100002, 100003], [100003]])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    requests = read_mooncake(path).requests
    assert isinstance(requests, RequestTable)
    assert [r.block_hashes for r in requests] == [(100001, 100002), (100001, 100002, 100003), (100003,)]
    assert requests._keys.typecode == "i" and list(requests._keys) == [
        100001,
        100002,
        100001,
        100002,
        100003,
        100003,
    ]
    records[1]["hash_ids"] = [100001, 2**40, 100003]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    wide = read_mooncake(path).requests
    assert isinstance(wide, RequestTable) and wide._keys.typecode == "q"
    assert [r.block_hashes for r in wide] == [(100001, 100002), (100001, 2**40, 100003), (100003,)]


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
@pytest.mark.parametrize(
    ("bad", "message"),
    [("{not json\n", "bad JSON"), ('{"hash_ids": [' + "1," * 700_000 + "1]}\n", "line longer than")],
)
def test_a_bad_line_near_the_start_is_refused_without_reading_the_rest(
    tmp_path: Path, bad: str, message: str
) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 512, "output_length": 4, "hash_ids": [1]}) + "\n"
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as out:
        out.write(good * 3 + bad)
        out.write(good * 400_000)  # 25 MB after it
    size = path.stat().st_size
    before = _bytes_read()
    with pytest.raises(WorkloadError, match=rf"big\.jsonl:4: {message}"):
        read_mooncake(path)
    read = _bytes_read() - before
    assert read < 4 * 2**20 < size // 6  # the bad line and a buffer or two, not the file


def _throughput_benchmark() -> Any:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_throughput.py"
    sys.path.insert(0, str(path.parent))  # it imports _machine beside it
    spec = importlib.util.spec_from_file_location("sim_throughput", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Measured (benchmarks/sim_throughput.py --generated 2e6, docs/performance.md, "Simulator throughput
# and memory" and "Traces as arrays"): the child sits at about 50 MiB once it has imported the
# simulator; the row's peak was 169 MiB (63 bytes a lookup above the imports) before issue 34,
# 143 MiB (50 bytes a lookup) once the ids were shared, and is 116 MiB (35 bytes a lookup) with
# the trace as arrays, the evicted keys compact and held once, and a window of the queue as
# objects. The bound, the imports and 40 bytes a lookup (126 MiB), holds now with 10 MiB to spare
# and fails the memory of before.
_LOOKUPS = 2_000_000
_PEAK_BOUND = 50 * 2**20 + 40 * _LOOKUPS


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the child reads its own peak from /proc/self/status")
def test_a_generated_trace_of_two_million_lookups_runs_an_lru_row_in_bounded_memory() -> None:
    figures = _throughput_benchmark().generated_row(_LOOKUPS)
    assert figures["lookups_written"] >= _LOOKUPS and figures["block_lookups"] == figures["lookups_written"]
    assert 0 < figures["block_hits"] < figures["block_lookups"]
    assert figures["peak_rss_bytes"] < _PEAK_BOUND, figures


@settings(max_examples=25, deadline=None)
@given(params=synthetic_params())
def test_the_streamed_generator_gives_the_requests_and_rows_of_the_list(params: dict[str, Any]) -> None:
    materialised = synthetic(**params)
    streamed = list(synthetic_stream(**params))
    assert streamed == materialised.requests
    rebuilt = Workload(streamed, materialised.block_size, "synthetic")
    capacity = min_capacity(materialised)
    row = simulate(materialised, "lru", capacity, max_running=8).to_dict()
    again = simulate(rebuilt, "lru", capacity, max_running=8).to_dict()
    assert {k: v for k, v in again.items() if k not in _TIMINGS} == {
        k: v for k, v in row.items() if k not in _TIMINGS
    }


def test_the_streamed_generator_checks_its_parameters_before_the_first_request() -> None:
    with pytest.raises(WorkloadError, match="rate must be > 0"):
        synthetic_stream(rate=0.0)
    with pytest.raises(TypeError):
        synthetic_stream(no_such_param=1)


@pytest.mark.parametrize("limit", [None, 0, 1, 500])
def test_the_streamed_mooncake_reader_gives_the_requests_of_the_list(limit: int | None) -> None:
    path = shipped_trace("mooncake:conversation")[0]  # gzipped, in arrival order
    streamed = list(mooncake_stream(path, limit=limit))
    assert streamed == read_mooncake(path, limit=limit).requests
    assert len(streamed) == (12031 if limit is None else limit)


def test_the_streamed_mooncake_reader_refuses_a_bad_line_when_it_reaches_it(tmp_path: Path) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 512, "output_length": 4, "hash_ids": [1]}) + "\n"
    path = tmp_path / "bad.jsonl"
    path.write_text(good * 2 + '{"timestamp": 1}\n' + good)
    stream = mooncake_stream(path)
    assert [r.request_id for r in itertools.islice(stream, 2)] == [0, 1]
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:3: missing field 'input_length'"):
        next(stream)
    with pytest.raises(WorkloadError, match="limit must be"):
        mooncake_stream(path, limit=-1)
    with pytest.raises(WorkloadError, match="no such file"):
        mooncake_stream(tmp_path / "absent.jsonl")
