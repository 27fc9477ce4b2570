"""Token-level eviction on the paged pool (spec 002): compaction, the cache manager's side, and
the engine under memory pressure and per-request ``kv_compression`` (sage-tiny, CPU).

The policies' choices are checked against kvpress in tests/test_token_eviction_kvpress.py; here
the invariants of moving K/V around and of the engine that drives it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from engine_adapter.model import load_model
from engine_adapter.model.decoder import ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import ConfigError, EngineConfig, resolve_config
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.errors import RequestError
from engine_adapter.token_eviction import KVCompression
from engine_adapter.token_eviction.generate import generate_compressed
from engine_adapter.token_eviction.presses.base import kept_for_ratio
from engine_adapter.token_eviction.presses.none import NoEvictionPolicy
from engine_adapter.token_eviction.presses.sliding import SlidingWindowPolicy
from engine_adapter.token_eviction.pressure import MemoryStats, TokenCacheManager
from engine_adapter.token_eviction.registry import make_token_policy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

LAYERS, HEADS, DIM, BS = 2, 3, 4, 4


def _filled_pool(
    num_blocks: int, length: int, seed: int
) -> tuple[PagedKVPool, SequenceKV, list[torch.Tensor]]:
    pool = PagedKVPool(
        num_layers=LAYERS,
        num_kv_heads=HEADS,
        head_dim=DIM,
        block_size=BS,
        num_blocks=num_blocks,
        device="cpu",
    )
    table = pool.allocator.allocate(-(-length // BS))[::-1]  # out of order on purpose
    gen = torch.Generator().manual_seed(seed)
    keys = []
    slots = PagedKVPool.slot_mapping(table, 0, length, BS)
    for layer in range(LAYERS):
        k = torch.randn(length, HEADS, DIM, generator=gen)
        pool.write(layer, slots, k, -k)
        keys.append(k)
    return pool, SequenceKV(pool, table, length, position_offset=5), keys


@given(
    length=st.integers(1, 40),
    extra_blocks=st.integers(0, 3),
    data=st.data(),
)
def test_compaction_keeps_exactly_the_kept_kv_per_head(length: int, extra_blocks: int, data: Any) -> None:
    """Random kept sets per layer and head: the pool then holds exactly those K/V in order, in
    ceil(n / block_size) blocks, every other block is free, and the position offset grew by
    the tokens removed. `extra_blocks` 0 is a pool with no free block (compaction needs none)."""
    pool, kv, keys = _filled_pool(-(-length // BS) + extra_blocks, length, seed=length)
    n = data.draw(st.integers(1, length))
    keep = torch.stack(
        [
            torch.stack(
                [
                    torch.tensor(sorted(data.draw(st.permutations(range(length)))[:n]), dtype=torch.long)
                    for _ in range(HEADS)
                ]
            )
            for _ in range(LAYERS)
        ]
    )
    removed = kv.compact(keep)
    assert removed == length - n
    assert kv.length == n and kv.position_offset == 5 + removed
    assert len(kv.block_table) == kv.num_blocks() == -(-n // BS)
    assert pool.allocator.num_free == pool.num_blocks - len(kv.block_table)
    assert kv.memory_usage_bytes() == len(kv.block_table) * pool.bytes_per_block
    for layer in range(LAYERS):
        k, v = pool.gather(layer, kv.block_table, n)
        for head in range(HEADS):
            want = keys[layer][keep[layer, head], head]
            assert torch.equal(k[:, head], want)
            assert torch.equal(v[:, head], -want)


def test_compaction_rejects_bad_kept_sets() -> None:
    _pool, kv, _keys = _filled_pool(8, 10, seed=1)
    with pytest.raises(ValueError, match="ascending"):
        kv.compact(torch.tensor([3, 1]).expand(LAYERS, HEADS, 2))
    with pytest.raises(ValueError, match="layers, kv_heads"):
        kv.compact(torch.arange(4).expand(1, HEADS, 4))
    assert kv.length == 10  # nothing changed


def test_prune_prefix_is_the_spec_memmove() -> None:
    pool, kv, keys = _filled_pool(8, 10, seed=2)
    assert kv.prune_prefix(3) == 3
    k, _v = pool.gather(1, kv.block_table, kv.length)
    assert torch.equal(k, keys[1][3:])


# ---- the cache manager's side -----------------------------------------------------------------


def test_compacted_sequence_is_never_committed_or_shared() -> None:
    """compact_sequence unlocks the cached prefix (it stays in the tree, for others to hit),
    frees the private blocks, and from then on nothing of the sequence is cached."""
    manager = CacheManager(BlockAllocator(16, 4), policy="lru")
    prompt = list(range(20))
    alloc = manager.allocate(CacheRequest(1, prompt))
    assert manager.commit_blocks(1, prompt, num_computed_tokens=20) == 5
    before = manager.block_table(1)
    assert manager.compaction_gain(1, 8) == 5 - 2
    table = manager.compact_sequence(1, 8)
    assert table is not None and len(table) == 2 and manager.sequence(1).compressed
    assert not set(table) & {b.block_id for b in manager.radix.match(manager.sequence(1).keys)}
    grown = prompt + [99] * 8  # more tokens computed into the compacted table
    assert manager.commit_blocks(1, grown, num_computed_tokens=12) == 0
    assert manager.free_sequence(1, grown, num_computed_tokens=12) == 0
    # the original prefix is still cached, in its original blocks; the compacted ones are free
    hit = manager.lookup(CacheRequest(2, [*prompt, 7]))
    assert hit.num_cached_blocks == 5 and alloc.block_table[:5] == before[:5]
    assert manager.num_free_blocks == 16 - 5
    manager.check_invariants()


def test_compaction_of_a_shared_prefix_gains_nothing() -> None:
    manager = CacheManager(BlockAllocator(12, 4), policy="lru")
    prompt = list(range(17))
    manager.allocate(CacheRequest(1, prompt))
    manager.commit_blocks(1, prompt, num_computed_tokens=17)
    manager.allocate(CacheRequest(2, prompt))  # shares the 4 full blocks
    assert manager.compaction_gain(1, 8) == 1 - 2  # only its private last block comes back
    manager.check_invariants()


# ---- memory pressure --------------------------------------------------------------------------


class _FakeMonitor:
    def __init__(self, available: int) -> None:
        self.available = available

    def mem_stats(self) -> MemoryStats:
        return MemoryStats(self.available, 10**9, "test")


def test_maybe_evict_longest_first_until_above_threshold() -> None:
    pool = PagedKVPool(num_layers=1, num_kv_heads=1, head_dim=2, block_size=4, num_blocks=64, device="cpu")
    caches = []
    for sid, length in ((1, 12), (2, 40), (3, 24)):
        table = pool.allocator.allocate(-(-length // 4))
        caches.append((sid, SequenceKV(pool, table, length)))
    monitor = _FakeMonitor(10**6)
    manager = TokenCacheManager(SlidingWindowPolicy(window_size=1000, protected_prefix=2), monitor, 1000)
    assert not manager.maybe_evict(caches).evicted  # enough memory: nothing happens
    monitor.available = 100
    # under the threshold: the longest goes first; the monitor still says "short", so all go
    result = manager.maybe_evict(caches)
    assert result.sequences == [2, 3, 1] and result.tokens_removed == 20 + 12 + 6
    # not again until they grew back to the length they were compressed from
    assert not manager.maybe_evict(caches).evicted
    monitor.available = 10**6
    assert not manager.maybe_evict(caches).evicted
    assert manager.stats.tokens_evicted == {"sliding": 38}
    assert NoEvictionPolicy().evict(caches[0][1], 1) == 0


def test_policy_names_and_params() -> None:
    for name in ("none", "sliding", "snapkv", "h2o", "tova"):
        assert make_token_policy(name).name() == name
    with pytest.raises(ValueError, match="sliding, snapkv"):
        make_token_policy("lru")
    with pytest.raises(ValueError, match="observation_window"):
        make_token_policy("snapkv", observation_window=0)
    with pytest.raises(ValueError, match="ratio"):
        KVCompression("snapkv", 1.0)
    with pytest.raises(ValueError, match="policy"):
        KVCompression("none", 0.5)
    assert kept_for_ratio(3804, 0.5) == 1902 and kept_for_ratio(3, 0.9) == 1


def test_config_keys() -> None:
    config = resolve_config(
        {"token_eviction": "TOVA", "eviction_window": 64, "memory_threshold": 0}, environ={}
    )
    assert (config.token_eviction, config.eviction_window, config.memory_threshold) == ("tova", 64, 0)
    assert EngineConfig().token_eviction == "none"
    with pytest.raises(ConfigError, match="none, sliding, snapkv, h2o, tova"):
        resolve_config({"token_eviction": "lru"}, environ={})


# ---- the engine (sage-tiny) -------------------------------------------------------------------

PROMPTS = ["the quick brown fox jumps over the lazy dog", "a completely different prompt about cats!!"]


def _engine(**overrides: Any) -> Engine:
    values: dict[str, Any] = {
        "model": "sage-tiny",
        "device": "cpu",
        "block_size": 4,
        "num_blocks": 30,
        "name": "test",
        "socket": "/tmp/sage-test-unused.sock",
        "memory_threshold": 0,
        "eviction_window": 16,
    }
    values.update(overrides)
    engine = Engine(EngineConfig(**values))
    engine.start()
    return engine


def _greedy_by_recompute(prompt_ids: list[int], n: int) -> list[int]:
    """The oracle: every token from a fresh full forward of the whole sequence (no cache reuse)."""
    decoder, _tok, _cfg = load_model("sage-tiny", device="cpu")
    ids = list(prompt_ids)
    out = []
    for _ in range(n):
        pool = decoder.make_pool(num_blocks=-(-len(ids) // 4), block_size=4)
        table = pool.allocator.allocate(pool.num_blocks)
        token = int(decoder(ForwardBatch([ids], [0], [table]), pool).logits[0].argmax())
        out.append(token)
        ids.append(token)
    return out


@pytest.mark.slow  # an engine thread and a few hundred steps: seconds
def test_none_changes_nothing_and_a_token_policy_avoids_preemption() -> None:
    """Two generations that do not fit the pool together: with `none` one is preempted and
    recomputed (greedy tokens equal the oracle's); with a token policy neither is preempted,
    both complete, and the compressions are in the stats and the log."""
    engine = _engine(token_eviction="none")
    try:
        outs = [engine.submit(p, SamplingParams(max_tokens=40, ignore_eos=True)) for p in PROMPTS]
        tokens = [h.result(60).token_ids for h in outs]
        assert engine.eviction_stats().preemptions >= 1
        assert engine.token_eviction()["compressions"] == 0
        ids = engine.tokenizer.encode(PROMPTS[0])
    finally:
        engine.shutdown()
    assert tokens[0] == _greedy_by_recompute(ids, 40)
    for name in ("sliding", "tova", "h2o"):
        engine = _engine(token_eviction=name)
        try:
            outs = [engine.submit(p, SamplingParams(max_tokens=40, ignore_eos=True)) for p in PROMPTS]
            results = [h.result(60) for h in outs]
            assert [r.finish_reason for r in results] == ["length", "length"]
            assert engine.eviction_stats().preemptions == 0, name
            stats = engine.token_eviction()
            assert stats["tokens_evicted"][name] > 0 and stats["by_reason"] == {
                "preempt": stats["compressions"]
            }
            events = [e for e in engine.eviction_events(1000) if e["event"] == "compress"]
            assert len(events) == stats["compressions"]
            assert all(e["tokens_after"] < e["tokens_before"] and e["blocks_freed"] > 0 for e in events)
            engine.cache.check_invariants()
        finally:
            engine.shutdown()


@pytest.mark.slow  # an engine thread and a few hundred steps: seconds
def test_a_sequence_longer_than_the_pool_completes_under_a_token_policy() -> None:
    engine = _engine(token_eviction="sliding", num_blocks=10, eviction_window=8)
    try:
        result = engine.submit("a single long one", SamplingParams(max_tokens=100, ignore_eos=True)).result(
            60
        )
        assert (result.finish_reason, result.completion_tokens) == ("length", 100)
    finally:
        engine.shutdown()
    engine = _engine(token_eviction="none", num_blocks=10)
    try:
        with pytest.raises(RequestError, match="exceeds the KV pool"):
            engine.submit("a single long one", SamplingParams(max_tokens=100))
    finally:
        engine.shutdown()


@pytest.mark.slow  # an engine thread and a few hundred steps: seconds
def test_request_kv_compression_halves_the_prompt_blocks() -> None:
    """kv_compression at ratio 0.5 keeps half the prompt's tokens, measured in the pool's blocks;
    an identical request afterwards (no compression) hits only the uncompressed prefix and gets
    the uncompressed answer."""
    prompt = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUV"  # 64 tokens with bos
    engine = _engine(num_blocks=256)
    try:
        plain = engine.submit(prompt, SamplingParams(max_tokens=8, ignore_eos=True)).result(60)
        squeezed = engine.submit(
            prompt, SamplingParams(max_tokens=8, ignore_eos=True), kv_compression=KVCompression("snapkv", 0.5)
        ).result(60)
        again = engine.submit(prompt, SamplingParams(max_tokens=8, ignore_eos=True)).result(60)
        [event] = [e for e in engine.eviction_events(1000) if e["event"] == "compress"]
        assert event["reason"] == "prefill" and event["policy"] == "snapkv"
        n = plain.prompt_tokens
        assert (event["tokens_before"], event["tokens_after"]) == (n, kept_for_ratio(n, 0.5))
        assert event["blocks_freed"] == -(-n // 4) - -(-kept_for_ratio(n, 0.5) // 4)
        assert squeezed.finish_reason == "length" and squeezed.completion_tokens == 8
        assert squeezed.cached_tokens == 0  # the whole prompt is computed, to be scored
        assert again.token_ids == plain.token_ids and again.cached_tokens > 0
        engine.cache.check_invariants()
    finally:
        engine.shutdown()


def test_memory_pressure_compresses_after_each_step() -> None:
    """A threshold above anything available: every decoding sequence is compressed once, and
    again only once it grew back to the length it was compressed from."""
    engine = _engine(token_eviction="sliding", num_blocks=256, memory_threshold=10**6, eviction_window=8)
    try:
        result = engine.submit(PROMPTS[0], SamplingParams(max_tokens=30, ignore_eos=True)).result(60)
        assert result.finish_reason == "length"
        events = [e for e in engine.eviction_events(1000) if e["event"] == "compress"]
        assert events and {e["reason"] for e in events} == {"pressure"}
        befores = [e["tokens_before"] for e in events]
        assert all(b2 >= a2["tokens_before"] for a2, b2 in zip(events, befores[1:], strict=False))
    finally:
        engine.shutdown()


def test_generate_compressed_halves_blocks_on_sage_tiny() -> None:
    decoder, tokenizer, _cfg = load_model("sage-tiny", device="cpu")
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    ids = tokenizer.encode("x" * 63)
    for name in ("sliding", "snapkv", "h2o", "tova"):
        policy = make_token_policy(name, **({"observation_window": 8} if name == "snapkv" else {}))
        out = generate_compressed(decoder, pool, ids, policy, 0.5, max_new_tokens=4)
        assert (out.blocks_before, out.blocks_after) == (16, 8)
        assert pool.allocator.num_free == 64


# ---- the CLI against a live engine (real processes) --------------------------------------------


@pytest.mark.slow  # an engine process
def test_cli_token_eviction_session(tmp_path: Any) -> None:
    """`engine start --token-eviction sliding` on a pool too small for two generations, then
    `set-token-policy`, `stats` (tokens evicted, memory freed) and `logs` (compress events)."""
    import os
    import subprocess
    import sys
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import httpx

    repo = Path(__file__).resolve().parent.parent
    home = Path(tempfile.mkdtemp(prefix="sage-tok-", dir="/tmp"))
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(repo)}
    env.pop("SAGE_SOCKET", None)

    def sage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sage_cli.app", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    started = sage(
        "llm", "engine", "start", "sage-tiny", "--detach", "--name", "tok", "--num-blocks", "30",
        "--block-size", "4", "--device", "cpu", "--token-eviction", "sliding", "--eviction-window", "16",
        "--memory-threshold", "0",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        transport = httpx.HTTPTransport(uds=str(home / "run" / "tok.sock"))
        with httpx.Client(transport=transport, base_url="http://sage", timeout=120) as http:

            def complete(prompt: str) -> int:
                body = {"prompt": prompt, "max_tokens": 40, "ignore_eos": True}
                return http.post("/v1/completions", json=body).status_code

            with ThreadPoolExecutor(2) as pool:  # together they do not fit the pool
                assert list(pool.map(complete, PROMPTS)) == [200, 200]
        stats = sage("llm", "eviction", "stats", "--name", "tok")
        assert stats.returncode == 0, stats.stderr
        assert "Token Eviction:" in stats.stdout and "Policy: sliding" in stats.stdout
        assert "Tokens By Policy: sliding=" in stats.stdout
        swapped = sage("llm", "eviction", "set-token-policy", "tova", "--name", "tok")
        assert swapped.returncode == 0 and "sliding -> tova" in swapped.stdout
        bad = sage("llm", "eviction", "set-token-policy", "lru", "--name", "tok")
        assert bad.returncode != 0 and "tova" in bad.stderr and "Traceback" not in bad.stderr
        logs = sage("llm", "eviction", "logs", "--name", "tok", "--tail", "1000")
        assert "COMPRESSION: Sequence" in logs.stdout
    finally:
        sage("llm", "engine", "stop", "--name", "tok")
