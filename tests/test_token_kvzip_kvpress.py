"""`kvzip` against kvpress 0.5.5's ``KVzipPress`` (the reference), and its replay's guards.

The tiny random Llama/Qwen2 models of tests/test_token_presses_kvpress.py, saved with their
tokenizer: kvpress reads the tokenizer from the model's config path (``name_or_path``), so the
reference is pointed at the saved folder, and sage's loader gives the decoder the same
tokenizer. kvpress only masks: its kept indices are the complement of the
``masked_key_indices`` it leaves on each attention module.
"""

from __future__ import annotations

import json
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
    smollm2_fixture,
)
from test_model_hf_parity import WORDS  # noqa: E402
from test_token_presses_kvpress import tiny_pair  # noqa: E402

from engine_adapter.model.chat_template import ChatMessage, render_chat  # noqa: E402
from engine_adapter.model.decoder import Decoder  # noqa: E402
from engine_adapter.token_eviction.generate import prefill  # noqa: E402
from engine_adapter.token_eviction.presses.base import kept_for_ratio  # noqa: E402
from engine_adapter.token_eviction.presses.kvzip import KVzipPolicy  # noqa: E402
from engine_adapter.token_eviction.registry import token_policy_from_spec  # noqa: E402

__all__ = ["one_thread_fixture", "reference_fixture", "smollm2_fixture"]

# The whole file is left to the full run: it needs transformers and kvpress (about 5 s of import
# on 2 cores) and builds random tiny models per fixture; the quick loop stays under a minute.
pytestmark = pytest.mark.slow

PROMPT_LEN = 120
SENTENCES = [
    "Old harbours smell of salt, tar and the diesel of the morning ferries.",
    "A good loaf of bread needs flour, water, salt, yeast and a little patience.",
    "The library keeps its rare maps in a cool room behind a heavy oak door.",
    "Trains leave the northern station every twenty minutes until midnight.",
    "Bees visit thousands of flowers to make a single spoonful of honey.",
    "The committee postponed its decision until the spring meeting.",
    "Mountain paths are marked with red and white stripes painted on rocks.",
    "In the evening the market stalls fold their awnings and the square empties.",
    "Copper turns green when it is left out in the rain for many years.",
    "The violinist tuned her instrument twice before the concert began.",
    "Most of the town's water comes from a reservoir in the eastern hills.",
    "A lighthouse keeper once lived alone on the rock for eleven winters.",
    "Children in the village learn to swim in the river before they can read.",
    "The recipe calls for two onions, three cloves of garlic and fresh thyme.",
    "Satellites pass overhead like slow stars just after the sun has set.",
    "The museum's oldest clock still strikes the hour a minute late.",
]
# Every word of the replay's instructions and of the chat template is in the vocabulary:
# transformers' fast tokenizer and sage's would split unknown words differently.
REPLAY_WORDS = ["Repeat", "the", "previous", "context", "exactly", ".", "part", "of", "starting", "with"]
REPLAY_WORDS += ["user", ":", "assistant", "dummy", "#"]
TOKENIZER_CONFIG = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "[UNK]",
    "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written, nothing inferred
    # A prefix (not replayed) and a suffix, as a real model's template has.
    "chat_template": "{% for m in messages %}user : {{ m['content'] }} .{% endfor %}"
    "{% if add_generation_prompt %} assistant :{% endif %}",
}


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<s>", "</s>", *REPLAY_WORDS, *WORDS]
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Decoder]:
    # the presses' tiny pair, with a tokenizer that holds the replay prompt's words
    return tiny_pair(request.param, tmp_path_factory.mktemp(request.param), _write_tokenizer)


def _prompt(seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(250, generator=g) + 3).tolist()[:PROMPT_LEN]


def kvpress_kvzip_kept(reference: Any, ids: list[int], press: Any) -> tuple[list[list[torch.Tensor]], Any]:
    """kvpress's kept indices per layer and KV head (the complement of its masks), and its
    cache (which KVzip leaves whole: it only masks)."""
    cache = transformers.DynamicCache(config=reference.config)
    with torch.no_grad(), press(reference):
        reference(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    kept = []
    for layer in reference.model.layers:
        masked = layer.self_attn.masked_key_indices
        keys = cache.layers[layer.self_attn.layer_idx].keys[0]
        mask = torch.ones(keys.shape[:2], dtype=torch.bool)
        if masked is not None:
            mask[masked[1], masked[2]] = False
        kept.append([mask[h].nonzero().squeeze(1) for h in range(keys.shape[0])])
        layer.self_attn.masked_key_indices = None
    return kept, cache


@pytest.mark.parametrize(
    ("spec", "ratio", "kwargs"),
    [
        ("kvzip", 0.5, {}),
        pytest.param("kvzip", 0.75, {}, marks=pytest.mark.slow),
        pytest.param("kvzip:layerwise=true", 0.5, {"layerwise": True}, marks=pytest.mark.slow),
        # Three chunks: the later replays repeat the end of the chunk before.
        ("kvzip:chunk_size=48", 0.75, {"chunk_size": 48}),
    ],
)
def test_kvzip_equals_kvpress(
    tiny: tuple[Any, Decoder], spec: str, ratio: float, kwargs: dict[str, Any]
) -> None:
    """Kept indices per layer and head are kvpress's, and the compacted pool holds its cache's
    kept keys and values (within 1e-5), each head's padding masked."""
    reference, decoder = tiny
    ids = _prompt(5)
    expected, full = kvpress_kvzip_kept(reference, ids, kvpress.KVzipPress(ratio, **kwargs))
    policy = token_policy_from_spec(spec)
    pool = decoder.make_pool(num_blocks=128, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    free_before = pool.allocator.num_free
    policy.ratio = ratio
    keep, counts = policy.select(kv, kept_for_ratio(len(ids), ratio))
    assert pool.allocator.num_free == free_before, "the replay's borrowed blocks were not given back"
    assert counts is not None
    for layer, heads in enumerate(expected):
        for head, want in enumerate(heads):
            got = keep[layer, head, : counts[layer, head]]
            assert torch.equal(want, got), f"{spec} at {ratio}: layer {layer} head {head} keeps other tokens"
    policy.evict(kv, kept_for_ratio(len(ids), ratio), ratio=ratio)
    assert kv.key_mask is not None
    for layer, heads in enumerate(expected):
        keys, values = kv.keys(layer), kv.values(layer)
        for h, want in enumerate(heads):
            n = len(want)
            assert kv.key_mask[layer, h].sum() == n
            ref = full.layers[layer]
            torch.testing.assert_close(keys[h, :n], ref.keys[0, h, want], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(values[h, :n], ref.values[0, h, want], atol=1e-5, rtol=1e-5)


def test_kvzip_keeps_the_newest_without_token_ids(tiny: tuple[Any, Decoder]) -> None:
    """A sequence whose ids the observer lost (here: a prefill that did not track them) is not
    replayed: the press says why and keeps the sinks and the newest tokens."""
    _reference, decoder = tiny
    ids = _prompt(9)
    policy = KVzipPolicy()
    pool = decoder.make_pool(num_blocks=64, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    assert policy.attention_missing(kv) is None
    assert kv.observer is not None
    kv.observer.token_ids = None
    assert "token ids" in (policy.attention_missing(kv) or "")
    policy.ratio = 0.5
    keep, counts = policy.select(kv, 60)
    assert counts is not None and int(counts.sum()) == keep.shape[0] * keep.shape[1] * 60
    assert torch.equal(keep[0, 0, : counts[0, 0]], torch.cat([torch.arange(4), torch.arange(64, 120)]))


def _assert_same_kept(expected: list[list[torch.Tensor]], keep: torch.Tensor, counts: torch.Tensor) -> None:
    for layer, heads in enumerate(expected):
        for head, want in enumerate(heads):
            got = keep[layer, head, : counts[layer, head]]
            assert torch.equal(want, got), f"layer {layer} head {head} keeps other tokens"


@needs_smollm2
@pytest.mark.slow
def test_kvzip_equals_kvpress_on_smollm2(smollm2: Any, reference: Any, tmp_path: Path) -> None:
    """SmolLM2 from the GGUF in both, a chat-templated context with a needle: the same kept
    indices per layer and head at 0.75. kvpress is given the model's own tokenizer (saved where
    its config path points: the GGUF's tokenizer as transformers converts it garbles the
    replay's newlines); sage's replay uses the loader's."""
    decoder, tokenizer, _config = smollm2
    text = " ".join(
        [*SENTENCES[:9], "One of the special magic numbers for amber is: 4825731.", *SENTENCES[9:]]
    )
    rendered = render_chat(tokenizer.chat_template, [ChatMessage("user", text)])
    ids = tokenizer.encode(rendered[: rendered.index(text) + len(text)], add_special_tokens=False)
    tokenizer.save_folder(tmp_path)
    before = reference.config.name_or_path
    reference.config.name_or_path = str(tmp_path)
    try:
        expected, _cache = kvpress_kvzip_kept(reference, ids, kvpress.KVzipPress(0.75))
    finally:
        reference.config.name_or_path = before
    policy = KVzipPolicy()
    pool = decoder.make_pool(num_blocks=-(-len(ids) // 16) * 2 + 8, block_size=16)
    kv, _ = prefill(decoder, pool, ids, policy)
    policy.ratio = 0.75
    keep, counts = policy.select(kv, kept_for_ratio(len(ids), 0.75))
    assert counts is not None
    _assert_same_kept(expected, keep, counts)


def test_kvzip_without_room_for_the_replay_keeps_the_newest(tiny: tuple[Any, Decoder]) -> None:
    """A pool without free blocks for the replay (memory pressure): the press says so and keeps
    the sinks and the newest tokens instead of failing the step."""
    _reference, decoder = tiny
    ids = _prompt(9)
    policy = KVzipPolicy()
    pool = decoder.make_pool(num_blocks=32, block_size=4)  # the 30 blocks of the prompt, and 2
    kv, _ = prefill(decoder, pool, ids, policy)
    assert "free blocks" in (policy.attention_missing(kv) or "")
    policy.ratio = 0.5
    keep, counts = policy.select(kv, 60)
    assert counts is not None
    assert torch.equal(keep[1, 1, : counts[1, 1]], torch.cat([torch.arange(4), torch.arange(64, 120)]))


def test_token_ids_are_lost_past_a_compaction(tiny: tuple[Any, Decoder]) -> None:
    """After a compaction the next token's cache index is not the count of ids seen: the
    observer forgets them, and kvzip no longer replays (it would score the wrong tokens)."""
    from engine_adapter.token_eviction.generate import append_tokens

    _reference, decoder = tiny
    ids = _prompt(4)
    policy = KVzipPolicy()
    pool = decoder.make_pool(num_blocks=128, block_size=4)
    kv, _ = prefill(decoder, pool, ids, policy)
    append_tokens(decoder, pool, kv, [5])
    assert kv.observer is not None and kv.observer.token_ids == [*ids, 5]
    policy.evict(kv, 60, ratio=0.5)
    append_tokens(decoder, pool, kv, [6])
    assert kv.observer.token_ids is None
    assert "token ids" in (policy.attention_missing(kv) or "")
