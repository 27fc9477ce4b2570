"""`compactor`: leverage of the keys blended with non-causal chunked attention.

Source: Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
Approximate Leverage Scores", 2025; kvpress's ``CompactorPress`` (with its
``NonCausalAttnPress``). Past the `sink_size_start` first and `sink_size_end` last tokens
(always kept), each token gets ``blending * leverage + attention``: the leverage of its pre-RoPE
key (`presses.leverage`, z-scored) and the attention its key receives from every query of its
chunk of `chunk_size` tokens, without a causal mask, summed over the queries, mean over each
GQA group, times the value's norm, average-pooled over 3 tokens and z-scored. kvpress's
default blending is the compression ratio: the one asked for (`evict`'s `ratio`), else
``1 - target / length``.

Needs every token's query (the observer keeps them all: `observation_window`) and the keys'
positions. On a sequence compacted before, the chunks run over the tokens still in the cache,
each key met by its own token's queries (kvpress compresses only once, after prefill).

Imports torch, `presses.base`, `presses.leverage`, `presses.rope` and `SequenceKV`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, recency_scores
from engine_adapter.token_eviction.presses.leverage import leverage_scores, sketch_generator, z_scored
from engine_adapter.token_eviction.presses.rope import pre_rope_keys, queries_at_keys, rope_missing
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["ALL_QUERIES", "CompactorPolicy", "non_causal_chunked_attention"]

ALL_QUERIES = 1 << 30
"""An observation window no sequence reaches: the observer keeps every token's query."""


def non_causal_chunked_attention(q: torch.Tensor, k: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Attention each key receives from the queries of its chunk, no causal mask, summed over
    the queries: ``[heads, S]`` from `q`, `k` ``[heads, S, D]`` (no 1/sqrt(D), as kvpress).

    The sequence is zero-padded to whole chunks; in the last chunk the padded query rows score
    0 and the padded key columns -1e-9 (kvpress's masks, kept as they are: exactness)."""
    heads, length, dim = k.shape
    padded = math.ceil(length / chunk_size) * chunk_size
    extra = padded - length
    if extra > 0:
        zeros = torch.zeros(heads, extra, dim, device=q.device, dtype=q.dtype)
        q, k = torch.cat([q, zeros], dim=1), torch.cat([k, zeros.to(k.dtype)], dim=1)
        last_start = (length // chunk_size) * chunk_size
    else:
        last_start = ((length - 1) // chunk_size) * chunk_size
    invalid = torch.arange(last_start, padded, device=q.device) >= length  # [chunk]
    chunks = padded // chunk_size
    dots = torch.matmul(
        q.view(heads, chunks, chunk_size, dim), k.view(heads, chunks, chunk_size, dim).transpose(-2, -1)
    )
    dots[:, -1].masked_fill_(invalid[None, :, None], 0)
    dots[:, -1].masked_fill_(invalid[None, None, :], -1e-9)
    weights = torch.softmax(dots.to(torch.float32), dim=-1)
    return weights.sum(dim=-2).reshape(heads, padded)[:, :length]


def _attention_scores(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """NonCausalAttnPress's z-scored ``[kv_heads, S]`` from rotated `queries` ``[heads, S, D]``."""
    kv_heads = keys.shape[0]
    groups = queries.shape[0] // kv_heads
    attention = non_causal_chunked_attention(queries, keys.repeat_interleave(groups, dim=0), chunk_size)
    attention = attention.view(kv_heads, groups, -1).mean(dim=1)
    scores = attention * values.norm(dim=-1)
    scores = F.avg_pool1d(scores[None], kernel_size=3, padding=1, stride=1)[0]
    return z_scored(scores)


class CompactorPolicy(TokenEvictionPolicy):
    """Compactor: leverage of the pre-RoPE keys blended with non-causal chunked attention.

    Args:
        sink_size_start: First tokens always kept (8).
        sink_size_end: Last tokens always kept (4).
        chunk_size: Tokens per chunk of the non-causal attention (256).
        sketch_dimension: Columns of the leverage sketch (48).
        blending: Weight of the leverage scores; negative (the default): the compression
            ratio (`TokenEvictionPolicy.compression_ratio`).
        seed: Seed of the leverage sketch.
    """

    observation_window = ALL_QUERIES
    track_positions = True

    def __init__(
        self,
        sink_size_start: int = 8,
        sink_size_end: int = 4,
        chunk_size: int = 256,
        sketch_dimension: int = 48,
        blending: float = -1.0,
        seed: int = 0,
    ) -> None:
        if min(sink_size_start, sink_size_end, seed) < 0 or chunk_size < 1 or sketch_dimension < 1:
            raise ValueError("sink sizes and seed must be >= 0, chunk_size and sketch_dimension >= 1")
        self.sink_size_start, self.sink_size_end = sink_size_start, sink_size_end
        self.chunk_size, self.sketch_dimension = chunk_size, sketch_dimension
        self.blending, self.seed = blending, seed

    def name(self) -> str:
        return "compactor"

    def min_length(self) -> int:
        return self.sink_size_start + self.sink_size_end + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        # The sinks score as much as the best token (kvpress pads with the max): all of them
        # and it fit when the target has room for one more.
        left = min(self.sink_size_start, length)
        right = min(self.sink_size_end, max(0, length - left))
        if target_len < left + right + 1:
            return []
        return [*range(left), *range(length - right, length)]

    def attention_missing(self, cache: SequenceKV) -> str | None:
        return rope_missing(cache, queries=True)

    def layer_scores(self, cache: SequenceKV, target_len: int) -> list[torch.Tensor]:
        length = cache.length
        left = min(self.sink_size_start, length)
        if rope_missing(cache, queries=True) is not None:
            return [recency_scores(cache.num_kv_heads, length, left)] * cache.num_layers
        right = min(self.sink_size_end, max(0, length - left))
        middle = slice(left, length - right)
        blending = self.blending if self.blending >= 0 else self.compression_ratio(length, target_len)
        generator = sketch_generator(self.seed, cache.pool.device)
        out = []
        for layer in range(cache.num_layers):
            lev = z_scored(
                leverage_scores(pre_rope_keys(cache, layer)[:, middle], self.sketch_dimension, generator)
            )
            queries = queries_at_keys(cache, layer)
            assert queries is not None
            keys, values = cache.keys(layer)[:, middle], cache.values(layer)[:, middle]
            scores = blending * lev + _attention_scores(queries[:, middle], keys, values, self.chunk_size)
            out.append(F.pad(scores, (left, right), value=scores.max().item()))
        return out

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        # A layer's sketch is the draw after those of the layers before it.
        return self.layer_scores(cache, target_len)[layer]

    def params(self) -> dict[str, Any]:
        return {
            "sink_size_start": self.sink_size_start,
            "sink_size_end": self.sink_size_end,
            "chunk_size": self.chunk_size,
            "sketch_dimension": self.sketch_dimension,
            "blending": self.blending,
            "seed": self.seed,
        }
