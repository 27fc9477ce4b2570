"""`snapkv`: SnapKV, tokens scored by the attention of the last queries (the observation window).

Source: Li et al., "SnapKV: LLM Knows What You Are Looking for Before Generation",
NeurIPS 2024; kvpress's ``SnapKVPress(window_size, kernel_size)``.

The attention of the last `observation_window` queries onto the earlier keys, mean over the
queries, a 1-D average pool, mean over each GQA group; the window always kept. The queries are
the ones the decoder's `AttentionObserver` kept (``window x L`` per head, never ``L x L``).

Imports torch and `presses.base`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine_adapter.token_eviction.presses.base import QueryScoredPolicy, window_attention

__all__ = ["SnapKVPolicy", "snapkv_scores"]


def snapkv_scores(queries: torch.Tensor, keys: torch.Tensor, kernel_size: int = 5) -> torch.Tensor:
    """SnapKV's scores ``[kv_heads, L]``; the window (``queries.shape[1]``) scores highest."""
    heads, window, _ = queries.shape
    kv_heads, length, _ = keys.shape
    scores = window_attention(queries, keys).mean(dim=-2)  # [heads, L - w]
    scores = F.avg_pool1d(scores[None], kernel_size=kernel_size, padding=kernel_size // 2, stride=1)[0]
    scores = scores.view(kv_heads, heads // kv_heads, length - window).mean(1)
    return F.pad(scores, (0, window), value=scores.max().item() + 1)


class SnapKVPolicy(QueryScoredPolicy):
    """SnapKV: attention of the last `observation_window` queries, pooled, per KV head.

    Args:
        observation_window: Queries scored by (kvpress's ``window_size``, 64); always kept.
        kernel_size: Width of the 1-D average pool over the scores (5).
    """

    def __init__(self, observation_window: int = 64, kernel_size: int = 5) -> None:
        if observation_window < 1 or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError("observation_window must be >= 1 and kernel_size odd and >= 1")
        self.observation_window = observation_window
        self.kernel_size = kernel_size

    def name(self) -> str:
        return "snapkv"

    def min_length(self) -> int:
        return self.observation_window + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        # The window scores above every other token; a target smaller than the window keeps
        # some of it, which ones unspecified (ties).
        window = self.observation_window
        return list(range(length - window, length)) if target_len >= window else []

    def query_scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return snapkv_scores(queries, keys, self.kernel_size)

    def params(self) -> dict[str, Any]:
        return {"observation_window": self.observation_window, "kernel_size": self.kernel_size}
