"""Differential tests of the newer presses against NVIDIA kvpress 0.5.5 (the reference).

The same pattern as tests/test_token_eviction_kvpress.py: one random tiny Llama/Qwen2 model in
transformers and in sage (`save_pretrained`, `load_model`), the same prompt, kvpress's kept
indices read back from its compressed cache (each kept key is bitwise one row of the
uncompressed cache) and ours from the policy. kvpress's AdaKV only masks: its kept indices are
the complement of the ``masked_key_indices`` it leaves on each attention module.

`leverage` and `compactor` draw a Gaussian sketch: kvpress from torch's global generator, ours
from a generator seeded with the policy's `seed`; seeding the global one alike before kvpress's
prefill makes the draws the same. Their prompt has no repeated token: in layer 0 a repeated
token has the same pre-RoPE key, so its scores tie exactly and top-k breaks the tie by rounding
(ours undoes the rotation of the pool's keys; kvpress projects the hidden state again).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lazy_extras import lazy

transformers = lazy("transformers")
kvpress = lazy("kvpress")

from test_model_hf_parity import SMALL, _randomize, _write_tokenizer  # noqa: E402

from engine_adapter.model import load_model  # noqa: E402
from engine_adapter.model.decoder import Decoder  # noqa: E402
from engine_adapter.token_eviction.generate import generate_compressed, prefill  # noqa: E402
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio  # noqa: E402
from engine_adapter.token_eviction.registry import token_policy_from_spec  # noqa: E402

# The whole file is left to the full run: it needs transformers and kvpress (about 5 s of import
# on 2 cores) and builds random tiny models per fixture; the quick loop stays under a minute.
pytestmark = pytest.mark.slow

PROMPT_LEN = 120
RATIOS = [0.25, 0.5, 0.75, 0.9]


def _press(spec: str, ratio: float) -> Any:
    """kvpress's press for one of our specs (same params)."""
    return {
        "knorm": lambda: kvpress.KnormPress(ratio),
        "keydiff": lambda: kvpress.KeyDiffPress(ratio),
        "leverage": lambda: kvpress.LeverageScorePress(ratio),
        "compactor:chunk_size=32": lambda: kvpress.CompactorPress(ratio, chunk_size=32),
        "expected_attention:n_future_positions=64": lambda: kvpress.ExpectedAttentionPress(
            ratio, n_future_positions=64
        ),
        "adakv:snapkv,observation_window=16": lambda: kvpress.AdaKVPress(
            kvpress.SnapKVPress(ratio, window_size=16)
        ),
        "adakv:expected_attention": lambda: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(ratio)),
        "adakv:knorm,alpha_safeguard=0.5": lambda: kvpress.AdaKVPress(
            kvpress.KnormPress(ratio), alpha_safeguard=0.5
        ),
        "pyramid:snapkv,window_size=16,observation_window=16": lambda: kvpress.PyramidKVPress(
            ratio, window_size=16
        ),
    }[spec]()


SPECS = [
    "knorm",
    "keydiff",
    "leverage",
    "compactor:chunk_size=32",
    "expected_attention:n_future_positions=64",
    "adakv:snapkv,observation_window=16",
    "adakv:expected_attention",
    "adakv:knorm,alpha_safeguard=0.5",
    "pyramid:snapkv,window_size=16,observation_window=16",
]


def tiny_pair(
    kind: str, folder: Path, write_tokenizer: Callable[[Path], None] = _write_tokenizer
) -> tuple[Any, Decoder]:
    """A random tiny `kind` ("llama", "qwen2") model in transformers (SDPA attention: AdaKV
    refuses eager), saved in `folder` with a tokenizer, and ours loaded from it."""
    config_class = transformers.LlamaConfig if kind == "llama" else transformers.Qwen2Config
    # A vocabulary wider than the prompt: `_prompt` repeats no token.
    config = config_class(**{**SMALL, "vocab_size": 256}, rope_theta=10000.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model_class = transformers.LlamaForCausalLM if kind == "llama" else transformers.Qwen2ForCausalLM
    reference = model_class(config).eval()
    _randomize(reference)
    reference.save_pretrained(folder)
    write_tokenizer(folder)
    reference.config.name_or_path = str(folder)  # where kvpress's KVzip reads its tokenizer
    decoder, _tokenizer, _config = load_model(str(folder), device="cpu")
    return reference, decoder


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Decoder]:
    return tiny_pair(request.param, tmp_path_factory.mktemp(request.param))


def _prompt(seed: int) -> list[int]:
    """PROMPT_LEN distinct ids (no exact ties in layer 0 for the pre-RoPE presses)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(250, generator=g) + 3).tolist()[:PROMPT_LEN]


def _prefill_cache(reference: Any, ids: list[int], press: Any | None, seed: int = 0) -> Any:
    cache = transformers.DynamicCache(config=reference.config)
    torch.manual_seed(seed)
    with torch.no_grad():
        if press is None:
            reference(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        else:
            with press(reference):
                reference(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def _kvpress_kept(reference: Any, ids: list[int], press: Any) -> list[list[torch.Tensor]]:
    """kvpress's kept cache indices per layer and KV head, ascending."""
    full = [layer.keys[0] for layer in _prefill_cache(reference, ids, None).layers]
    cache = _prefill_cache(reference, ids, press)
    out = []
    for layer, (f, entry) in enumerate(zip(full, cache.layers, strict=True)):
        masked = getattr(reference.model.layers[layer].self_attn, "masked_key_indices", None)
        if isinstance(press, kvpress.AdaKVPress):
            assert masked is not None
            kept = torch.ones(f.shape[:2], dtype=torch.bool)
            kept[masked[1], masked[2]] = False
            out.append([kept[h].nonzero().squeeze(1) for h in range(f.shape[0])])
            continue
        k = entry.keys[0]
        same = (k[:, :, None, :] == f[:, None, :, :]).all(-1)  # [kv_heads, n, L]
        assert torch.all(same.sum(-1) == 1), "a kept key is not exactly one row of the full cache"
        rows = same.float().argmax(-1).sort(-1).values
        out.append(list(rows))
    for module in reference.model.layers:
        module.self_attn.masked_key_indices = None
    return out


def _ours(
    policy: TokenEvictionPolicy, decoder: Decoder, ids: list[int], ratio: float
) -> list[list[torch.Tensor]]:
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    policy.ratio = ratio  # what `evict(..., ratio=)` sets for one compression
    keep, counts = policy.select(kv, kept_for_ratio(len(ids), ratio))
    if counts is None:
        counts = torch.full(keep.shape[:2], keep.shape[-1])
    return [[keep[la, h, : counts[la, h]] for h in range(keep.shape[1])] for la in range(keep.shape[0])]


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("spec", SPECS)
def test_kept_indices_equal_kvpress(tiny: tuple[Any, Decoder], spec: str, ratio: float) -> None:
    reference, decoder = tiny
    ids = _prompt(7)
    expected = _kvpress_kept(reference, ids, _press(spec, ratio))
    ours = _ours(token_policy_from_spec(spec), decoder, ids, ratio)
    for layer, (want, got) in enumerate(zip(expected, ours, strict=True)):
        for head, (w, g) in enumerate(zip(want, got, strict=True)):
            assert torch.equal(w, g), f"{spec} at {ratio}: layer {layer} head {head} keeps other tokens"


@pytest.mark.parametrize(
    "spec",
    [
        "adakv:snapkv,observation_window=16",
        "pyramid:snapkv,window_size=16,observation_window=16",
    ],
)
def test_compacted_pool_holds_kvpress_cache(tiny: tuple[Any, Decoder], spec: str) -> None:
    """After a head-varying compaction each head's real keys and values are kvpress's kept ones
    (within 1e-5), the padding is masked, and the pool holds ceil(max kept / block) blocks."""
    reference, decoder = tiny
    ids = _prompt(3)
    # At 0.5 the pyramid fits (at 0.75 of 120 tokens with a window of 16 it falls back to one budget).
    press, policy = _press(spec, 0.5), token_policy_from_spec(spec)
    expected = _kvpress_kept(reference, ids, press)
    full = _prefill_cache(reference, ids, None)
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    policy.evict(kv, kept_for_ratio(len(ids), 0.5), ratio=0.5)
    widest = max(len(h) for layer in expected for h in layer)
    assert kv.length == widest and kv.num_blocks() == -(-widest // 4)
    assert pool.allocator.num_free == 64 - kv.num_blocks()
    assert kv.key_mask is not None
    for layer, heads in enumerate(expected):
        keys, values = kv.keys(layer), kv.values(layer)
        for h, want in enumerate(heads):
            n = len(want)
            assert kv.key_mask[layer, h].sum() == n and bool(kv.key_mask[layer, h, :n].all())
            ref = full.layers[layer]
            torch.testing.assert_close(keys[h, :n], ref.keys[0, h, want], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(values[h, :n], ref.values[0, h, want], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "spec",
    [
        "adakv:snapkv,observation_window=16",
        "pyramid:snapkv,window_size=16,observation_window=16",
        "compactor:chunk_size=32",
        "expected_attention",
    ],
)
def test_greedy_tokens_equal_kvpress(tiny: tuple[Any, Decoder], spec: str) -> None:
    """Prefill compressed then 12 greedy tokens: over padded head-varying caches the masked
    attention decodes what kvpress decodes (its masked or shrunk cache). Pyramid at 0.5, where
    its layers' budgets differ (at 0.75 of 120 tokens with a window of 16 it falls back to one)."""
    reference, decoder = tiny
    ids = _prompt(11)
    ratio = 0.5 if spec.startswith("pyramid") else 0.75
    press = _press(spec, ratio) if spec != "expected_attention" else kvpress.ExpectedAttentionPress(ratio)
    torch.manual_seed(0)
    with torch.no_grad(), press(reference):
        expected = reference.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0, len(ids) :].tolist()
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    ours = generate_compressed(decoder, pool, ids, token_policy_from_spec(spec), ratio, max_new_tokens=12)
    assert ours.token_ids == expected
