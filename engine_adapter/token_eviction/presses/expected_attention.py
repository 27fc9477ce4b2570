"""`expected_attention`: keep the keys future queries are expected to attend to.

Source: Devoto et al., "Expected Attention: KV Cache Compression by Estimating Attention from
Future Queries Distribution", 2025; kvpress's ``ExpectedAttentionPress``. The pre-RoPE queries
of the sequence past its `n_sink` first tokens are modelled as a Gaussian (mean and
covariance per head); the RoPE rotation is averaged over the `n_future_positions` positions
after the sequence and applied to both; a key's expected attention is the softmax over keys of
``k.mu / sqrt(D) + k^T Sigma k / (2 D)``, mean over each GQA group, times the value's norm.
The sinks are always kept.

The queries are the observer's (it keeps every token's: `observation_window`), their rotation
undone with their positions (`presses.rope`); the future rotations come from the decoder's
rotary embedding. Compressed again later (memory pressure), the statistics are those of every
query seen so far, the prompt's and the generated tokens' (kvpress compresses only once).

Imports torch, `presses.base`, `presses.compactor` (its window), `presses.rope` and `SequenceKV`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, recency_scores
from engine_adapter.token_eviction.presses.compactor import ALL_QUERIES
from engine_adapter.token_eviction.presses.rope import observed_queries, rope_missing, unrotate
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["ExpectedAttentionPolicy", "average_rotation", "expected_attention_scores"]


def average_rotation(
    rotary: Any, first: int, count: int, dim: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The RoPE rotation matrix ``[D, D]`` averaged over positions ``first .. first+count-1``
    (rotate-half layout: ``R x = x cos + rot(x) sin``)."""
    positions = torch.arange(first, first + count, device=device)
    cos, sin = rotary.cos_sin(positions, dtype)
    identity = torch.eye(dim, device=device, dtype=dtype)
    swap = torch.zeros((dim, dim), device=device, dtype=dtype)
    half = dim // 2
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    rotation: torch.Tensor = (cos.unsqueeze(1) * identity + sin.unsqueeze(1) * swap).mean(dim=0)
    return rotation


def expected_attention_scores(
    mean: torch.Tensor,
    cov: torch.Tensor | None,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    use_vnorm: bool = True,
    epsilon: float = 0.0,
) -> torch.Tensor:
    """``[kv_heads, n]`` from the rotated query mean ``[heads, D]`` (and covariance
    ``[heads, D, D]``) and the rotated `keys` / `values` ``[kv_heads, n, D]``."""
    kv_heads, n, dim = keys.shape
    groups = mean.shape[0] // kv_heads
    k = keys.repeat_interleave(groups, dim=0).transpose(1, 2)  # [heads, D, n]
    scores = torch.matmul(mean.unsqueeze(1), k).squeeze(1) / math.sqrt(dim)
    if cov is not None:
        scores = scores + torch.einsum("hin,hij,hjn->hn", k, cov, k) / dim / 2
    scores = F.softmax(scores, dim=-1).view(kv_heads, groups, n).mean(dim=1)
    if use_vnorm:
        scores = (scores + epsilon) * values.norm(dim=-1)
    return scores


class ExpectedAttentionPolicy(TokenEvictionPolicy):
    """Expected Attention: the attention a Gaussian model of the next queries pays each key.

    Args:
        n_future_positions: Positions after the sequence the rotation is averaged over (512).
        n_sink: First tokens always kept and left out of the query statistics (4).
        use_covariance: Add the queries' covariance term (True).
        use_vnorm: Weight by the value norms (True).
        epsilon: Added to the scores before the value-norm weighting (0).
    """

    observation_window = ALL_QUERIES
    track_positions = True

    def __init__(
        self,
        n_future_positions: int = 512,
        n_sink: int = 4,
        use_covariance: bool = True,
        use_vnorm: bool = True,
        epsilon: float = 0.0,
    ) -> None:
        if n_future_positions < 1 or n_sink < 0:
            raise ValueError("n_future_positions must be >= 1 and n_sink >= 0")
        self.n_future_positions, self.n_sink = n_future_positions, n_sink
        self.use_covariance, self.use_vnorm, self.epsilon = use_covariance, use_vnorm, epsilon

    def name(self) -> str:
        return "expected_attention"

    def min_length(self) -> int:
        return self.n_sink + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(min(self.n_sink, length))) if target_len >= self.n_sink else []

    def attention_missing(self, cache: SequenceKV) -> str | None:
        return rope_missing(cache, queries=True)

    def _statistics(self, cache: SequenceKV, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rotated mean and covariance of the layer's pre-RoPE queries past the sinks."""
        seen, obs = observed_queries(cache, layer), cache.observer
        assert seen is not None and obs is not None
        queries, first = seen
        skip = max(0, self.n_sink - first)  # the sinks' queries, when the observer saw them
        pos = torch.arange(first + skip, first + queries.shape[1], device=queries.device)
        cos, sin = obs.rotary.cos_sin(pos, queries.dtype)
        q = unrotate(queries[:, skip:], cos[None], sin[None])  # [heads, n, D]
        mean = q.mean(dim=1, keepdim=True)
        cov = None
        if self.use_covariance:
            centred = q - mean
            cov = torch.einsum("nsi,nsj->nij", centred, centred) / q.shape[1]
        rotation = average_rotation(
            obs.rotary, obs.next_position, self.n_future_positions, q.shape[-1], q.dtype, q.device
        )
        mean = torch.matmul(mean.squeeze(1), rotation.T)
        if cov is not None:
            cov = torch.matmul(rotation, torch.matmul(cov, rotation.T))
        return mean, cov

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        if cache.length <= self.n_sink or rope_missing(cache, queries=True) is not None:
            return recency_scores(cache.num_kv_heads, cache.length, self.n_sink)
        mean, cov = self._statistics(cache, layer)
        keys, values = cache.keys(layer)[:, self.n_sink :], cache.values(layer)[:, self.n_sink :]
        scores = expected_attention_scores(
            mean, cov, keys, values, use_vnorm=self.use_vnorm, epsilon=self.epsilon
        )
        return F.pad(scores, (self.n_sink, 0), value=scores.max().item() + 1)

    def params(self) -> dict[str, Any]:
        return {
            "n_future_positions": self.n_future_positions,
            "n_sink": self.n_sink,
            "use_covariance": self.use_covariance,
            "use_vnorm": self.use_vnorm,
            "epsilon": self.epsilon,
        }
