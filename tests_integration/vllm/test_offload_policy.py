"""sage's `CachePolicy` inside vLLM's real KV-offload manager (`CPUOffloadingManager`), resolved
the way vLLM resolves it from `kv_connector_extra_config` (`eviction_policy` +
`cache_policy_module_path`). The oracle is vLLM's own LRU: the same stores and loads through
`lru` and through `Sage_lru` must evict the same chunks in the same order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

from sage_eviction.integrations import vllm as sage_vllm
from tests_integration.eventlog import bridges, read_log, replay

MODULE = "sage_eviction.integrations.vllm"


def key(i: int) -> bytes:
    return i.to_bytes(8, "big") + (0).to_bytes(4, "big")  # block hash + group index, as vLLM packs


class Manager:
    def __init__(self, policy: str, chunks: int = 4) -> None:
        module = MODULE if policy.startswith("Sage") else None
        self.m = CPUOffloadingManager(num_chunks=chunks, cache_policy=policy, cache_policy_module_path=module)
        self.evicted: list[bytes] = []
        self.n = 0

    def store(self, ids: list[int]) -> bool:
        self.n += 1
        ctx = ReqContext(req_id=f"r{self.n}")
        out = self.m.prepare_store([key(i) for i in ids], ctx)
        if out is None:
            return False
        self.evicted += list(out.evicted_keys)
        self.m.complete_store(out.keys_to_store, ctx)
        self.m.on_request_finished(ctx)
        return True

    def load(self, ids: list[int]) -> int:
        self.n += 1
        ctx = ReqContext(req_id=f"r{self.n}")
        hits = []
        for i in ids:
            if self.m.lookup(key(i), ctx).name != "HIT":
                break
            hits.append(key(i))
        if hits:
            self.m.prepare_load(hits, ctx)
            self.m.touch(hits, ctx)
            self.m.complete_load(hits, ctx)
        self.m.on_request_finished(ctx)
        return len(hits)


def test_vllm_resolves_the_class_by_name_from_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGE_POLICY", "s3fifo:small_ratio=0.2")
    cls = CachePolicyFactory.get_cache_policy_cls("SagePolicy", MODULE)
    assert issubclass(cls, CachePolicy) and cls.__name__ == "SagePolicy"
    policy = cls(cache_capacity=8)
    assert policy.sage.policy.name == "s3fifo" and policy.sage.policy.capacity == 8
    assert (
        CachePolicyFactory.get_cache_policy_cls("Sage_gdsf", MODULE)(cache_capacity=4).sage.policy.name
        == "gdsf"
    )
    with pytest.raises(AttributeError):
        CachePolicyFactory.get_cache_policy_cls("NotSage", MODULE)


def test_evict_is_all_or_nothing_and_skips_protected_chunks(tmp_path: Path) -> None:
    policy = sage_vllm.sage_cache_policy_class("fifo")(cache_capacity=3)
    for i in range(3):
        chunk = ChunkStatus(i)
        policy.insert(key(i), chunk)  # the 0.32 signature
        chunk.ref_cnt = 0
        policy.mark_evictable(key(i))
    policy.mark_non_evictable(key(1))
    assert policy.evict(2, {key(0)}) is None  # only chunk 2 may go: nothing changes
    assert [k for k, _ in policy.evict(1, {key(0)})] == [key(2)]
    policy.insert(key(5), ChunkStatus(5), None)  # the 0.33 signature (req_context)
    assert policy.get(key(5)).chunk_id == 5 and policy.get(key(2)) is None
    assert [k for k, _ in policy.evict(1, set())] == [key(0)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["store", "load"]),
            st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True),
        ),
        max_size=40,
    )
)
def test_sage_lru_evicts_what_vllms_lru_evicts(ops) -> None:
    theirs, ours = Manager("lru"), Manager("Sage_lru")
    for op, ids in ops:
        if op == "store":
            assert theirs.store(ids) == ours.store(ids)
        else:
            assert theirs.load(ids) == ours.load(ids)
        assert ours.evicted == theirs.evicted


def test_a_ghost_policy_hears_of_the_miss_before_it_evicts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # vLLM calls on_store_miss before evict (ARC adapts on a ghost hit there); sage's ARC gets
    # prepare_insert at that point, and a fresh ARC replaying the events chooses the same victims.
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("SAGE_EVICTION_LOG", str(log))
    m = Manager("Sage_arc", chunks=2)
    for ids in ([0], [1], [2], [0], [3], [0]):
        assert m.store(ids)
    events = read_log(log)
    ops = [(e["op"], e.get("key")) for e in events if e["op"] in ("prepare_insert", "evict", "insert")]
    assert ops[
        ops.index(
            (
                "prepare_insert",
                key(0).hex(),
            ),
            3,
        ) :
    ][:3] == [
        ("prepare_insert", key(0).hex()),
        ("evict", None),
        ("insert", key(0).hex()),
    ]
    (only,) = bridges(events).values()
    assert [bytes.fromhex(k) for k in replay(only)] == m.evicted
