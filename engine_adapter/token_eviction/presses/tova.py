"""`tova`: TOVA, drop what the newest query attends to least, averaged over all heads.

Source: Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024;
kvpress's ``TOVAPress``. The newest query's attention, mean over all heads: one token set for
every KV head; the newest token always kept.

Imports torch and `presses.base`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_adapter.token_eviction.presses.base import QueryScoredPolicy, window_attention

__all__ = ["TOVAPolicy", "tova_scores"]


def tova_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """TOVA's scores ``[kv_heads, L]``: the newest query's attention, mean over heads, the
    same for every KV head; the newest token scores highest. `query`: ``[heads, 1, D]``."""
    scores = window_attention(query[:, -1:], keys).mean(0)  # [1, L - 1]
    scores = scores.repeat(keys.shape[0], 1)
    return F.pad(scores, (0, 1), value=scores.max().item() + 1)


class TOVAPolicy(QueryScoredPolicy):
    """TOVA: drop what the newest query attends to least, averaged over all heads."""

    observation_window = 1

    def name(self) -> str:
        return "tova"

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return [length - 1]

    def query_scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return tova_scores(queries, keys)
