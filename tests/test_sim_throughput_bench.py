"""benchmarks/sim_throughput.py times libCacheSim fairly (issue 50, item 7): its caches get a
hash table sized to the cache (`lcs_hashpower`), not the library's default of 2^24 buckets whose
page faults made `process_trace` about 11 times slower than the replay, and every side is the
best of the same number of alternated runs over the same block stream."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sage_eviction.flat import simulate_flat

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling `_machine`
    spec = importlib.util.spec_from_file_location("sim_throughput", BENCHMARKS / "sim_throughput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@given(capacity=st.integers(1, 10**9))
def test_the_table_holds_two_buckets_an_object_and_no_more_than_twice_that(
    bench: ModuleType, capacity: int
) -> None:
    power = bench.lcs_hashpower(capacity)
    assert power >= 12 and 2**power >= 2 * capacity
    assert power == 12 or 2 ** (power - 1) < 2 * capacity


def test_the_mooncake_row_sizes_the_table_to_its_cache(bench: ModuleType) -> None:
    assert bench.lcs_hashpower(9139) == 15  # 32,768 buckets for 9,139 blocks, not 16.8 M


@pytest.mark.parametrize("policy", ["lru", "fifo", "sieve", "s3fifo", "arc", "belady"])
def test_every_side_is_timed_alike_and_libcachesim_misses_what_sage_misses(
    bench: ModuleType, policy: str, tmp_path: Path
) -> None:
    """`_best_runs` times each side `repeat` times and keeps a best for each; libCacheSim, with
    its table sized to the cache, misses exactly what sage's flat cache misses."""
    pytest.importorskip("libcachesim")
    rng = np.random.default_rng(0)
    keys = rng.zipf(1.3, 4000).astype(np.int64) % 900
    path = tmp_path / "trace.bin"
    bench._write_oracle_general(keys, path)
    stream = tuple(keys.tolist())
    capacity = 64
    args = argparse.Namespace(repeat=3, lcs_hashpower=None)
    row = bench._best_runs({}, stream, path, policy, capacity, args)
    expected_misses = simulate_flat(list(stream), policy, capacity).misses
    assert row["libcachesim_misses"] == expected_misses
    assert len(stream) - row["cache_hits"] == expected_misses
    assert row["cache_s"] > 0 and row["libcachesim_s"] > 0
    seconds, misses = bench._libcachesim(policy, path, len(keys), capacity, bench.lcs_hashpower(capacity))
    assert misses == expected_misses and seconds > 0
