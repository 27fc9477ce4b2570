"""The position-wise pieces of the decoder: RMSNorm and the rotary position embedding.

RMSNorm runs torch's fused ``F.rms_norm`` in float32; rotary is the "rotate half" form of Llama
and Qwen2. `engine_adapter.model.decoder` builds its layers from them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine_adapter.model.config import ModelConfig

__all__ = ["RMSNorm", "RotaryEmbedding", "apply_rotary"]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as Llama does."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused kernel: one pass instead of pow, mean, add, rsqrt and mul.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding:
    """Rotary position embedding (the non-interleaved "rotate half" form of Llama and Qwen2).

    Not a module: its frequencies are derived from the config, never loaded, and are kept per
    device so the decoder may be built on the meta device and materialised later.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def _inverse_frequencies(self) -> torch.Tensor:
        cfg = self.config
        dim = cfg.head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
        inv_freq = 1.0 / (cfg.rope_theta**exponents)
        scaling = cfg.rope_scaling
        if scaling is None:
            return inv_freq
        factor = float(scaling["factor"])
        if scaling["rope_type"] == "linear":
            return inv_freq / factor
        # llama3: keep high frequencies, divide low ones by `factor`, interpolate between.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, ``[n, head_dim]`` each, for int64 `positions` ``[n]``."""
        inv_freq = self._inv_freq.get(positions.device)
        if inv_freq is None:
            inv_freq = self._inverse_frequencies().to(positions.device)
            self._inv_freq[positions.device] = inv_freq
        freqs = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[n, heads, head_dim]`` by the angles of its tokens (cos/sin ``[n, head_dim]``)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
