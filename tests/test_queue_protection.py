"""Queue-aware protection: a waiting request's cached prefix is kept from eviction until it runs
or leaves the queue, within `protect_queued` of the pool, and never at the cost of an allocation
that could succeed. The cache manager directly, the simulator under a load where requests queue,
and the CLI's option (its errors as one line).

The random interleavings with everything else the cache does are in test_cache_state_machine.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_process import benchmark
from engine_fixtures import started_engine

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import synthetic

BS = 4


def _manager(blocks: int = 8, protect: float = 0.5, policy: str = "lru") -> CacheManager:
    clock = iter(range(1, 10_000))
    return CacheManager(
        BlockAllocator(blocks, BS), policy=policy, protect_queued=protect, clock=lambda: float(next(clock))
    )


def _cache(m: CacheManager, seq: int, prompt: list[int]) -> None:
    """Run a request to completion so that its full blocks are cached and unreferenced."""
    m.allocate(CacheRequest(seq, prompt))
    m.free_sequence(seq, prompt)


SYSTEM = [7] * (2 * BS)  # a two-block prefix


@pytest.mark.parametrize("policy", ["lru", "reuse", "arc"])
def test_a_protected_prefix_survives_eviction_until_its_request_runs(policy: str) -> None:
    m = _manager(policy=policy)
    _cache(m, 1, [*SYSTEM, 1])
    assert m.protect_queued_prefix(CacheRequest(2, [*SYSTEM, 2, 2])) == 2
    assert m.num_protected_blocks == 2
    assert all(b.meta.hits == 0 for b in m.radix.blocks())  # protecting is no hit
    assert m.evict(8) == 0  # nothing else is cached, and the protected blocks stay
    assert len(m.radix) == 2
    m.check_invariants()
    alloc = m.allocate(CacheRequest(2, [*SYSTEM, 2, 2]))  # it runs: its hit is whole, its protection ends
    assert alloc.num_cached_blocks == 2
    assert m.num_protected_blocks == 0
    assert m.release_queued(2) == 0
    m.free_sequence(2, [*SYSTEM, 2, 2])
    assert m.evict(8) == 2
    m.check_invariants()


def test_leaving_the_queue_releases_the_prefix() -> None:
    m = _manager()
    _cache(m, 1, [*SYSTEM, 1])
    m.protect_queued_prefix(CacheRequest(2, [*SYSTEM, 2]))
    assert m.evict(8) == 0
    assert m.release_queued(2) == 2
    assert m.release_queued(2) == 0
    assert m.evict(8) == 2
    m.check_invariants()


def test_protection_stays_within_its_fraction_of_the_pool() -> None:
    m = _manager(blocks=8, protect=0.25)  # 2 blocks
    prompt = [3] * (3 * BS) + [0]
    _cache(m, 1, prompt)
    assert m.protect_queued_prefix(CacheRequest(2, prompt)) == 2  # the head of its 3 cached blocks
    assert m.protect_queued_prefix(CacheRequest(3, prompt)) == 2  # the same blocks: no more of the budget
    assert m.num_protected_blocks == 2
    assert m.protect_queued_prefix(CacheRequest(4, [9] * (2 * BS) + [0])) == 0  # nothing of it is cached
    assert m.evict(8) == 1  # the unprotected third block
    m.check_invariants()


def test_protections_yield_to_an_allocation_that_needs_their_blocks() -> None:
    m = _manager(blocks=8, protect=0.5)
    _cache(m, 1, [*SYSTEM, 1])
    m.protect_queued_prefix(CacheRequest(2, [*SYSTEM, 2]))
    # 8 blocks: the whole pool, so the protected prefix must go
    alloc = m.allocate(CacheRequest(3, [5] * (8 * BS)))
    assert alloc.num_new_blocks == 8
    assert m.protections_yielded == 1
    assert m.num_protected_blocks == 0
    assert m.release_queued(2) == 0
    m.check_invariants()
    # and an allocation that cannot succeed even without protections changes nothing
    m.free_sequence(3, cache=False)
    _cache(m, 4, [*SYSTEM, 1])
    m.protect_queued_prefix(CacheRequest(5, [*SYSTEM, 2]))
    m.allocate(CacheRequest(6, [6] * (6 * BS)))  # fits beside the protected prefix: no yield
    assert m.protections_yielded == 1 and m.num_protected_blocks == 2
    with pytest.raises(NoEvictableBlocksError):
        m.allocate(CacheRequest(7, [8] * (3 * BS)))
    assert m.num_protected_blocks == 2
    m.check_invariants()


def test_decode_growth_takes_protected_blocks_before_giving_up() -> None:
    m = _manager(blocks=8, protect=0.5)
    _cache(m, 1, [*SYSTEM, 1])
    m.protect_queued_prefix(CacheRequest(2, [*SYSTEM, 2]))
    m.allocate(CacheRequest(3, [5] * (6 * BS)))  # 6 blocks beside the 2 protected ones: the pool is full
    assert m.reserve_tokens(3, 7 * BS) is not None  # one more block: the protection yields
    assert m.protections_yielded == 1
    m.check_invariants()


def test_off_by_default_and_checked() -> None:
    m = _manager(protect=0.0)
    _cache(m, 1, [*SYSTEM, 1])
    assert m.protect_queued_prefix(CacheRequest(2, [*SYSTEM, 2])) == 0
    assert m.evict(8) == 2
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="protect_queued"):
            _manager(protect=bad)


# ---- the simulator, where requests queue ------------------------------------------------------

# (block_hits, evictions, preemptions) of radix LRU on synthetic(requests=300, seed=2) at 745 blocks
# (10 % of its distinct blocks): requests queue behind ones that cannot be admitted (preemptions).
GOLDEN_QUEUED = {0.0: (18224, 13196, 64), 0.1: (18252, 13168, 64)}


def test_protection_in_the_simulator_under_a_queueing_load() -> None:
    workload = synthetic(requests=300, seed=2)
    got = {}
    for fraction in GOLDEN_QUEUED:
        r = simulate(workload, "lru", 745, protect_queued=fraction)
        got[fraction] = (r.block_hits, r.evictions, r.preemptions)
    assert got == GOLDEN_QUEUED
    assert got[0.1][0] > got[0.0][0]  # the queued requests' hits were kept


def test_the_simulator_checks_the_fraction() -> None:
    workload = synthetic(requests=20, seed=1)
    with pytest.raises(ValueError, match="protect_queued"):
        simulate(workload, "lru", 200, protect_queued=2.0)


# ---- the engine's config key and the benchmark's option ------------------------------------------


def test_the_engine_config_key() -> None:
    from engine_adapter.serving.config import ConfigError, EngineConfig

    assert EngineConfig().protect_queued == 0.0
    assert EngineConfig.from_dict({"protect_queued": 0.25}).protect_queued == 0.25
    with pytest.raises(ConfigError, match="protect_queued"):
        EngineConfig(protect_queued=1.5)


def _sage(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return benchmark(*args, home=tmp_path)


@pytest.mark.slow
def test_the_benchmark_option_as_a_real_process(tmp_path: Path) -> None:
    common = ("--workload", "synthetic", "--requests", "60", "--eviction-policies", "lru,reuse")
    proc = _sage(*common, "--protect-queued", "0.2", "--json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["settings"]["protect_queued"] == 0.2
    assert {row["policy"] for row in result["results"]} >= {"lru", "reuse", "belady", "unbounded"}
    for args, fragment in (
        (("--protect-queued", "2"), "--protect-queued"),
        (("--protect-queued", "0.2", "--cache-model", "flat"), "radix"),
    ):
        bad = _sage(*common, *args, tmp_path=tmp_path)
        assert bad.returncode != 0
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in bad.stderr, bad.stderr


# ---- the engine: the scheduler protects, admits, drops and times out with protection on ---------


ENGINE_PROMPTS = [
    "You are a careful assistant. Tell me about caches.",
    "You are a careful assistant. Tell me about queues.",
    "You are a careful assistant. Tell me about caches, again.",
    "A different prefix entirely: " + "x" * 11,
    "You are a careful assistant. Tell me about caches.",
    "Short.",
]


def _outputs(engine: Any) -> list[list[int]]:
    from engine_adapter.model.sampling import SamplingParams

    handles = [engine.submit(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in ENGINE_PROMPTS]
    return [h.result(timeout=120).token_ids for h in handles]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lru", "reuse"])
def test_engine_outputs_are_exact_with_protection_under_eviction_and_preemption(policy: str) -> None:
    reference = started_engine()
    try:
        expected = _outputs(reference)
    finally:
        reference.shutdown()
    engine = started_engine(num_blocks=24, eviction_policy=policy, protect_queued=0.5)
    try:
        got = _outputs(engine)
        stats = engine.eviction_stats()
        engine.cache.check_invariants()
        assert engine.cache.num_protected_blocks == 0  # every request ran: no protection left
    finally:
        engine.shutdown()
    assert got == expected
    assert stats.total_evictions > 0 and stats.preemptions > 0


@pytest.mark.slow
def test_engine_requests_leaving_the_queue_release_their_protection() -> None:
    from engine_adapter.model.sampling import SamplingParams

    engine = started_engine(max_queued_requests=2, max_num_seqs=1, protect_queued=0.5)
    try:
        engine.submit(ENGINE_PROMPTS[0], SamplingParams(max_tokens=2)).result(60)  # cache a prefix
        with engine.cache.lock:  # hold the loop so that all four wait together
            handles = [
                engine.submit(ENGINE_PROMPTS[0] + f" {i}", SamplingParams(max_tokens=2), priority=p)
                for i, p in enumerate([1, 0, 2, 1])
            ]
            engine._drain_inbox()
            assert engine.cache.num_protected_blocks > 0  # the waiting ones protect the prefix
        results = [h.result(60) for h in handles]
        assert sum(r.finish_reason == "dropped" for r in results) == 2
        with engine.cache.lock:
            assert engine.cache.num_protected_blocks == 0
            engine.cache.check_invariants()
    finally:
        engine.shutdown()
