"""`kvzip`: keep the keys the model reads when it replays the context.

Source: Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
2025; kvpress's ``KVzipPress``. After the prefill the model is asked to repeat its context
("Repeat the previous context exactly." in its chat template, then the context itself, in
chunks of `chunk_size` tokens); a key's score in a layer and KV head is the most attention any
replay query of its group pays it, the softmax taken over the attention sinks, the chunk being
replayed and the replay itself. The `n_sink` first tokens score highest. The budget is global:
the lowest scores over every layer, head and token are pruned (``layerwise``: the same count in
every layer), so each layer and head keeps its own count (`ragged_keep`; the pool frees the
blocks kvpress's masks keep). The chat template's prefix is not replayed: its tokens past the
sinks score 0. Query-agnostic, and the costliest press: the replay is one more prefill.

The replay needs what the pool does not hold: the context's token ids, the model and its
tokenizer. The sequence's `AttentionObserver` tracks them (``track_tokens``: the decoder hands
it the ids and itself, as it hands the rotary embedding; the loader gives the decoder its
tokenizer). The replay runs the decoder where the compression runs (the engine's thread), into
blocks borrowed from the pool past the sequence's own tokens and given back before returning;
the sequence's K/V and observer are untouched. Where it cannot replay (ids unknown after a
compaction or past a cached prefix the observer never saw, no tokenizer, no free block) the
press keeps the newest tokens and says why (`attention_missing`).

`replay_scores` is shared with sage's own press (`presses.skim`), which replays a sample of spans.

Imports torch, the chat template, the observer, `presses.base` and `SequenceKV`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine_adapter.model.chat_template import ChatMessage, render_chat
from engine_adapter.model.decoder import AttentionObserver, ForwardBatch
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, ragged_keep, recency_scores
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = [
    "KVzipPolicy",
    "ReplayPrompt",
    "global_prune",
    "replay_missing",
    "replay_prompt",
    "replay_scores",
]

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
NEXT_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"
PREV_POSTFIX = 8  # tokens of the chunk before that a later chunk's prompt repeats


@dataclass(frozen=True, slots=True)
class ReplayPrompt:
    """The token ids a replay is built of, from the model's tokenizer and chat template.

    Attributes:
        prefix_length: Tokens of the chat template before the user's text (not replayed).
        suffix: The template's ids between the user's text and the assistant's answer.
        first: The ids of the first chunk's instruction; `next` those of later chunks'.
    """

    prefix_length: int
    suffix: list[int]
    first: list[int]
    next: list[int]


def replay_prompt(tokenizer: Any) -> ReplayPrompt:
    """The replay's ids as kvpress builds them: a dummy user turn rendered with the generation
    prompt and split at the user's text."""

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    template = tokenizer.chat_template
    if template is None:
        prefix, suffix = "", "\n"
    else:
        dummy = "dummy context"
        separator = "\n" + "#" * len(dummy)
        text = render_chat(
            template,
            [ChatMessage("user", dummy + separator)],
            add_generation_prompt=True,
            bos_token=tokenizer.token_text(tokenizer.bos_token_id),
            eos_token=tokenizer.token_text(tokenizer.eos_token_id),
            enable_thinking=False,
        )
        context, suffix = text.split(separator)
        prefix = context.split(dummy)[0]
    return ReplayPrompt(len(encode(prefix)), encode(suffix), encode(FIRST_PROMPT), encode(NEXT_PROMPT))


def replay_missing(cache: SequenceKV, replay_tokens: int = 0) -> str | None:
    """Why the context of `cache` cannot be replayed now (None: it can); `replay_tokens`: the
    longest replay, which must fit in the pool's free blocks past the sequence's own."""
    obs = cache.observer
    if obs is None:
        return "no attention observer (the sequence started before this policy was set)"
    if obs.decoder is None or getattr(obs.decoder, "tokenizer", None) is None:
        return "the observer has no decoder with a tokenizer to replay the context with"
    ids = obs.token_ids
    if ids is None or len(ids) != cache.length or cache.position_offset or cache.key_mask is not None:
        return "the token ids of the cache are not all known (a cached prefix, or compacted before)"
    pool = cache.pool
    need = -(-(cache.length + replay_tokens) // pool.block_size) - len(cache.block_table)
    if need > pool.allocator.num_free:
        return f"the replay needs {need} free blocks and the pool has {pool.allocator.num_free}"
    return None


def _replay_layer_scores(
    queries: torch.Tensor, keys: torch.Tensor, sink: int, start: int, end: int
) -> torch.Tensor:
    """``[kv_heads, end - start]``: the most attention a replay query of each KV head's group
    pays each key of the chunk, the softmax over the sinks, the chunk and the replay.

    Args:
        queries: ``[heads, q, D]`` the replay's rotated queries.
        keys: ``[kv_heads, L + q, D]`` the sequence's keys, then the replay's.
    """
    heads, q_len, dim = queries.shape
    kv_heads = keys.shape[0]
    k = torch.cat((keys[:, :sink], keys[:, start:end], keys[:, -q_len:]), dim=1)
    q = queries.reshape(kv_heads, heads // kv_heads, q_len, dim)
    weights = torch.matmul(q, k[:, None].transpose(-2, -1)) / math.sqrt(dim)
    causal = torch.full((q_len, q_len), torch.finfo(weights.dtype).min, dtype=weights.dtype)
    weights[..., -q_len:] += causal.triu(1).to(weights.device)
    weights = torch.softmax(weights, dim=-1)[..., sink : sink + end - start]
    return weights.amax(dim=(1, 2))


def _replay_forward(cache: SequenceKV, ids: list[int]) -> tuple[AttentionObserver, SequenceKV, list[int]]:
    """Run `ids` after the sequence's tokens in borrowed blocks: the replay's observer (its
    queries), the sequence extended by the replay, and the borrowed blocks to give back."""
    pool, obs = cache.pool, cache.observer
    assert obs is not None
    need = -(-(cache.length + len(ids)) // pool.block_size) - len(cache.block_table)
    borrowed = pool.allocator.allocate(need) if need > 0 else []
    table = cache.block_table + borrowed
    replay = AttentionObserver(window=len(ids))
    try:
        batch = ForwardBatch([ids], [cache.length], [table], observers=[replay])
        with torch.no_grad():
            obs.decoder(batch, pool)
    except BaseException:
        pool.allocator.free(borrowed)
        raise
    return replay, SequenceKV(pool, table, cache.length + len(ids)), borrowed


def replay_scores(
    cache: SequenceKV,
    chunks: list[tuple[int, int, list[int]]],
    n_sink: int,
    layers: list[int] | None = None,
) -> torch.Tensor:
    """``[layers, kv_heads, L]`` replay scores (0 where no chunk covers a token).

    Args:
        chunks: ``(start, end, replay ids)``: each replay scores cache indices ``start..end-1``.
        n_sink: Sinks every chunk's softmax includes (fewer when the chunk starts before).
        layers: The layers to score (None: all); the others keep 0.
    """
    dtype = cache.pool.dtype
    scores = torch.zeros((cache.num_layers, cache.num_kv_heads, cache.length), dtype=dtype)
    for start, end, ids in chunks:
        replay, extended, borrowed = _replay_forward(cache, ids)
        try:
            for layer in range(cache.num_layers) if layers is None else layers:
                scores[layer, :, start:end] = _replay_layer_scores(
                    replay.queries[layer], extended.keys(layer), min(n_sink, start), start, end
                ).to(scores.device)
        finally:
            cache.pool.allocator.free(borrowed)
    return scores


def global_prune(scores: torch.Tensor, ratio: float, layerwise: bool) -> list[list[torch.Tensor]]:
    """Kept cache indices per layer and KV head when the lowest `ratio` of `scores` ``[layers,
    kv_heads, L]`` go: over every layer at once (kvpress's KVzip), or `layerwise` the same
    count per layer; inside a layer the heads share its count."""
    n_layers, kv_heads, length = scores.shape
    if layerwise:
        pruned_per_layer = torch.full((n_layers,), int(kv_heads * length * ratio), dtype=torch.int)
    else:
        pruned = torch.topk(-scores.reshape(-1), int(scores.numel() * ratio)).indices
        pruned_per_layer = torch.bincount(pruned // (kv_heads * length), minlength=n_layers).int()
    kept: list[list[torch.Tensor]] = []
    for layer in range(n_layers):
        drop = torch.topk(-scores[layer].reshape(-1), int(pruned_per_layer[layer])).indices
        mask = torch.ones(kv_heads * length, dtype=torch.bool)
        mask[drop] = False
        mask = mask.view(kv_heads, length)
        kept.append([mask[h].nonzero().squeeze(1) for h in range(kv_heads)])
    return kept


def context_chunks(ids: list[int], prompt: ReplayPrompt, chunk_size: int) -> list[tuple[int, int, list[int]]]:
    """KVzip's replays: the context past the template's prefix in chunks of `chunk_size`, each
    after its instruction (a later one repeats the end of the chunk before) and the suffix."""
    start, chunks = prompt.prefix_length, []
    previous: list[int] = []
    for lo in range(start, len(ids), chunk_size):
        chunk = ids[lo : lo + chunk_size]
        head = prompt.first if not previous else prompt.next + previous[-PREV_POSTFIX:]
        chunks.append((lo, lo + len(chunk), head + prompt.suffix + chunk))
        previous = chunk
    return chunks


class KVzipPolicy(TokenEvictionPolicy):
    """KVzip: the keys a replay of the context attends to, under a budget shared by all layers.

    Args:
        layerwise: The same pruned count in every layer (False: one global budget).
        n_sink: First tokens always kept (4).
        chunk_size: Context tokens per replay (2048).
    """

    track_tokens = True

    def __init__(self, layerwise: bool = False, n_sink: int = 4, chunk_size: int = 2048) -> None:
        if n_sink < 0 or chunk_size < 1:
            raise ValueError("n_sink must be >= 0 and chunk_size >= 1")
        self.layerwise, self.n_sink, self.chunk_size = layerwise, n_sink, chunk_size
        self._prompts: dict[int, ReplayPrompt] = {}  # id(tokenizer) -> its replay ids

    def name(self) -> str:
        return "kvzip"

    def min_length(self) -> int:
        return self.n_sink + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(min(self.n_sink, length)))

    def attention_missing(self, cache: SequenceKV) -> str | None:
        missing = replay_missing(cache)
        if missing is not None:
            return missing
        return replay_missing(cache, max(len(ids) for _s, _e, ids in self.replay_chunks(cache)))

    def prompt_for(self, tokenizer: Any) -> ReplayPrompt:
        """The replay ids of `tokenizer`, built once per tokenizer."""
        prompt = self._prompts.get(id(tokenizer))
        if prompt is None:
            prompt = self._prompts[id(tokenizer)] = replay_prompt(tokenizer)
        return prompt

    def replay_chunks(self, cache: SequenceKV) -> list[tuple[int, int, list[int]]]:
        """The replays that score `cache` (`replay_missing` is None)."""
        obs = cache.observer
        assert obs is not None and obs.token_ids is not None
        return context_chunks(obs.token_ids, self.prompt_for(obs.decoder.tokenizer), self.chunk_size)

    def all_scores(self, cache: SequenceKV) -> torch.Tensor:
        """``[layers, kv_heads, L]``: the replay's scores (recency when it cannot replay), the
        sinks above all."""
        if self.attention_missing(cache) is not None:
            recency = recency_scores(cache.num_kv_heads, cache.length, self.n_sink)
            scores = recency[None].repeat(cache.num_layers, 1, 1).to(cache.pool.dtype)
        else:
            scores = replay_scores(cache, self.replay_chunks(cache), self.n_sink)
        scores[..., : self.n_sink] = scores.amax() + 1.0
        return scores

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        # One replay scores every layer (and the budget is shared across them, `select`); a
        # caller asking one layer (the contract tests) gets that layer of the whole.
        return self.all_scores(cache)[layer]

    def select(self, cache: SequenceKV, target_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ratio = self.compression_ratio(cache.length, target_len)
        return ragged_keep(global_prune(self.all_scores(cache), ratio, self.layerwise))

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        raise NotImplementedError("kvzip keeps a different count per layer and head: use select")

    def params(self) -> dict[str, Any]:
        return {"layerwise": self.layerwise, "n_sink": self.n_sink, "chunk_size": self.chunk_size}
