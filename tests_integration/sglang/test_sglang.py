"""sage inside SGLang 0.5.23's default radix cache (`UnifiedRadixCache`, Python TreeCore), on CPU:
real `MHATokenToKVPool` and allocator from SGLang's own test kit, inserts, prefix matches and
evictions through the cache's public API. Every device victim must be the sage policy's (the
bridge's log replayed through a fresh policy) and a leaf; both seams are exercised."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest
from sglang.srt.arg_groups import choices
from sglang.srt.mem_cache import registry
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig

from sage_eviction.integrations import sglang as sage_sglang
from tests_integration.eventlog import bridges, engine_evictions, read_log, replay


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")
    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    monkeypatch.setenv("SAGE_EVICTION_LOG", str(tmp_path / "events.jsonl"))
    sage_sglang.register()


def build(spec: str, kv_size: int = 64):
    cfg = CacheConfig(kv_size=kv_size, eviction_policy="lru")
    override = {ComponentType.FULL: sage_sglang.sage_full_component_class(spec)}
    cache, allocator, _ = fixtures.build_fixture(cfg, component_registry_override=override)[:3]
    return cache, allocator


def insert(cache, allocator, tokens: list[int]) -> None:
    """What SGLang does for a finished request: match (a hit), allocate, insert (the tree frees
    the part of the new KV it already held)."""
    cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
    if allocator.available_size() < len(tokens):
        cache.evict(EvictParams(num_tokens=len(tokens) - allocator.available_size()))
    value = allocator.alloc(len(tokens))
    assert value is not None, "the evictions freed too little"
    cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
    assert allocator.available_size() <= 64  # nothing freed twice


def test_register_adds_the_names_and_the_backend() -> None:
    assert "sage-s3fifo" in choices.RADIX_EVICTION_POLICY_CHOICES
    assert "sage" in registry._RADIX_CACHE_REGISTRY
    sage_sglang.register()  # idempotent
    assert choices.RADIX_EVICTION_POLICY_CHOICES.count("sage-s3fifo") == 1
    assert sage_sglang.spec_of("sage-slru", {"protected_threshold": 3}) == "slru:protected_threshold=3"


@pytest.mark.parametrize("spec", ["lfu", "s3fifo:capacity=64,small_ratio=0.25", "fifo"])
def test_every_device_victim_is_the_policys_leaf(tmp_path: Path, spec: str) -> None:
    cache, allocator = build(spec)
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(8)] for _ in range(4)]
    for _ in range(120):
        tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 6))]
        insert(cache, allocator, tokens)
    (events,) = bridges(read_log(tmp_path / "events.jsonl")).values()
    victims = replay(events)  # a fresh policy fed the same events chooses the same victims
    assert len(victims) >= 20, victims
    assert engine_evictions(events) == victims  # and SGLang evicted exactly those, in order
    ops = {e["op"] for e in events}
    assert {"insert", "access", "evictable", "evict"} <= ops


def test_the_cli_accepts_a_sage_policy_and_its_params() -> None:
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(
        ["--model-path", "dummy", "--radix-eviction-policy", "sage-s3fifo", "--radix-eviction-policy-config",
         '{"capacity": 4096, "small_ratio": 0.2}']
    )  # fmt: skip
    assert args.radix_eviction_policy == "sage-s3fifo"
    assert sage_sglang.spec_of(args.radix_eviction_policy, args.radix_eviction_policy_config) == (
        "s3fifo:capacity=4096,small_ratio=0.2"
    )


@pytest.mark.parametrize("seam", ["--radix-eviction-policy", "--radix-cache-backend"])
def test_both_seams_build_the_default_cache_with_sages_component(
    monkeypatch: pytest.MonkeyPatch, seam: str
) -> None:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.server_args import ServerArgs

    _, allocator, req_to_token_pool = fixtures.build_fixture(CacheConfig(kv_size=64))[:3]
    params = CacheInitParams(
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        disable=False,
        tree_components=(ComponentType.FULL,),
        eviction_policy="sage-slru" if seam == "--radix-eviction-policy" else "lru",
        eviction_policy_config={"protected_threshold": 3} if seam == "--radix-eviction-policy" else None,
    )
    ctx = registry.TreeCacheBuildContext(
        server_args=ServerArgs(model_path="dummy", page_size=1),
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    if seam == "--radix-eviction-policy":
        cache = registry.default_radix_cache_factory(ctx)
    else:
        monkeypatch.setenv("SAGE_POLICY", "slru:protected_threshold=3")
        cache = registry._RADIX_CACHE_REGISTRY["sage"](ctx)
    component = cache.tree_core.components_by_type[ComponentType.FULL]
    assert type(component).__name__ == "SageFullComponent"
    assert component.sage.policy.name == "slru" and component.sage.policy.protected_threshold == 3
    for _ in range(10):
        insert(cache, allocator, [random.randrange(1000) for _ in range(9)])
    assert component.sage.stats.evictions > 0
