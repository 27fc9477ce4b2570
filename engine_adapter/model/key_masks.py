"""The attention masks of padded, head-varying caches (token-level eviction's budget wrappers).

A compaction with head-varying budgets (`adakv`, `pyramid`) keeps a different count per layer and
KV head and pads every row to the widest (docs/architecture.md, "Head-varying budgets"); the
sequence's key mask says which cache indices are padding. `padding_masks` turns the masks of a
batch into what the attention of each layer adds to its causal mask.
"""

from __future__ import annotations

import torch

from engine_adapter.model.config import ModelConfig

__all__ = ["padding_masks"]


def padding_masks(masks: list[torch.Tensor | None], width: int, config: ModelConfig) -> torch.Tensor:
    """``[layers, B, heads, 1, width]``: per sequence its key mask over its first cache indices
    (each KV head's repeated over its query heads), True elsewhere."""
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    out = torch.ones(layers, len(masks), heads, 1, width, dtype=torch.bool)
    for b, m in enumerate(masks):
        if m is not None:
            n = min(m.shape[-1], width)
            groups = heads // m.shape[1]
            out[:, b, :, 0, :n] = m[..., :n].cpu().repeat_interleave(groups, dim=1)
    return out
