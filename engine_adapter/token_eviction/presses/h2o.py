"""`h2o`: H2O, heavy hitters by accumulated attention, plus the newest tokens.

Source: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models", NeurIPS 2023; kvpress's ``ObservedAttentionPress`` (which has no recent
window: ours with ``recent_window=0`` is it).

The attention each key received from every query that saw it, divided by their number, mean
over each GQA group; from the sums the decoder's `AttentionObserver` accumulated in query
chunks, never an ``L x L`` matrix.

Imports torch, `presses.base` and `SequenceKV`.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, recency_scores
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["H2OPolicy", "observed_attention_scores"]


def observed_attention_scores(attention_sum: torch.Tensor, seen: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """H2O's scores ``[kv_heads, L]``: mean attention received per query that saw the key, mean
    over each GQA group (kvpress's ObservedAttentionPress when every prompt query was seen)."""
    heads, length = attention_sum.shape
    scores = attention_sum / seen.clamp(min=1.0)
    return scores.view(kv_heads, heads // kv_heads, length).mean(1)


class H2OPolicy(TokenEvictionPolicy):
    """H2O: heavy hitters by accumulated attention, plus the `recent_window` newest tokens.

    Args:
        recent_window: Newest tokens always kept (0: kvpress's ObservedAttentionPress exactly).
    """

    accumulate_attention = True

    def __init__(self, recent_window: int = 32) -> None:
        if recent_window < 0:
            raise ValueError("recent_window must be >= 0")
        self.recent_window = recent_window

    def name(self) -> str:
        return "h2o"

    def min_length(self) -> int:
        return self.recent_window + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(length - min(self.recent_window, target_len), length))

    def _observed(self, cache: SequenceKV, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer's accumulated attention and query counts, when they cover every token."""
        obs = cache.observer
        total = None if obs is None else obs.attention_sum.get(layer)
        seen = None if obs is None else obs.seen.get(layer)
        if total is None or seen is None or total.shape[1] != cache.length:
            return None
        return total, seen

    def attention_missing(self, cache: SequenceKV) -> str | None:
        if cache.observer is None:
            return "no attention observer (the sequence started before this policy was set)"
        for layer in range(cache.num_layers):
            if self._observed(cache, layer) is None:
                return f"no accumulated attention over all {cache.length} tokens at layer {layer}"
        return None

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        observed = self._observed(cache, layer)
        if observed is None:
            return recency_scores(cache.num_kv_heads, cache.length)
        total, seen = observed
        scores = observed_attention_scores(total, seen, cache.num_kv_heads)
        recent = min(self.recent_window, target_len)
        if recent > 0:
            scores = scores.clone()
            scores[:, cache.length - recent :] = scores.max() + 1
        return scores

    def params(self) -> dict[str, Any]:
        return {"recent_window": self.recent_window}
