"""Differential tests: the paged decoder against Hugging Face transformers on random tiny models.

Each case builds a random Llama or Qwen2 model in transformers, saves it with `save_pretrained`
next to a word-level `tokenizer.json`, loads the folder with `load_model`, and compares logits:
a batch of prompts prefilled together, then greedy decode steps through the pool, then a
chunked prefill. transformers recomputes the whole sequence without a cache each time, so it is
an independent reference for the pool's writes, the block tables and the causal mask.

Tolerance: float32 throughout; the two differ only in the order of floating-point sums
(batched and padded attention, other matmul shapes), about 1e-6 on logits of order 1, so
``atol=rtol=1e-4`` leaves a wide margin while any real error (a wrong position, a missing bias,
a wrong mask) moves logits by far more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from lazy_extras import lazy

transformers = lazy("transformers")

from engine_adapter.model import ForwardBatch, HFTokenizer, load_model  # noqa: E402
from engine_adapter.model.decoder import Decoder  # noqa: E402
from engine_adapter.model.kv_pool import PagedKVPool  # noqa: E402

pytestmark = pytest.mark.slow  # model parity against transformers: seconds per case

ATOL = RTOL = 1e-4
BLOCK_SIZE = 4
WORDS = [f"w{i}" for i in range(90)]
PROMPTS = [
    "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11",
    "w42",
    "w7 w7 w7 w3 w80 w81",
    "w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19",
]

SMALL = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"rope_theta": 10000.0}),
    "llama-bias-llama3-rope-sharded": (
        "llama",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
}


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def _randomize(model: torch.nn.Module) -> None:
    """Every parameter random, biases and norm weights included (transformers zeroes/ones them)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.2 * noise)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5 if param.dim() == 2 else noise)


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Decoder, HFTokenizer]:
    architecture, extra = CASES[request.param]
    config_class = transformers.LlamaConfig if architecture == "llama" else transformers.Qwen2Config
    config = config_class(**SMALL, **extra)
    torch.manual_seed(0)
    reference = (transformers.LlamaForCausalLM if architecture == "llama" else transformers.Qwen2ForCausalLM)(
        config
    ).eval()
    _randomize(reference)
    folder = tmp_path_factory.mktemp(request.param)
    shard = "40KB" if "sharded" in request.param else "2GB"
    reference.save_pretrained(folder, max_shard_size=shard)
    if "sharded" in request.param:
        assert (folder / "model.safetensors.index.json").is_file()
    _write_tokenizer(folder)
    decoder, tokenizer, model_config = load_model(str(folder), device="cpu")
    assert model_config.architecture == architecture
    assert isinstance(tokenizer, HFTokenizer)
    return reference, decoder, tokenizer


def _reference_logits(reference: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.tensor([ids])).logits[0].float()


def _scattered_tables(pool: PagedKVPool, lengths: list[int]) -> list[list[int]]:
    """Block tables whose blocks are interleaved across sequences and out of order."""
    needed = [-(-n // BLOCK_SIZE) for n in lengths]
    free = pool.allocator.allocate(sum(needed))[::-1]
    tables: list[list[int]] = [[] for _ in lengths]
    while free:
        for table, n in zip(tables, needed, strict=True):
            if len(table) < n:
                table.append(free.pop())
    return tables


def test_batched_prefill_and_decode_match_transformers(hf_case: tuple[Any, Decoder, HFTokenizer]) -> None:
    reference, decoder, tokenizer = hf_case
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    steps = 6
    pool = decoder.make_pool(num_blocks=64, block_size=BLOCK_SIZE)
    tables = _scattered_tables(pool, [len(p) + steps for p in prompts])

    out = decoder(ForwardBatch(prompts, [0] * len(prompts), tables, return_all_logits=True), pool)
    assert out.all_logits is not None
    for ids, logits in zip(prompts, out.all_logits, strict=True):
        torch.testing.assert_close(logits, _reference_logits(reference, ids), atol=ATOL, rtol=RTOL)

    sequences = [list(p) for p in prompts]
    last = out.logits
    for _ in range(steps):
        new = [int(row.argmax()) for row in last]
        starts = [len(s) for s in sequences]
        for seq, token in zip(sequences, new, strict=True):
            seq.append(token)
        last = decoder(ForwardBatch([[t] for t in new], starts, tables), pool).logits
        for seq, row in zip(sequences, last, strict=True):
            torch.testing.assert_close(row, _reference_logits(reference, seq)[-1], atol=ATOL, rtol=RTOL)


def test_chunked_prefill_matches_single_prefill(hf_case: tuple[Any, Decoder, HFTokenizer]) -> None:
    reference, decoder, tokenizer = hf_case
    ids = tokenizer.encode(PROMPTS[3])
    expected = _reference_logits(reference, ids)

    single_pool = decoder.make_pool(num_blocks=16, block_size=BLOCK_SIZE)
    single = decoder(
        ForwardBatch([ids], [0], [_scattered_tables(single_pool, [len(ids)])[0]], return_all_logits=True),
        single_pool,
    )
    assert single.all_logits is not None

    pool = decoder.make_pool(num_blocks=16, block_size=BLOCK_SIZE)
    table = _scattered_tables(pool, [len(ids)])[0]
    chunks = [(0, 3), (3, 4), (4, 11), (11, len(ids))]  # chunk edges inside and on block edges
    pieces = []
    for start, end in chunks:
        chunk = decoder(ForwardBatch([ids[start:end]], [start], [table], return_all_logits=True), pool)
        assert chunk.all_logits is not None
        pieces.append(chunk.all_logits[0])
    chunked = torch.cat(pieces)

    torch.testing.assert_close(chunked, single.all_logits[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(chunked, expected, atol=ATOL, rtol=RTOL)


def test_tokenizer_matches_the_saved_files(hf_case: tuple[Any, Decoder, HFTokenizer]) -> None:
    _, _, tokenizer = hf_case
    ids = tokenizer.encode("w1 w2 w89")
    assert ids == [4, 5, 92]
    assert tokenizer.decode(ids) == "w1 w2 w89"
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_id == 2
