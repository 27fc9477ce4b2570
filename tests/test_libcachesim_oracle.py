"""Differential tests: the flat cache reproduces libCacheSim's misses exactly.

libCacheSim (GPL, the `oracle` extra) is used only here, as an independent implementation.
Each trace is written once in libCacheSim's oracleGeneral binary format (little-endian
`<IQIq` per request: uint32 time, uint64 object id, uint32 size, int64 virtual time of the
object's next request, -1 for none), with every object of size 1, so a cache size of N bytes
is N blocks; its Belady reads the next-access times from that file. The same key sequence
runs through `sage_eviction.flat.simulate_flat`, once with the policies' compiled core and once
with the pure-Python reference (the `implementation` fixture of conftest.py).

Traces: a seeded Zipf trace, and the Mooncake conversation trace with each hash id one block in
order of appearance. Capacities: 1, 5, 10 and 25 percent of the unique blocks.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from oracle_trace import MOONCAKE, ORACLE_POLICIES, libcachesim_class, write_oracle_general

from sage_eviction import available_policies
from sage_eviction.flat import simulate_flat

lcs: Any = pytest.importorskip(
    "libcachesim", reason="libCacheSim is the oracle extra: pip install -e '.[oracle]'"
)

pytestmark = pytest.mark.oracle

POLICIES = ORACLE_POLICIES
FRACTIONS = [0.01, 0.05, 0.10, 0.25]


@dataclass(frozen=True)
class Trace:
    name: str
    keys: list[int]
    path: Path  # the oracleGeneral file

    @property
    def unique(self) -> int:
        return len(set(self.keys))


def zipf_keys(n: int, objects: int, alpha: float, seed: int) -> list[int]:
    """`n` requests over `objects` ids, popularity ~ 1 / rank**alpha, ids shuffled."""
    rng = random.Random(seed)
    cum = list(accumulate(1.0 / rank**alpha for rank in range(1, objects + 1)))
    ids = list(range(objects))
    rng.shuffle(ids)
    return [ids[r] for r in rng.choices(range(objects), cum_weights=cum, k=n)]


@pytest.fixture(scope="module")
def zipf_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    keys = zipf_keys(50_000, 5_000, alpha=0.9, seed=20240611)
    path = tmp_path_factory.mktemp("oracle") / "zipf.oracleGeneral.bin"
    write_oracle_general(path, keys)
    return Trace("zipf", keys, path)


@pytest.fixture(scope="module")
def mooncake_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    keys: list[int] = []
    with gzip.open(MOONCAKE, "rt", encoding="utf-8") as f:
        for line in f:
            keys.extend(json.loads(line)["hash_ids"])
    path = tmp_path_factory.mktemp("oracle") / "mooncake.oracleGeneral.bin"
    write_oracle_general(path, keys)
    return Trace("mooncake", keys, path)


def libcachesim_misses(trace: Trace, policy: str, capacity: int) -> int:
    """libCacheSim's misses for `trace` in a cache of `capacity` unit-size objects."""
    reader = lcs.TraceReader(str(trace.path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    # hashpower: 2**20 hash buckets are plenty here; the default 2**24 costs seconds to allocate.
    cache = libcachesim_class(policy)(capacity, hashpower=20)
    miss_ratio, byte_miss_ratio = cache.process_trace(reader)
    # Unit sizes: the cache size counts objects, and object and byte miss ratios agree.
    assert cache.cache_size == capacity
    assert cache.get_occupied_byte() == cache.get_n_obj() <= capacity
    assert miss_ratio == pytest.approx(byte_miss_ratio)
    misses: int = round(miss_ratio * len(trace.keys))
    return misses


def _check(trace: Trace, policy: str, fraction: float) -> None:
    if policy not in available_policies():
        pytest.skip(f"policy {policy!r} is not registered yet")
    capacity = max(1, int(trace.unique * fraction))
    ours = simulate_flat(trace.keys, policy, capacity)
    theirs = libcachesim_misses(trace, policy, capacity)
    assert ours.requests == len(trace.keys)
    assert ours.misses == theirs, (
        f"{policy} at {capacity} blocks on {trace.name}: ours {ours.misses}, libCacheSim {theirs}"
    )


# ---- the format --------------------------------------------------------------------------


def test_oracle_general_file_round_trips_through_libcachesim(tmp_path: Path) -> None:
    keys = [7, 3, 7, 2**40, 3, 7]
    path = tmp_path / "t.bin"
    write_oracle_general(path, keys)
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    got = [(req.obj_id, req.obj_size, req.next_access_vtime) for req in reader]
    assert [g[0] for g in got] == keys
    assert all(g[1] == 1 for g in got)
    future = [g[2] for g in got]
    # Requests with a next access point at it; the last request of each key has none (the
    # reader stores "none" as -1 or as a huge sentinel, depending on the version).
    assert future[:3] == [2, 4, 5]
    assert all(f < 0 or f > len(keys) for i, f in enumerate(future) if i in (3, 4, 5))


def test_zipf_trace_is_seeded() -> None:
    assert zipf_keys(1000, 100, 0.9, seed=1) == zipf_keys(1000, 100, 0.9, seed=1)
    assert zipf_keys(1000, 100, 0.9, seed=1) != zipf_keys(1000, 100, 0.9, seed=2)


# ---- the differential tests ----------------------------------------------------------------


@pytest.mark.parametrize("fraction", FRACTIONS, ids=lambda f: f"{f:.0%}")
@pytest.mark.parametrize("policy", POLICIES)
def test_flat_cache_matches_libcachesim_on_zipf(
    zipf_trace: Trace, policy: str, fraction: float, implementation: str
) -> None:
    _check(zipf_trace, policy, fraction)


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    keys = zipf_keys(5_000, 200, alpha=1.0, seed=7)
    path = tmp_path_factory.mktemp("oracle") / "small.oracleGeneral.bin"
    write_oracle_general(path, keys)
    return Trace("small", keys, path)


@pytest.mark.parametrize("policy", POLICIES)
def test_flat_cache_matches_libcachesim_at_tiny_capacities(
    small_trace: Trace, policy: str, implementation: str
) -> None:
    """Edge sizes: a cache of 1 to 3 blocks, and S3-FIFO's small queue at 2 blocks and up
    (libCacheSim admits nothing to a small queue of 1 block; see policies/s3fifo.py)."""
    if policy not in available_policies():
        pytest.skip(f"policy {policy!r} is not registered yet")
    capacities = [20, 21, 29, 64] if policy == "s3fifo" else [1, 2, 3, 10, 64]
    for capacity in capacities:
        ours = simulate_flat(small_trace.keys, policy, capacity).misses
        assert ours == libcachesim_misses(small_trace, policy, capacity), f"{policy} at {capacity} blocks"


@pytest.mark.slow
@pytest.mark.parametrize("fraction", FRACTIONS, ids=lambda f: f"{f:.0%}")
@pytest.mark.parametrize("policy", POLICIES)
def test_flat_cache_matches_libcachesim_on_mooncake(
    mooncake_trace: Trace, policy: str, fraction: float, implementation: str
) -> None:
    assert (len(mooncake_trace.keys), mooncake_trace.unique) == (288_500, 182_790)
    _check(mooncake_trace, policy, fraction)
