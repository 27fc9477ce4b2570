"""sage's LMCache policies against the real lmcache 0.5.6: its LocalCPUBackend (CPU allocator,
real CacheEngineKeys and MemoryObjs) and the multi-process server's eviction factory.

The oracle is LMCache itself: the same operations through LMCache's own LRU and FIFO and through
sage's `SAGE_LRU` and `SAGE_FIFO` must evict the same chunks in the same order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.config import EvictionConfig
from lmcache.v1.distributed.eviction_policy.lru import LRUEvictionPolicy
from lmcache.v1.distributed.internal_api import EvictionDestination
from lmcache.v1.distributed.storage_controllers import eviction_controller
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.pin_monitor import PinMonitor
from lmcache.v1.storage_backend import cache_policy
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from sage_eviction.integrations import lmcache as sage_lmcache
from tests_integration.eventlog import bridges, read_log, replay

SHAPE = torch.Size([2, 4, 8])  # one chunk's KV: 128 bytes in bfloat16
SLOTS = 6


def chunk(i: int) -> CacheEngineKey:
    return CacheEngineKey("smollm2", 1, 0, i, torch.bfloat16)


class Backend:
    """A LocalCPUBackend whose allocator holds exactly SLOTS chunks."""

    def __init__(self, policy: str) -> None:
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=4, local_cpu=True, max_local_cpu_size=0.001, cache_policy=policy
        )
        probe = TensorMemoryAllocator(torch.empty(1 << 16, dtype=torch.uint8))
        obj = probe.allocate(SHAPE, torch.bfloat16)
        per_chunk = obj.get_physical_size() if hasattr(obj, "get_physical_size") else obj.get_size()
        buffer = torch.empty(per_chunk * SLOTS, dtype=torch.uint8)
        PinMonitor.GetOrCreate(config)  # LMCache's engine makes this singleton before any pin
        self.backend = LocalCPUBackend(config, memory_allocator=TensorMemoryAllocator(buffer))
        self.evicted: list[int] = []

    def put(self, i: int) -> None:
        if self.backend.contains(chunk(i)):
            return
        before = set(self.backend.get_keys())
        obj = self.backend.allocate(SHAPE, torch.bfloat16, busy_loop=False)
        assert obj is not None, "no chunk could be evicted"
        self.evicted += [k.chunk_hash for k in before - set(self.backend.get_keys())]
        self.backend.submit_put_task(chunk(i), obj)
        obj.ref_count_down()  # the caller's reference: the cache now holds the only one

    def hit(self, i: int) -> bool:
        if not self.backend.contains(chunk(i), pin=True):
            return False
        self.backend.touch_cache()
        self.backend.unpin(chunk(i))
        return True


@pytest.fixture(autouse=True)
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cache_policy, "POLICY_MAPPING", dict(cache_policy.POLICY_MAPPING))
    monkeypatch.setattr(eviction_controller, "CreateEvictionPolicy", eviction_controller.CreateEvictionPolicy)
    monkeypatch.setenv("SAGE_EVICTION_LOG", str(tmp_path / "events.jsonl"))
    sage_lmcache.install()


def test_install_adds_sage_names_and_keeps_lmcaches_own() -> None:
    assert {"LRU", "LFU", "FIFO", "MRU", "SAGE", "SAGE_GDSF", "SAGE_LRU"} <= set(cache_policy.POLICY_MAPPING)
    assert "SAGE_BELADY" not in cache_policy.POLICY_MAPPING  # needs the future
    assert "SAGE_S3FIFO" not in cache_policy.POLICY_MAPPING  # needs a capacity: SAGE + SAGE_POLICY
    policy = cache_policy.get_cache_policy("sage_gdsf")
    assert policy.sage.policy.name == "gdsf"
    sage_lmcache.install()  # idempotent: the factory is wrapped once
    assert getattr(eviction_controller.CreateEvictionPolicy, "__sage__", False)


def test_sage_reads_sage_policy_for_the_plain_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGE_POLICY", "s3fifo:capacity=64,small_ratio=0.2")
    policy = cache_policy.get_cache_policy("SAGE").sage.policy
    assert (policy.name, policy.capacity) == ("s3fifo", 64)
    monkeypatch.delenv("SAGE_POLICY")
    with pytest.raises(ValueError, match="no policy given; set SAGE_POLICY"):
        cache_policy.get_cache_policy("SAGE")


ops = st.lists(st.tuples(st.sampled_from(["put", "hit"]), st.integers(0, 9)), min_size=1, max_size=60)


@pytest.mark.parametrize(("theirs", "ours"), [("LRU", "SAGE_LRU"), ("FIFO", "SAGE_FIFO")])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=ops)
def test_sage_evicts_what_lmcaches_own_policy_evicts(theirs: str, ours: str, sequence) -> None:
    reference, sage = Backend(theirs), Backend(ours)
    for op, i in sequence:
        if op == "put":
            reference.put(i)
            sage.put(i)
        else:
            assert reference.hit(i) == sage.hit(i)
    assert sage.evicted == reference.evicted
    assert set(sage.backend.get_keys()) == set(reference.backend.get_keys())


def test_a_pinned_victim_is_skipped_and_kept(tmp_path: Path) -> None:
    b = Backend("SAGE_FIFO")
    for i in range(SLOTS):
        b.put(i)
    assert b.backend.contains(chunk(0), pin=True)  # a retrieval holds chunk 0
    b.put(100)
    assert b.evicted == [1]  # FIFO's next victim
    assert chunk(0) in b.backend.get_keys()
    b.backend.unpin(chunk(0))
    b.put(101)
    # The refused victim went back in as a new entry (sage's policies have no "skip"): FIFO now
    # takes chunk 2, where LMCache's own FIFO, which keeps its place, would take chunk 0.
    assert b.evicted == [1, 2]
    (events,) = bridges(read_log(tmp_path / "events.jsonl")).values()
    # the log's keys are the CacheEngineKeys' strings; a fresh policy replays the same choices
    assert replay(events) == [str(chunk(1)), str(chunk(2))]
    assert next(e["refused"] for e in events if e["op"] == "evict_eligible") == [str(chunk(0))]


def object_key(i: int) -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="smollm2", kv_rank=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sequence=st.lists(
        st.tuples(st.sampled_from(["create", "touch", "remove"]), st.integers(0, 15)), max_size=60
    ),
    ratio=st.sampled_from([0.1, 0.2, 0.5]),
)
def test_the_mp_servers_factory_builds_sage_and_matches_its_lru(sequence, ratio: float) -> None:
    ours = eviction_controller.CreateEvictionPolicy(EvictionConfig(eviction_policy="SAGE_LRU"))
    theirs = LRUEvictionPolicy()
    assert type(ours).__name__ == "SageEvictionPolicy"
    for policy in (ours, theirs):
        policy.register_eviction_destination(EvictionDestination.DISCARD)
    method = {"create": "on_keys_created", "touch": "on_keys_touched", "remove": "on_keys_removed"}
    for op, i in sequence:
        for policy in (ours, theirs):
            getattr(policy, method[op])([object_key(i)])
    locked = {object_key(0), object_key(1)}

    def eligible(key: ObjectKey) -> bool:
        return key not in locked

    got = ours.get_eviction_actions(ratio, eligible)
    want = theirs.get_eviction_actions(ratio, eligible)
    assert [(a.destination, a.keys) for a in got] == [(a.destination, a.keys) for a in want]


def test_other_names_still_reach_lmcaches_factory() -> None:
    assert type(eviction_controller.CreateEvictionPolicy(EvictionConfig(eviction_policy="LRU"))).__name__ == (
        "LRUEvictionPolicy"
    )
