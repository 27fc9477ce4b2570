"""`adakv`: head-wise budgets from one pool per layer, over any scoring press.

Source: Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
Efficient LLM Inference", 2024; kvpress's ``AdaKVPress(press, alpha_safeguard)``. Each layer
keeps ``kv_heads * target`` tokens in all, chosen across its heads together by the wrapped
press's scores, so a head whose scores are spread keeps more than one whose are peaked; every
head first keeps its ``int(target * alpha_safeguard)`` best (at least 1).

Wraps any press that gives scores (``adakv:snapkv``, ``adakv:press=knorm,alpha_safeguard=0.1``;
the params the wrapper does not take go to the press). kvpress only masks the evicted keys, so
its cache never shrinks; here the heads' kept sets are compacted into the pool, padded to the
largest (docs/architecture.md, "Head-varying budgets").

Imports torch and `presses.base`.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, check_wrappable, ragged_keep
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["AdaKVPolicy", "adakv_kept"]


def adakv_kept(scores: torch.Tensor, n_kept: int, alpha_safeguard: float) -> list[torch.Tensor]:
    """Per KV head the kept indices of one layer's `scores` ``[kv_heads, L]``: the safeguard's
    best of each head, then the lowest ``kv_heads * (L - n_kept)`` of all heads pruned."""
    kv_heads, length = scores.shape
    scores = scores.clone()
    n_safe = int(n_kept * alpha_safeguard)
    if alpha_safeguard > 0:
        n_safe = max(1, n_safe)
    safe = torch.topk(scores, n_safe, dim=-1).indices
    scores.scatter_(-1, safe, torch.finfo(scores.dtype).max)
    n_pruned = kv_heads * (length - n_kept)
    pruned = torch.topk(-scores.reshape(-1), n_pruned).indices
    kept = torch.ones(kv_heads * length, dtype=torch.bool, device=scores.device)
    kept[pruned] = False
    kept = kept.view(kv_heads, length)
    return [kept[h].nonzero().squeeze(1) for h in range(kv_heads)]


class AdaKVPolicy(TokenEvictionPolicy):
    """AdaKV: the wrapped press's scores, each layer's budget shared out over its KV heads.

    Args:
        press: The scoring press (the registry builds it from its name).
        alpha_safeguard: Fraction of the average budget every head keeps at least (0.2).
    """

    wraps_press = True

    def __init__(self, press: TokenEvictionPolicy, alpha_safeguard: float = 0.2) -> None:
        if not 0.0 <= alpha_safeguard <= 1.0:
            raise ValueError("alpha_safeguard must be in [0, 1]")
        check_wrappable("adakv", press)
        self.press = press
        self.alpha_safeguard = alpha_safeguard
        self.observation_window = press.observation_window
        self.accumulate_attention = press.accumulate_attention
        self.track_positions = press.track_positions

    def name(self) -> str:
        return "adakv"

    def min_length(self) -> int:
        return self.press.min_length()

    def attention_missing(self, cache: SequenceKV) -> str | None:
        return self.press.attention_missing(cache)

    def select(self, cache: SequenceKV, target_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.press.ratio = self.ratio
        try:
            scores = self.press.layer_scores(cache, target_len)
        finally:
            self.press.ratio = None
        return ragged_keep([adakv_kept(s, target_len, self.alpha_safeguard) for s in scores])

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        raise NotImplementedError("adakv keeps a different count per head: use select")

    def params(self) -> dict[str, Any]:
        return {"press": self.press.name(), "alpha_safeguard": self.alpha_safeguard, **self.press.params()}
