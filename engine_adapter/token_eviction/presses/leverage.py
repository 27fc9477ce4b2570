"""`leverage`: keep the keys with the largest (approximate) statistical leverage.

Source: Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
Approximate Leverage Scores", 2025; kvpress's ``LeverageScorePress``. Per KV head the pre-RoPE
keys are centred over the sequence and sketched on the right by a Gaussian ``D x k`` matrix;
a key's leverage is the diagonal of ``X (X^T X)^-1 X^T`` of the sketch ``X``, computed from a
Cholesky factor of ``X^T X`` (with kvpress's growing jitter), then z-scored over the layer.
Keys that are outliers of the layer's key geometry score high. Query-agnostic.

The sketch is random: a policy draws it from its own generator seeded with `seed` at every
compression, one ``[1, kv_heads, D, k]`` draw per layer in layer order, which is exactly what
kvpress draws from torch's global generator after ``torch.manual_seed(seed)`` (the kvpress
tests rely on it). The pre-RoPE keys come from `presses.rope`.

Imports torch, `presses.base`, `presses.rope` and `SequenceKV`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, recency_scores
from engine_adapter.token_eviction.presses.rope import pre_rope_keys, rope_missing
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["LeveragePolicy", "leverage_scores", "sketch_generator"]


def sketch_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator one compression draws its sketches from."""
    return torch.Generator(device=device).manual_seed(seed)


def _cholesky_with_jitter(gram: torch.Tensor, jitter: float, tries: int = 5) -> torch.Tensor:
    """Lower Cholesky factor of `gram` plus a jitter times the identity, the jitter growing
    tenfold (from 1e-2 when it started at 0) until every factorisation succeeds."""
    identity = torch.eye(gram.shape[-1], device=gram.device, dtype=gram.dtype)
    current = float(jitter)
    for _ in range(tries):
        factor: torch.Tensor
        factor, info = torch.linalg.cholesky_ex(gram + current * identity, upper=False)
        if bool((info == 0).all()):
            return factor
        current = max(1e-8, 1e-2 if current == 0.0 else 10.0 * current)
    raise RuntimeError(f"Cholesky factorisation failed after {tries} tries")


def leverage_scores(
    pre_rope: torch.Tensor, sketch_dimension: int, generator: torch.Generator
) -> torch.Tensor:
    """Approximate leverage ``[kv_heads, L]`` of pre-RoPE keys ``[kv_heads, L, D]`` (not z-scored)."""
    keys = pre_rope[None]  # kvpress's batch axis: the draw's shape is its shape
    dim = keys.shape[-1]
    sketch = torch.randn(
        (1, keys.shape[1], dim, sketch_dimension), generator=generator, device=keys.device, dtype=keys.dtype
    ) * (1 / math.sqrt(sketch_dimension))
    x = torch.matmul(keys - keys.mean(dim=-2, keepdim=True), sketch).to(torch.float32)
    xt = x.transpose(-2, -1)
    gram = xt @ x
    factor = _cholesky_with_jitter(0.5 * (gram + gram.transpose(-2, -1)), jitter=1e-2)
    solved = torch.cholesky_solve(xt, factor, upper=False)  # (X^T X)^-1 X^T, no inverse formed
    return (x * solved.transpose(-2, -1)).sum(dim=-1).clamp_min(0)[0]


def z_scored(scores: torch.Tensor) -> torch.Tensor:
    """Scores standardised over the whole layer (every head together), as kvpress does."""
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)


class LeveragePolicy(TokenEvictionPolicy):
    """Leverage: keep the keys that stand out of the layer's pre-RoPE key geometry.

    Args:
        sketch_dimension: Columns of the Gaussian sketch (kvpress's 48).
        seed: Seed of the sketch, drawn afresh at every compression.
    """

    track_positions = True

    def __init__(self, sketch_dimension: int = 48, seed: int = 0) -> None:
        if sketch_dimension < 1 or seed < 0:
            raise ValueError("sketch_dimension must be >= 1 and seed >= 0")
        self.sketch_dimension = sketch_dimension
        self.seed = seed

    def name(self) -> str:
        return "leverage"

    def attention_missing(self, cache: SequenceKV) -> str | None:
        return rope_missing(cache, queries=False)

    def layer_scores(self, cache: SequenceKV, target_len: int) -> list[torch.Tensor]:
        if rope_missing(cache, queries=False) is not None:
            return [recency_scores(cache.num_kv_heads, cache.length)] * cache.num_layers
        generator = sketch_generator(self.seed, cache.pool.device)
        return [
            z_scored(leverage_scores(pre_rope_keys(cache, layer), self.sketch_dimension, generator))
            for layer in range(cache.num_layers)
        ]

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        # A layer's sketch is the draw after those of the layers before it: only a whole
        # compression's draws give it.
        return self.layer_scores(cache, target_len)[layer]

    def params(self) -> dict[str, Any]:
        return {"sketch_dimension": self.sketch_dimension, "seed": self.seed}
