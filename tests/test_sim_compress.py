"""Compress-on-evict in the simulator (issue 36 item 3): off, its rows are those of the code
before it (golden rows); on, a returning conversation hits its compressed prefix, and the rows
say how often, so that "compress or drop" can be asked of a trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_adapter.sim.benchmark import BenchmarkError, run_benchmark
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload

GOLDEN = Path(__file__).parent / "data" / "sim_rows_compress_off.json"
ACCOUNTED = {"regrets", "ghost_hits", "regret_ratio", "age_histograms"}
TIMED = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}


@pytest.mark.slow
def test_rows_with_compress_off_are_the_golden_rows() -> None:
    # written by the simulator before compress-on-evict existed (the same script, main's code)
    golden = json.loads(GOLDEN.read_text())
    workload = synthetic(requests=300, seed=2)
    for name, expected in golden.items():
        policy, capacity = name.split("@")
        row = simulate(workload, policy, int(capacity), compiled=False).to_dict()
        # the fields added since (issue 32's regret and ages) are the only ones the golden lacks
        assert set(row) - set(expected) - TIMED == ACCOUNTED, name
        assert {k: v for k, v in row.items() if k not in TIMED | ACCOUNTED} == expected, name


def _conversations(block_size: int = 16) -> Workload:
    """Four conversations of 12 blocks, each returning with 2 more blocks after the other three
    have passed: a pool of 24 blocks cannot keep all four histories whole."""
    requests: list[SimRequest] = []
    t = 0.0
    for turn in range(2):
        for conv in range(4):
            keys = tuple((conv, i) for i in range(12 + 2 * turn))
            requests.append(SimRequest(len(requests), t, keys, len(keys) * block_size, 4, session=str(conv)))
            t += 100.0
    return Workload(requests=requests, block_size=block_size, source="test")


def test_a_returning_conversation_hits_its_compressed_prefix() -> None:
    workload = _conversations()
    dropped = simulate(workload, "lru", 24, compiled=False)
    compressed = simulate(workload, "lru", 24, compiled=False, compress_on_evict="knorm:0.75")
    row = compressed.to_dict()
    assert row["compress_on_evict"] == "knorm:0.75"
    assert row["compressions"] >= 3 and row["compressed_hits"] >= 3
    assert row["compressed_hit_tokens"] == 16 * 12 * row["compressed_hits"]
    assert compressed.block_hits > dropped.block_hits  # the histories were kept, at a quarter the blocks
    assert "compressed_hits" not in dropped.to_dict()


@pytest.mark.slow
def test_the_benchmark_runs_each_online_row_again_compressed() -> None:
    result = run_benchmark(
        policies=["lru"], workload="synthetic", requests=120, capacity_ratios=[0.1], jobs=1,
        compress_on_evict="knorm:0.75",
    )  # fmt: skip
    rows = result["results"]
    assert [(r["policy"], r.get("compress_on_evict")) for r in rows] == [
        ("lru", None), ("lru", "knorm:0.75"), ("belady", None), ("unbounded", None)
    ]  # fmt: skip
    assert result["settings"]["compress_on_evict"] == "knorm:0.75"
    with pytest.raises(BenchmarkError, match="ratio"):
        run_benchmark(policies=["lru"], workload="synthetic", requests=20, compress_on_evict="knorm:2")
    with pytest.raises(BenchmarkError, match="radix"):
        run_benchmark(
            policies=["lru"], workload="synthetic", requests=20, jobs=1, cache_model="flat",
            compress_on_evict="knorm:0.5",
        )  # fmt: skip
