"""The simulator's cache models against independent implementations.

- The flat model reproduces libCacheSim's block misses exactly (LRU, FIFO, LFU, ARC, S3-FIFO,
  SIEVE, Belady) on the Mooncake conversation and synthetic traces and a small generated
  workload, at 1, 5, 10 and 25 percent of the distinct blocks (the oracle file is written by
  `oracle_trace.py`).
- The radix model agrees with a brute-force LRU radix simulation (a dict of cached paths with
  access ticks) on small random traces whose requests run one at a time.
- Golden numbers: LRU's hits, evictions and preemptions on a fixed synthetic workload.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_trace import (
    MOONCAKE,
    MOONCAKE_SYNTHETIC,
    ORACLE_POLICIES,
    libcachesim_class,
    write_oracle_general,
)

from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.simulator import Simulator, min_capacity, simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

POLICIES = ORACLE_POLICIES
FRACTIONS = [0.01, 0.05, 0.10, 0.25]


def _keys(workload: Workload) -> list[int]:
    return [key for r in workload.requests for key in r.block_hashes]  # type: ignore[misc]


# ---- flat model against libCacheSim --------------------------------------------------------


@pytest.fixture(scope="module")
def oracle_workloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Workload, Path]]:
    pytest.importorskip("libcachesim", reason="libCacheSim is the oracle extra: pip install -e '.[oracle]'")
    folder = tmp_path_factory.mktemp("sim-oracle")
    workloads: dict[str, Workload] = {"synthetic": synthetic(requests=400, seed=11)}
    workloads["mooncake"] = read_mooncake(MOONCAKE)
    workloads["mooncake-synthetic"] = read_mooncake(MOONCAKE_SYNTHETIC)
    out: dict[str, tuple[Workload, Path]] = {}
    for name, workload in workloads.items():
        path = folder / f"{name}.oracleGeneral.bin"
        write_oracle_general(path, _keys(workload))
        out[name] = (workload, path)
    return out


def _libcachesim_misses(path: Path, n_requests: int, policy: str, capacity: int) -> int:
    import libcachesim as lcs

    cls: Any = libcachesim_class(policy)
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, _ = cls(capacity).process_trace(reader)
    return round(miss_ratio * n_requests)


@pytest.mark.oracle
@pytest.mark.slow  # seconds per policy; the quick loop keeps tests/test_libcachesim_oracle.py's Zipf cells
@pytest.mark.parametrize("trace", ["synthetic", "mooncake", "mooncake-synthetic"])
@pytest.mark.parametrize("policy", POLICIES)
def test_flat_model_matches_libcachesim(
    oracle_workloads: dict[str, tuple[Workload, Path]], trace: str, policy: str
) -> None:
    workload, path = oracle_workloads[trace]
    unique = unique_blocks(workload.requests)
    lookups = sum(len(r.block_hashes) for r in workload.requests)
    for fraction in FRACTIONS:
        capacity = max(1, int(unique * fraction))
        result = simulate(workload, policy, capacity, cache_model="flat")
        assert result.block_lookups == lookups
        ours = result.block_lookups - result.block_hits
        theirs = _libcachesim_misses(path, lookups, policy, capacity)
        assert ours == theirs, (
            f"{policy} at {capacity} blocks ({fraction:.0%}) on {trace}: ours {ours}, libCacheSim {theirs}"
        )


# ---- radix model against a brute-force reference -----------------------------------------


def reference_lru_radix(
    requests: Sequence[tuple[list[Hashable], int]], capacity: int, block_size: int
) -> tuple[int, int]:
    """Hits and evictions of an LRU radix cache serving `(keys, output_len)` requests one at a time.

    The cache is a dict from key to (parent key, tick of the latest insert or hit); a request
    hits its longest cached prefix (touching it root first), evicts the least recently used
    unreferenced leaf while the pool is short, inserts its missed blocks, then grows one block
    at a time while it decodes, and finally releases everything but the cached blocks.
    """
    cache: dict[Hashable, list[Any]] = {}  # key -> [parent, tick]
    tick = 0
    hits = evictions = 0

    def evict_one(locked: set[Hashable]) -> None:
        nonlocal evictions
        parents = {entry[0] for entry in cache.values()}
        leaves = [k for k in cache if k not in parents and k not in locked]
        victim = min(leaves, key=lambda k: cache[k][1])
        del cache[victim]
        evictions += 1

    for keys, output_len in requests:
        path: list[Hashable] = []
        parent: Hashable | None = None
        for key in keys:
            if key in cache and cache[key][0] == parent:
                path.append(key)
                parent = key
            else:
                break
        hits += len(path)
        for key in path:
            tick += 1
            cache[key][1] = tick
        locked = set(path)
        private = len(keys) - len(path)  # blocks this request holds outside the cache
        while capacity - len(cache) < private:
            evict_one(locked)
        parent = path[-1] if path else None
        for key in keys[len(path) :]:
            tick += 1
            cache[key] = [parent, tick]
            locked.add(key)
            parent = key
        private = 0
        n_tokens = len(keys) * block_size
        for j in range(1, output_len):
            if -(-(n_tokens + j) // block_size) > len(keys) + private:
                while capacity - len(cache) - private < 1:
                    evict_one(locked)
                private += 1
    return hits, evictions


def _workload(requests: Sequence[tuple[list[Hashable], int]], block_size: int, gap: float = 1e6) -> Workload:
    return Workload(
        requests=[
            SimRequest(i, i * gap, tuple(keys), len(keys) * block_size, out)
            for i, (keys, out) in enumerate(requests)
        ],
        block_size=block_size,
        source="test",
    )


def _prefix_keys(path: Sequence[int]) -> list[Hashable]:
    return [tuple(path[: i + 1]) for i in range(len(path))]


radix_requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2), min_size=1, max_size=6).map(_prefix_keys),
        st.integers(1, 9),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60)
@given(requests=radix_requests, extra=st.integers(0, 12), block_size=st.sampled_from([1, 2, 4]))
def test_radix_lru_matches_brute_force_reference(
    requests: list[tuple[list[Hashable], int]], extra: int, block_size: int
) -> None:
    workload = _workload(requests, block_size)
    capacity = min_capacity(workload) + extra
    result = simulate(workload, "lru", capacity, cache_model="radix")
    assert (result.block_hits, result.evictions) == reference_lru_radix(requests, capacity, block_size)
    assert result.requests == len(requests)
    assert result.preemptions == 0


def test_reference_itself_on_a_hand_example() -> None:
    a, ab, abc, b = ("a",), ("a", "b"), ("a", "b", "c"), ("b",)
    # capacity 3: [a, ab] cached; [b] needs 1: fits; [a, ab, abc] hits 2, needs 1: evicts b (LRU leaf).
    requests = [([a, ab], 1), ([b], 1), ([a, ab, abc], 1)]
    assert reference_lru_radix(requests, 3, 1) == (2, 1)
    result = simulate(_workload(requests, 1), "lru", 3)
    assert (result.block_hits, result.evictions) == (2, 1)


def test_radix_handles_overlapping_requests_and_preemption() -> None:
    workload = synthetic(requests=150, seed=3, rate=50.0)
    capacity = min_capacity(workload) + 20
    for policy in ("lru", "arc", "belady"):
        result = simulate(workload, policy, capacity)
        assert result.requests == 150
        assert 0 < result.block_hits <= result.block_lookups
        assert result.evictions > 0


def test_unbounded_never_evicts_and_hits_every_repeat() -> None:
    workload = synthetic(requests=200, seed=5)
    lookups = sum(len(r.block_hashes) for r in workload.requests)
    for model in ("radix", "flat"):
        result = simulate(workload, "unbounded", cache_model=model)
        assert result.evictions == 0
        assert result.preemptions == 0
        assert result.capacity_blocks == unique_blocks(workload.requests)
        assert result.block_hits == lookups - unique_blocks(workload.requests)


def test_capacity_below_the_largest_request_is_an_error() -> None:
    workload = synthetic(requests=50, seed=1)
    need = min_capacity(workload)
    with pytest.raises(ValueError, match=f"at least {need}"):
        Simulator(workload, "lru", need - 1)
    with pytest.raises(ValueError, match="positive"):
        Simulator(workload, "lru", 0, cache_model="flat")
    with pytest.raises(ValueError, match="unknown cache model"):
        Simulator(workload, "lru", need, cache_model="tree")


# ---- golden numbers ----------------------------------------------------------------------

GOLDEN_LRU = {
    # capacity: (block_hits, evictions, preemptions) of radix LRU on synthetic(requests=300, seed=2).
    # block_hits counts each request's first admission only; it was 16606, 25033 and 27610 while
    # re-admissions after preemption (finding their own blocks cached) counted as lookups too.
    372: (12898, 18826, 33),
    745: (18224, 13196, 64),
    1862: (22603, 7851, 43),
}


def test_golden_lru_numbers_on_a_fixed_synthetic_workload() -> None:
    workload = synthetic(requests=300, seed=2)
    assert (len(workload), unique_blocks(workload.requests)) == GOLDEN_WORKLOAD
    got = {}
    for capacity in GOLDEN_LRU:
        result = simulate(workload, "lru", capacity)
        got[capacity] = (result.block_hits, result.evictions, result.preemptions)
    assert got == GOLDEN_LRU


GOLDEN_WORKLOAD = (300, 7450)  # requests, distinct blocks


# ---- the reference rows bound the others ----------------------------------------------------


def test_a_readmission_after_preemption_is_not_a_lookup() -> None:
    # Two unrelated prompts of 4 blocks arrive together; at 11 blocks one is preempted while the
    # other decodes, and its re-admission finds its own 4 blocks still cached. No block is ever
    # shared, so no policy can hit anything: the unbounded cache's 0 % is the ceiling.
    workload = _workload([(["a1", "a2", "a3", "a4"], 5), (["b1", "b2", "b3", "b4"], 5)], 1, gap=0.0)
    unbounded = simulate(workload, "unbounded")
    assert (unbounded.block_hits, unbounded.hit_rate) == (0, 0.0)
    for policy in ("lru", "belady"):
        result = simulate(workload, policy, 11)
        assert result.preemptions == 1  # the case this test is about
        assert (result.block_lookups, result.block_hits, result.hit_rate) == (8, 0, 0.0)


def _rows(workload: Workload, capacity: int, cache_model: str) -> dict[str, float]:
    return {
        policy: simulate(workload, policy, capacity, cache_model=cache_model).hit_rate
        for policy in ("unbounded", "belady", *ONLINE)
    }


ONLINE = ("lru", "fifo", "lfu", "arc", "s3fifo", "sieve", "mru", "slru")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    requests=st.integers(5, 60),
    rate=st.sampled_from([1.0, 20.0, 200.0]),
    extra=st.integers(0, 60),
    cache_model=st.sampled_from(["radix", "flat"]),
)
def test_no_row_exceeds_the_unbounded_cache(
    seed: int, requests: int, rate: float, extra: int, cache_model: str
) -> None:
    workload = synthetic(
        requests=requests, seed=seed, rate=rate, input_tokens=128.0, output_tokens=64.0, sessions=8
    )
    # At least the largest request (with its output): the simulator refuses less, and a workload's
    # unique blocks can be fewer than that when its requests share most of their prompts.
    least = min_capacity(workload)
    capacity = max(least, min(least + extra, unique_blocks(workload.requests)))
    if cache_model == "flat":
        capacity = max(1, extra)
    rows = _rows(workload, capacity, cache_model)
    lookups = sum(len(r.block_hashes) for r in workload.requests)
    for policy, hit_rate in rows.items():
        assert hit_rate <= rows["unbounded"] + 1e-12, (policy, rows)
    if cache_model == "flat":  # forced-admission MIN is optimal over independent blocks
        assert all(rows["belady"] >= rows[p] - 1e-12 for p in ONLINE), rows
    assert simulate(workload, "lru", capacity, cache_model=cache_model).block_lookups == lookups
