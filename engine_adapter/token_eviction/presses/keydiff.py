"""`keydiff`: keep the keys least like the average key direction.

Source: Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
Inference in Resource-Constrained Environments", 2025; kvpress's ``KeyDiffPress`` (one shot
over the whole context, not the paper's block-wise loop). Per KV head the anchor is the mean of
the unit-normalised keys; a key's score is minus its cosine similarity to the anchor, so keys
that stand out are kept. Query-agnostic; reads the rotated keys in the pool, as kvpress does.

Imports torch, `presses.base` and `SequenceKV`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["KeyDiffPolicy", "keydiff_scores"]


def keydiff_scores(keys: torch.Tensor) -> torch.Tensor:
    """``[kv_heads, L]``: minus the cosine similarity of each key to its head's anchor."""
    anchor = F.normalize(keys, p=2, dim=-1).mean(dim=-2, keepdim=True)
    return -F.cosine_similarity(keys, anchor, dim=-1)


class KeyDiffPolicy(TokenEvictionPolicy):
    """KeyDiff: evict the keys most similar to the mean key direction, per layer and KV head."""

    def name(self) -> str:
        return "keydiff"

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        return keydiff_scores(cache.keys(layer))
