"""Differential tests: our token-level policies against NVIDIA kvpress 0.5.5 (the reference).

kvpress compresses a transformers model's cache during prefill; we compress our decoder's paged
pool after the same prefill. Both run the same random tiny Llama/Qwen2 model (saved with
`save_pretrained`, loaded by `load_model`) on the same prompt. kvpress's kept indices are read
back from its compressed cache: each kept key row is bitwise one row of the uncompressed cache
of the same run (nearest row). Ours are the policy's `keep_indices` from the queries and keys
our decoder's `AttentionObserver` and pool hold. They must be the same set per layer and KV head.

The slow test at the end runs the real SmolLM2 in both and compares greedy answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lazy_extras import lazy

transformers = lazy("transformers")
kvpress = lazy("kvpress")

from model_fixtures import (  # noqa: E402
    needs_smollm2,
    one_thread_fixture,
    reference_fixture,
    reference_tokenizer_fixture,
    smollm2_fixture,
)
from test_model_hf_parity import SMALL, _randomize, _write_tokenizer  # noqa: E402

from engine_adapter.model import load_model  # noqa: E402
from engine_adapter.model.decoder import Decoder  # noqa: E402
from engine_adapter.token_eviction.generate import append_tokens, generate_compressed, prefill  # noqa: E402
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio  # noqa: E402
from engine_adapter.token_eviction.presses.h2o import H2OPolicy  # noqa: E402
from engine_adapter.token_eviction.presses.sliding import SlidingWindowPolicy  # noqa: E402
from engine_adapter.token_eviction.presses.snapkv import SnapKVPolicy  # noqa: E402
from engine_adapter.token_eviction.presses.tova import TOVAPolicy  # noqa: E402
from engine_adapter.token_eviction.registry import make_token_policy  # noqa: E402

__all__ = ["one_thread_fixture", "reference_fixture", "reference_tokenizer_fixture", "smollm2_fixture"]

# The whole file is left to the full run: it needs transformers and kvpress (about 5 s of import
# on 2 cores) and builds random tiny models per fixture; the quick loop stays under a minute.
pytestmark = pytest.mark.slow

PROMPT_LEN = 120
# Ratio 0.5 in the quick loop; the others (seconds each, with the model fixtures) in the full run.
RATIOS = [0.25, 0.5, 0.75, 0.9]


def _pairs(ratio: float) -> list[tuple[Any, TokenEvictionPolicy]]:
    return [
        (kvpress.SnapKVPress(compression_ratio=ratio, window_size=16), SnapKVPolicy(observation_window=16)),
        (kvpress.StreamingLLMPress(compression_ratio=ratio), SlidingWindowPolicy(window_size=10_000)),
        (kvpress.TOVAPress(compression_ratio=ratio), TOVAPolicy()),
        # kvpress's H2O (ObservedAttentionPress) has no recent window: ours with none is the same.
        (kvpress.ObservedAttentionPress(compression_ratio=ratio), H2OPolicy(recent_window=0)),
    ]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Decoder]:
    """A random tiny model in transformers (eager attention: H2O needs the weights) and ours."""
    config_class = transformers.LlamaConfig if request.param == "llama" else transformers.Qwen2Config
    config = config_class(**SMALL, rope_theta=10000.0, attn_implementation="eager")
    torch.manual_seed(0)
    model_class = transformers.LlamaForCausalLM if request.param == "llama" else transformers.Qwen2ForCausalLM
    reference = model_class(config).eval()
    _randomize(reference)
    folder: Path = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(folder)
    _write_tokenizer(folder)
    decoder, _tokenizer, _config = load_model(str(folder), device="cpu")
    return reference, decoder


def _reference_keys(reference: Any, ids: list[int], press: Any | None) -> list[torch.Tensor]:
    cache = transformers.DynamicCache(config=reference.config)
    with torch.no_grad():
        if press is None:
            reference(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        else:
            with press(reference):
                reference(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return [layer.keys[0] for layer in cache.layers]  # [kv_heads, n, D] per layer


def _kvpress_kept(reference: Any, ids: list[int], press: Any) -> torch.Tensor:
    """kvpress's kept cache indices ``[layers, kv_heads, n]``, ascending."""
    full = _reference_keys(reference, ids, None)
    kept = _reference_keys(reference, ids, press)
    rows = []
    for f, k in zip(full, kept, strict=True):
        same = (k[:, :, None, :] == f[:, None, :, :]).all(-1)  # [kv_heads, n, L]
        assert torch.all(same.sum(-1) == 1), "a kept key is not exactly one row of the full cache"
        rows.append(same.float().argmax(-1).sort(-1).values)
    return torch.stack(rows)


@pytest.mark.parametrize("ratio", RATIOS)
def test_kept_indices_equal_kvpress(tiny: tuple[Any, Decoder], ratio: float) -> None:
    reference, decoder = tiny
    ids = torch.randint(3, 90, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    n_keep = kept_for_ratio(len(ids), ratio)
    for press, policy in _pairs(ratio):
        expected = _kvpress_kept(reference, ids, press)
        pool = decoder.make_pool(num_blocks=64, block_size=4)
        kv, _logits = prefill(decoder, pool, ids, policy)
        ours = policy.keep_indices(kv, n_keep)
        assert ours.shape == expected.shape == (decoder.config.num_hidden_layers, 2, n_keep)
        assert torch.equal(ours, expected), (
            f"{policy.name()} at ratio {ratio} keeps other tokens than kvpress"
        )


def test_compacted_pool_holds_the_kept_keys(tiny: tuple[Any, Decoder]) -> None:
    """After `evict`, the pool holds exactly kvpress's kept keys per layer and head (same order:
    ascending position) in ceil(n / block_size) blocks, and the rest of the pool is free."""
    reference, decoder = tiny
    ids = torch.randint(3, 90, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3)).tolist()
    press, policy = _pairs(0.5)[0]
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    n_keep = kept_for_ratio(len(ids), 0.5)
    expected = _kvpress_kept(reference, ids, press)
    full = _reference_keys(reference, ids, None)
    assert policy.evict(kv, n_keep) == len(ids) - n_keep
    assert kv.num_blocks() == len(kv.block_table) == -(-n_keep // 4)
    assert pool.allocator.num_free == 64 - len(kv.block_table)
    for layer, f in enumerate(full):
        want = f.gather(1, expected[layer][..., None].expand(-1, -1, f.shape[-1]))
        torch.testing.assert_close(kv.keys(layer), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["snapkv", "sliding", "tova", "h2o"])
def test_greedy_tokens_equal_kvpress_on_tiny_models(tiny: tuple[Any, Decoder], name: str) -> None:
    """Prefill compressed at 0.5 then 16 greedy tokens: new tokens continue the original
    positions over per-head kept sets, as in transformers + kvpress."""
    reference, decoder = tiny
    ids = torch.randint(3, 90, (PROMPT_LEN,), generator=torch.Generator().manual_seed(11)).tolist()
    press, policy = {p.name(): (k, p) for k, p in _pairs(0.5)}[name]
    with torch.no_grad(), press(reference):
        expected = reference.generate(
            torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0, len(ids) :].tolist()
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    ours = generate_compressed(decoder, pool, ids, policy, 0.5, max_new_tokens=16)
    assert ours.token_ids == expected


def test_decode_after_compaction_equals_masked_attention(tiny: tuple[Any, Decoder]) -> None:
    """An oracle without kvpress: after keeping sinks + recent tokens, the next tokens' logits
    equal transformers' on the full cache with the evicted keys masked out (2-D attention mask)
    and the original position ids."""
    reference, decoder = tiny
    ids = torch.randint(3, 90, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    policy = SlidingWindowPolicy(window_size=20, protected_prefix=4)
    pool = decoder.make_pool(num_blocks=32, block_size=4)
    kv, logits = prefill(decoder, pool, ids, policy)
    policy.evict(kv, 24)
    kept = torch.zeros(len(ids), dtype=torch.long)
    kept[:4] = 1
    kept[-20:] = 1
    cache = transformers.DynamicCache(config=reference.config)
    with torch.no_grad():
        out = reference(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    token = int(logits.argmax())
    assert token == int(out.logits[0, -1].argmax())
    mask = kept.tolist()
    for _ in range(4):
        mask.append(1)
        position = len(mask) - 1
        with torch.no_grad():
            out = reference(
                torch.tensor([[token]]),
                past_key_values=cache,
                attention_mask=torch.tensor([mask]),
                position_ids=torch.tensor([[position]]),
                cache_position=torch.tensor([position]),
                use_cache=True,
            )
        ours = append_tokens(decoder, pool, kv, [token])
        torch.testing.assert_close(ours, out.logits[0, -1].float(), atol=1e-4, rtol=1e-4)
        token = int(ours.argmax())


# ---- the real model: greedy answers under compression ----------------------------------------

SMOLLM2_PROMPTS = [
    "The secret code of the blue door is 48213. The weather was mild and the river ran quietly "
    "past the old mill, where children played among the reeds until the evening bells rang. "
    "Question: what is the secret code of the blue door? Answer:",
    "Alice has three apples and Bob has five pears. They walk to the market on a sunny morning, "
    "talk about the harvest, and buy bread from a baker who sings. How many pears does Bob have? "
    "Answer:",
]


@needs_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("name", ["snapkv", "sliding", "tova"])
def test_greedy_answers_equal_kvpress_on_smollm2(
    smollm2: Any, reference: Any, one_thread: None, name: str
) -> None:
    """Query-aware compression at ratio 0.5: our engine's greedy tokens equal transformers +
    kvpress's press for the same prompt (prefill compressed once, then 12 greedy tokens)."""
    decoder, tokenizer, _config = smollm2
    presses = {
        "snapkv": kvpress.SnapKVPress(compression_ratio=0.5, window_size=16),
        "sliding": kvpress.StreamingLLMPress(compression_ratio=0.5),
        "tova": kvpress.TOVAPress(compression_ratio=0.5),
    }
    policy = make_token_policy(name, **({"observation_window": 16} if name == "snapkv" else {}))
    for prompt in SMOLLM2_PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad(), presses[name](reference):
            expected = reference.generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0
            )[0, len(ids) :].tolist()
        pool = decoder.make_pool(num_blocks=64, block_size=16)
        ours = generate_compressed(decoder, pool, ids, policy, 0.5, max_new_tokens=len(expected))
        assert ours.token_ids == expected, (name, prompt[:30], tokenizer.decode(ours.token_ids), expected)
        assert ours.blocks_after == -(-kept_for_ratio(len(ids), 0.5) // 16)
