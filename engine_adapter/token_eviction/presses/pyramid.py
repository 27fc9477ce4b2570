"""`pyramid`: per-layer budgets shaped as a pyramid, over any scoring press.

Source: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
Funneling", 2024; kvpress's ``PyramidKVPress`` (which is SnapKV's scores only: ``pyramid:snapkv``
is it). Lower layers keep more than higher ones: layer ``l`` of ``N`` keeps
``round(max_num - l * (max_num - min_num) / (N - 1))`` tokens, where the budgets average the
target, ``max_capacity = window_size + L * (1 - ratio)``, ``min_num = (max_capacity -
window_size) / beta`` and ``max_num = 2 (max_capacity - window_size) - min_num`` (capped at
``L - window_size``), falling back to the target everywhere when the pyramid does not fit.
The ratio is the one asked for (`evict`'s `ratio`), else ``1 - target / L``.

The layers' kept sets are compacted into the pool, padded to the largest
(docs/architecture.md, "Head-varying budgets").

Imports torch and `presses.base`.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import (
    TokenEvictionPolicy,
    check_wrappable,
    ragged_keep,
    top_kept,
)
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["PyramidPolicy", "pyramid_budgets"]


def pyramid_budgets(length: int, ratio: float, layers: int, window_size: int, beta: int) -> list[int]:
    """Tokens each layer keeps (kvpress's ``PyramidKVPress.get_layer_budget``)."""
    max_capacity = window_size + length * (1 - ratio)
    min_num = (max_capacity - window_size) / beta
    max_num = (max_capacity - window_size) * 2 - min_num
    if max_num >= length - window_size:
        max_num = length - window_size
        min_num = (max_capacity - window_size) * 2 - max_num
    if not length >= max_num >= min_num >= window_size:
        return [max(1, round(length * (1 - ratio)))] * layers
    steps = (max_num - min_num) / (layers - 1) if layers > 1 else 0.0
    return [round(max_num - layer * steps) for layer in range(layers)]


class PyramidPolicy(TokenEvictionPolicy):
    """PyramidKV: the wrapped press's scores, more tokens kept in lower layers.

    Args:
        press: The scoring press (the registry builds it from its name).
        window_size: The pyramid's window (kvpress's, 64: SnapKV's observation window).
        beta: Steepness of the pyramid (20): the top layer keeps ``1/beta`` of the average.
    """

    wraps_press = True

    def __init__(self, press: TokenEvictionPolicy, window_size: int = 64, beta: int = 20) -> None:
        if window_size < 0 or beta < 1:
            raise ValueError("window_size must be >= 0 and beta >= 1")
        check_wrappable("pyramid", press)
        self.press = press
        self.window_size = window_size
        self.beta = beta
        self.observation_window = press.observation_window
        self.accumulate_attention = press.accumulate_attention
        self.track_positions = press.track_positions

    def name(self) -> str:
        return "pyramid"

    def min_length(self) -> int:
        return self.press.min_length()

    def attention_missing(self, cache: SequenceKV) -> str | None:
        return self.press.attention_missing(cache)

    def select(self, cache: SequenceKV, target_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        length = cache.length
        ratio = self.compression_ratio(length, target_len)
        budgets = pyramid_budgets(length, ratio, cache.num_layers, self.window_size, self.beta)
        budgets = [min(length, max(1, b)) for b in budgets]
        self.press.ratio = self.ratio
        try:
            scores = self.press.layer_scores(cache, target_len)
        finally:
            self.press.ratio = None
        rows = [list(top_kept(s, b)) for s, b in zip(scores, budgets, strict=True)]
        return ragged_keep(rows)

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        raise NotImplementedError("pyramid keeps a different count per layer: use select")

    def params(self) -> dict[str, Any]:
        return {
            "press": self.press.name(),
            "window_size": self.window_size,
            "beta": self.beta,
            **self.press.params(),
        }
