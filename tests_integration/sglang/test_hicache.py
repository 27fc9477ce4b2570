"""sage choosing the host tier of SGLang 0.5.23's HiCache, on CPU, against the real package.

`UnifiedRadixCache` (Python TreeCore) is built with SGLang's own test kit (real CPU
`MHATokenToKVPool` and allocator) and `init_hicache` gives it its real host pool and
`HybridCacheController`: write-through and write-back backups, device evictions that demote to
host, host hits loaded back, and host pool pressure reaching `FullComponent.drive_host_eviction`,
all through the cache's public calls. Two things are adapted to a machine without a GPU, as
SGLang's own kit does: host memory is not pinned, and the one copy kernel the `direct` I/O
backend calls (`transfer_kv_direct`, from CUDA `sgl_kernel`) is replaced by an indexed tensor
copy, so the bytes really move and the tests check them after every load back.

Owed on a GPU (not run here): the CUDA copy kernels and streams (`kernel` I/O backend, pinned
memory, overlap of transfers with compute), the L3 storage backends' prefetch, and a real
`sglang serve --enable-hierarchical-cache` under load comparing host policies.
"""

from __future__ import annotations

import atexit
import random
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache import registry
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
from sglang.srt.mem_cache.pool_host import mha
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig

from sage_eviction.errors import PolicyConfigError
from sage_eviction.integrations import sglang as sage_sglang
from tests_integration.eventlog import engine_evictions, read_log, replay

KV = 64  # device pool, tokens; the host pool is twice that (hicache_ratio=2, SGLang's default)


def cpu_transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """The CPU stand-in for sgl_kernel's `transfer_kv_direct`: the same gather/scatter per layer."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices] = src[src_indices]


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")
    monkeypatch.setattr(mha, "transfer_kv_direct", cpu_transfer_kv_direct, raising=False)
    host_pool_cls = assembler.get_mha_host_pool_cls

    def unpinned(device_pool: Any) -> Any:
        cls = host_pool_cls(device_pool)
        return lambda *a, **k: cls(*a, **{**k, "pin_memory": False})  # no CUDA to pin for

    monkeypatch.setattr(assembler, "get_mha_host_pool_cls", unpinned)
    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    monkeypatch.setenv("SAGE_EVICTION_LOG", str(tmp_path / "events.jsonl"))
    monkeypatch.delenv("SAGE_POLICY", raising=False)
    monkeypatch.delenv("SAGE_HICACHE_POLICY", raising=False)
    sage_sglang.register()


def hicache_args(write_policy: str = "write_through") -> ServerArgs:
    """HiCache's server args for CPU: the `direct` I/O backend, host pool twice the device's."""
    args = ServerArgs(
        model_path="dummy",
        page_size=1,
        enable_hierarchical_cache=True,
        hicache_io_backend="direct",
        hicache_mem_layout="layer_first",
        hicache_write_policy=write_policy,
        hicache_ratio=2.0,
    )
    set_global_server_args_for_scheduler(args)
    return args


class HiCache:
    """A HiCache-enabled UnifiedRadixCache and the scheduler's side of serving one request."""

    def __init__(self, cache: Any, allocator: Any, *, sage: bool) -> None:
        self.cache, self.allocator = cache, allocator
        fixtures.drop_hicache_atexit_pin(self.cache)
        self.full = self.cache.tree_core.components_by_type[ComponentType.FULL]
        self.sage = sage  # sage's component: check its policies against the tree
        self.host_victims: list[int] = []  # first token of each host leaf SGLang dropped
        self.host_hits = 0
        evict_host_leaf = self.cache.tree_core._evict_host_leaf

        def record(node: Any, *args: Any, **kwargs: Any) -> None:
            self.host_victims.append(node.key.token_ids[0])
            evict_host_leaf(node, *args, **kwargs)

        self.cache.tree_core._evict_host_leaf = record
        drive = self.cache.tree_core.drive_host_eviction

        def drive_fully(component_type: Any, num_tokens: int) -> Any:
            result = drive(component_type, num_tokens)
            # SGLang's contract: free what was asked while any host leaf is left to drop.
            assert (
                result.tracker[component_type] >= num_tokens or not self.cache.tree_core.evictable_host_leaves
            )
            return result

        self.cache.tree_core.drive_host_eviction = drive_fully

    @classmethod
    def from_kit(cls, override: dict[Any, Any] | None, write_policy: str = "write_through") -> HiCache:
        """Built as SGLang's own HiCache unit tests build theirs."""
        cfg = CacheConfig(kv_size=KV, eviction_policy="lru", dtype=torch.float32)
        cache, allocator, _ = fixtures.build_fixture(cfg, component_registry_override=override)[:3]
        cache.init_hicache(hicache_args(write_policy), cache.cache_init_params)
        return cls(cache, allocator, sage=override is not None)

    def kv(self) -> torch.Tensor:
        pool = self.allocator.get_kvcache()
        return pool.get_key_buffer(pool.start_layer)

    def serve(self, tokens: list[int]) -> int:
        """Match (loading a host hit back), allocate, write the KV, insert; the host hit length."""
        key = RadixKey(array("q", tokens))
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        host_hit = int(match.host_hit_length)
        if host_hit > 0:
            self.host_hits += 1
            self._load_back(match.best_match_node)
            if self.sage:
                self.assert_policies_hold_their_tiers()  # before the insert re-walks the path
            match = self.cache.match_prefix(MatchPrefixParams(key=key))
            assert match.host_hit_length == 0
        # Every cached token's KV is its token id: what came back from host must be it.
        hit = match.device_prefix_len
        indices = self.cache.path_device_indices(match.last_device_node)[:hit]
        assert self.kv()[indices][:, 0, 0].tolist() == [float(t) for t in tokens[:hit]]
        if self.allocator.available_size() < len(tokens):
            self.cache.evict(EvictParams(num_tokens=len(tokens) - self.allocator.available_size()))
        value = self.allocator.alloc(len(tokens))
        assert value is not None, "the evictions freed too little"
        self.kv()[value] = torch.tensor(tokens, dtype=torch.float32)[:, None, None]
        self.cache.insert(InsertParams(key=key, value=value))
        self.cache.writing_check(write_back=True)  # wait for the backups, as the scheduler polls
        return host_hit

    def _load_back(self, node_id: Any) -> None:
        assert self.cache.load_back(node_id)
        assert self.cache.ready_to_load_host_cache() != -1
        for ack in list(self.cache.cache_controller.ack_load_queue):
            ack.finish_event.synchronize()
        self.cache.loading_check()
        for node, lock, host_lock in list(self.cache.ongoing_load_back.values()):
            self.cache.dec_lock_ref(node, lock)  # the request finished with its prefix
            self.cache.dec_host_lock_ref(node, host_lock)
        self.cache.ongoing_load_back.clear()

    def assert_policies_hold_their_tiers(self) -> None:
        """Each policy holds exactly the nodes of its tier: those with device KV, those with a
        host copy (no node lost to the policy, none it could pick that is already gone)."""
        device, host, stack = set(), set(), list(self.cache.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            data = node.component_data[ComponentType.FULL]
            if data.value is not None:
                device.add(node.id)
            if data.host_value is not None:
                host.add(node.id)
        assert set(self.full._nodes) == device and len(self.full.sage) == len(device)
        assert set(self.full._host_nodes) == host and len(self.full.sage_host) == len(host)

    def close(self) -> None:
        self.cache.release_host_resources()
        atexit.unregister(self.cache.shutdown)


@pytest.fixture
def hicaches() -> Iterator[list[HiCache]]:
    made: list[HiCache] = []
    yield made
    for cache in made:
        cache.close()


def sage(device: str, host: str | None) -> dict[Any, Any]:
    return {ComponentType.FULL: sage_sglang.sage_full_component_class(device, host)}


def by_engine(log: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in read_log(log):
        out.setdefault(event["engine"], []).append(event)
    return out


def frequent_then_recent(cache: HiCache) -> int:
    """Prefix 1 is used four times, then prefixes 2..10 once each (16 tokens each, one branch
    per prefix): the device tier demotes them to host, the host pool (128) fills, and host
    eviction starts. Then prefix 1 returns: its host hit length."""
    seqs = {p: [p] + [100 + 16 * p + i for i in range(15)] for p in range(1, 12)}
    for _ in range(4):
        cache.serve(seqs[1])
    for p in range(2, 12):
        cache.serve(seqs[p])
    return cache.serve(seqs[1])


def test_host_tier_evicts_in_the_host_policys_order_not_recency(
    tmp_path: Path, hicaches: list[HiCache]
) -> None:
    stock = HiCache.from_kit(None)  # SGLang's own FullComponent, --radix-eviction-policy lru
    hicaches.append(stock)
    stock_hit = frequent_then_recent(stock)
    assert stock.host_victims[0] == 1  # recency: the frequent prefix, least recently used, goes first
    assert stock_hit == 0

    lfu = HiCache.from_kit(sage("lru", "lfu"))  # the same device order, LFU on host
    hicaches.append(lfu)
    lfu_hit = frequent_then_recent(lfu)
    assert lfu.host_victims and 1 not in lfu.host_victims
    assert lfu.host_victims[0] == 2  # the least frequent, the oldest among those
    assert lfu_hit == 16  # prefix 1 survived on host and came back from it
    events = by_engine(tmp_path / "events.jsonl")
    host_events = events["sglang-hicache"]
    assert host_events[0]["spec"] == "lfu" and events["sglang"][0]["spec"] == "lru"
    assert engine_evictions(host_events) == replay(host_events)  # every host victim the policy's


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_device_and_host_policies_differ_and_every_victim_is_theirs(
    tmp_path: Path, hicaches: list[HiCache], write_policy: str
) -> None:
    cache = HiCache.from_kit(sage("fifo", "lfu"), write_policy)
    hicaches.append(cache)
    rng = random.Random(11)
    prefixes = [[rng.randrange(1000) for _ in range(10)] for _ in range(14)]
    for step in range(160):
        hot = rng.random() < 0.6
        prefix = prefixes[rng.randrange(3)] if hot else rng.choice(prefixes)
        cache.serve(prefix + [rng.randrange(1000) for _ in range(rng.randrange(1, 5))])
        cache.assert_policies_hold_their_tiers()
        if step % 40 == 39:
            cache.cache.sanity_check()  # SGLang's own tree, leaf-set and size invariants
    # Drain the host tier: parents left childless by a drop go in the same walk.
    assert cache.cache.evict_host(10**6) > 0 and not cache.cache.tree_core.evictable_host_leaves
    cache.assert_policies_hold_their_tiers()
    events = by_engine(tmp_path / "events.jsonl")
    device, host = events["sglang"], events["sglang-hicache"]
    assert (device[0]["policy"], host[0]["policy"]) == ("fifo", "lfu")
    device_victims, host_victims = replay(device), replay(host)
    assert engine_evictions(device) == device_victims and len(device_victims) >= 20
    assert engine_evictions(host) == host_victims and len(host_victims) >= 10
    assert cache.host_hits >= 10
    assert {e["op"] for e in host} >= {"insert", "access", "evictable", "evict", "engine_evict"}
    assert cache.full.host_late_inserts == 0  # every host copy arrived through a hook


def build_with(policy: str, config: dict[str, Any] | None, seam: str, *, hierarchical: bool = False) -> Any:
    """The cache SGLang's scheduler builds (`registry.create_tree_cache`'s factories)."""
    _, allocator, req_to_token_pool = fixtures.build_fixture(CacheConfig(kv_size=KV, dtype=torch.float32))[:3]
    params = CacheInitParams(
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        disable=False,
        tree_components=(ComponentType.FULL,),
        eviction_policy=policy,
        eviction_policy_config=config,
    )
    # The model worker only receives the HiCache layer counter; there is no model here to run.
    worker = SimpleNamespace(register_hicache_layer_transfer_counter=lambda counter: None)
    ctx = registry.TreeCacheBuildContext(
        server_args=hicache_args() if hierarchical else ServerArgs(model_path="dummy", page_size=1),
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=hierarchical,
        disable_radix_cache=False,
        tp_worker=worker,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    factory = (
        registry.default_radix_cache_factory if seam == "policy" else registry._RADIX_CACHE_REGISTRY["sage"]
    )
    cache = factory(ctx)
    return (
        HiCache(cache, allocator, sage=True)
        if hierarchical
        else cache.tree_core.components_by_type[ComponentType.FULL]
    )


def test_the_cli_and_sglangs_factory_build_hicache_with_both_policies(
    tmp_path: Path, hicaches: list[HiCache]
) -> None:
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(
        ["--model-path", "dummy", "--enable-hierarchical-cache", "--radix-eviction-policy", "sage-lru",
         "--radix-eviction-policy-config", '{"hicache_policy": "lfu"}']
    )  # fmt: skip
    assert args.enable_hierarchical_cache
    config = args.radix_eviction_policy_config
    assert (sage_sglang.spec_of(args.radix_eviction_policy, config), sage_sglang.host_spec_of(config)) == (
        "lru",
        "lfu",
    )
    cache = build_with(args.radix_eviction_policy, config, "policy", hierarchical=True)
    hicaches.append(cache)
    assert cache.cache.cache_controller is not None  # HiCache is on
    assert frequent_then_recent(cache) == 16 and cache.host_victims[0] == 2  # as the kit-built one
    assert by_engine(tmp_path / "events.jsonl")["sglang-hicache"][0]["spec"] == "lfu"


def test_the_host_policy_comes_from_the_config_the_env_or_the_device_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = {"hicache_policy": "s3fifo:capacity=256", "protected_threshold": 3}
    full = build_with("sage-slru", config, "policy")
    assert (full.sage_spec, full.host_spec) == ("slru:protected_threshold=3", "s3fifo:capacity=256")
    assert full.sage_host.policy.name == "s3fifo" and full.sage.policy.name == "slru"
    assert build_with("sage-fifo", None, "policy").host_spec == "fifo"  # one name, both tiers
    monkeypatch.setenv("SAGE_POLICY", "fifo")
    monkeypatch.setenv("SAGE_HICACHE_POLICY", "lfu")
    backend = build_with("lru", None, "backend")
    assert (backend.sage.policy.name, backend.sage_host.policy.name) == ("fifo", "lfu")


@pytest.mark.parametrize(
    ("config", "message"),
    [({"hicache_policy": "nope"}, "sglang-hicache integration: unknown eviction policy 'nope'"),
     ({"hicache_policy": 3}, "hicache_policy must be a policy spec string, got 3")],
)  # fmt: skip
def test_a_bad_host_policy_fails_when_the_cache_is_built(config: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyConfigError, match=message):
        build_with("sage-lru", config, "policy")
