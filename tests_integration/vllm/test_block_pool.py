"""SageBlockPool against vLLM's real BlockPool and FreeKVCacheBlockQueue.

A small driver does what vLLM's single-group KVCacheManager does with the pool: look up the
longest cached prefix, `touch` the hits, `get_new_blocks` for the rest, `cache_full_blocks`,
and `free_blocks` tail first when the request finishes. Hypothesis generates the requests
(chains over a small prefix tree, so prefixes are shared and evicted).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.core import kv_cache_coordinator
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

from sage_eviction.integrations import vllm as sage_vllm
from tests_integration.eventlog import bridges, engine_evictions, read_log, replay

BLOCK = 16


class Request:
    """What `cache_full_blocks` reads of a request: its block hashes."""

    def __init__(self, chain: list[BlockHash]) -> None:
        self.block_hashes = chain
        self.request_id = "r"


def chain_of(path: tuple[int, ...]) -> list[BlockHash]:
    """The block hashes of a prompt whose blocks are `path`: each hash covers its whole prefix."""
    return [BlockHash(hashlib.sha256(repr(path[: i + 1]).encode()).digest()) for i in range(len(path))]


class Driver:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.parent_of: dict[bytes, bytes | None] = {}  # the test's own record of the chains

    def start(self, path: tuple[int, ...]) -> list:
        chain = chain_of(path)
        for i, h in enumerate(chain):
            key = make_block_hash_with_group_id(h, 0)
            self.parent_of[key] = make_block_hash_with_group_id(chain[i - 1], 0) if i else None
        hits = []
        for h in chain:
            got = self.pool.get_cached_block(h, [0])
            if not got:
                break
            hits.append(got[0])
        self.pool.touch(hits)
        blocks = hits + self.pool.get_new_blocks(len(chain) - len(hits))
        self.pool.cache_full_blocks(Request(chain), blocks, len(hits), len(chain), BLOCK, 0)
        return blocks

    def finish(self, blocks: list) -> None:
        self.pool.free_blocks(reversed(blocks))

    def expected_evictable(self) -> set[int]:
        """Free cached blocks that no cached block continues (the leaf rule), computed from the
        chains the test made, not from the pool's own parent records."""
        cached = [b for b in self.pool.blocks if b.block_hash is not None]
        with_child = {self.parent_of[b.block_hash] for b in cached}
        return {b.block_id for b in cached if b.ref_cnt == 0 and b.block_hash not in with_child}


def make_pool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: str, blocks: int
) -> tuple[BlockPool, Path]:
    log = tmp_path / f"events-{spec.replace(':', '_')}.jsonl"
    monkeypatch.setenv(sage_vllm.GPU_POLICY_ENV, spec)
    monkeypatch.setenv("SAGE_EVICTION_LOG", str(log))
    monkeypatch.setattr(kv_cache_coordinator, "BlockPool", kv_cache_coordinator.BlockPool)
    sage_vllm.register()
    cls = kv_cache_coordinator.BlockPool
    assert cls is sage_vllm.sage_block_pool_class()
    return cls(num_gpu_blocks=blocks, enable_caching=True, hash_block_size=BLOCK), log


def test_register_is_a_no_op_without_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sage_vllm.GPU_POLICY_ENV, raising=False)
    monkeypatch.setattr(kv_cache_coordinator, "BlockPool", BlockPool)
    sage_vllm.register()
    assert kv_cache_coordinator.BlockPool is BlockPool


def test_a_bad_spec_fails_at_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sage_vllm.GPU_POLICY_ENV, "nosuch")
    monkeypatch.setattr(kv_cache_coordinator, "BlockPool", BlockPool)
    with pytest.raises(ValueError, match="unknown eviction policy 'nosuch'"):
        sage_vllm.register()
    monkeypatch.setenv(sage_vllm.GPU_POLICY_ENV, "belady")
    with pytest.raises(ValueError, match="needs the future"):
        sage_vllm.register()
    assert kv_cache_coordinator.BlockPool is BlockPool


def test_vllm_lru_and_sage_fifo_choose_different_victims(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A=[A0,A1], B=[B0,B1] cached and freed, then A hit again and freed. vLLM's queue evicts B
    # first (least recently freed); FIFO evicts A's tail first (inserted first), then B's.
    native = BlockPool(num_gpu_blocks=7, enable_caching=True, hash_block_size=BLOCK)
    d = Driver(native)
    a = d.start((1, 2))
    d.finish(a)
    b = d.start((3, 4))
    d.finish(b)
    d.finish(d.start((1, 2)))
    native_first = native.get_new_blocks(3)  # 2 uncached free blocks, then one eviction
    pool, _log = make_pool(monkeypatch, tmp_path, "fifo", 7)
    d = Driver(pool)
    a2 = d.start((1, 2))
    d.finish(a2)
    b2 = d.start((3, 4))
    d.finish(b2)
    d.finish(d.start((1, 2)))
    sage_first = pool.get_new_blocks(3)
    assert native_first[-1].block_id == b[1].block_id  # vLLM: B's tail (B freed before A's reuse)
    assert sage_first[-1].block_id == a2[1].block_id  # FIFO: A's tail, inserted first
    assert pool.sage.stats.evictions == 1 and pool.sage_fallbacks == 0


@pytest.mark.parametrize("spec", ["fifo", "lru", "lfu", "s3fifo:small_ratio=0.25", "arc", "gdsf"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple), min_size=5, max_size=40),
    overlap=st.integers(1, 3),
)
def test_the_engine_evicts_the_policys_victims_and_only_chain_tails(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory, spec: str, paths, overlap: int
) -> None:
    pool, log = make_pool(monkeypatch, tmp_path_factory.mktemp("pool"), spec, 12)
    d = Driver(pool)
    running: list[list] = []
    for path in paths:
        if pool.get_num_free_blocks() < len(path):
            d.finish(running.pop(0))
            continue
        running.append(d.start(path))
        if len(running) > overlap:
            d.finish(running.pop(0))
        assert {k for k in d.expected_evictable() if pool.sage.is_evictable(k)} == d.expected_evictable()
        assert pool.sage.num_evictable == len(d.expected_evictable())
    for blocks in running:
        d.finish(blocks)
    assert pool.sage_fallbacks == 0
    events = read_log(log)
    (only,) = bridges(events).values()
    victims = replay(only)
    assert engine_evictions(only) == victims
    # every block vLLM still maps is in the policy and the other way round
    cached = {b.block_id for b in pool.blocks if b.block_hash is not None}
    assert cached == {k for k in cached if k in pool.sage} and len(pool.sage) == len(cached)


def test_reset_prefix_cache_clears_the_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pool, _ = make_pool(monkeypatch, tmp_path, "lru", 6)
    d = Driver(pool)
    d.finish(d.start((1, 2, 3)))
    assert len(pool.sage) == 3
    assert pool.reset_prefix_cache()
    assert len(pool.sage) == 0
    d.finish(d.start((1, 2)))
    assert len(pool.sage) == 2 and pool.sage.num_evictable == 1  # only the chain's tail


def test_connector_invalidation_removes_blocks_from_the_policy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pool, log = make_pool(monkeypatch, tmp_path, "lru", 6)
    d = Driver(pool)
    blocks = d.start((5, 6))
    d.finish(blocks)
    pool.evict_blocks({blocks[1].block_id})
    assert blocks[1].block_id not in pool.sage
    assert pool.sage.is_evictable(blocks[0].block_id)  # its only child is gone: a tail now
    ops = [e["op"] for e in read_log(log)]
    assert "engine_invalidate" in ops and "engine_evict" not in ops
