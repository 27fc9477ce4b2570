"""`knorm`: keep the keys of smallest L2 norm.

Source: Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
Compression", EMNLP 2024; kvpress's ``KnormPress``. Keys with a small norm draw the most
attention in practice, so the largest norms go first. Query-agnostic and needs only the
(rotated) keys in the pool: rotation keeps norms, so it is the same before or after RoPE.

Imports torch, `presses.base` and `SequenceKV`.
"""

from __future__ import annotations

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["KnormPolicy", "knorm_scores"]


def knorm_scores(keys: torch.Tensor) -> torch.Tensor:
    """``[kv_heads, L]``: minus each key's L2 norm, in at least float32 (a half-precision norm
    ties distinct keys and hands the choice to top-k's tie order)."""
    dtype = torch.promote_types(keys.dtype, torch.float32)
    norms: torch.Tensor = torch.linalg.vector_norm(keys, dim=-1, dtype=dtype)
    return -norms


class KnormPolicy(TokenEvictionPolicy):
    """Knorm: evict the keys of largest L2 norm, per layer and KV head."""

    def name(self) -> str:
        return "knorm"

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        return knorm_scores(cache.keys(layer))
