"""`sliding`: StreamingLLM's attention sinks plus the most recent tokens.

Source: Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024;
kvpress's ``StreamingLLMPress(n_sink)``. The spec's sliding window with a protected
prefix: under memory pressure it keeps at most the sinks plus ``--eviction-window`` tokens.

Imports torch, `presses.base`, `SequenceKV` and the package's torch-free defaults.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction import DEFAULT_EVICTION_WINDOW
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["SlidingWindowPolicy", "streaming_scores"]


def streaming_scores(kv_heads: int, length: int, n_keep: int, n_sink: int) -> torch.Tensor:
    """StreamingLLM's scores ``[kv_heads, L]``: 0 for the pruned tokens right after the sinks."""
    n_pruned = length - n_keep
    scores = torch.ones(kv_heads, length)
    scores[:, n_sink : n_sink + n_pruned] = 0
    return scores


class SlidingWindowPolicy(TokenEvictionPolicy):
    """StreamingLLM: the `protected_prefix` first tokens (attention sinks) and the most recent.

    Args:
        window_size: Under memory pressure it keeps at most this many recent tokens after the
            sinks (the spec's ``--eviction-window``).
        protected_prefix: Sink tokens never evicted (kvpress's ``n_sink``, 4 by default).
    """

    window_param = "window_size"

    def __init__(self, window_size: int = DEFAULT_EVICTION_WINDOW, protected_prefix: int = 4) -> None:
        if window_size < 1 or protected_prefix < 0:
            raise ValueError("window_size must be >= 1 and protected_prefix >= 0")
        self.window_size = window_size
        self.protected_prefix = protected_prefix

    def name(self) -> str:
        return "sliding"

    def min_length(self) -> int:
        return self.protected_prefix + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        n_sink = min(self.protected_prefix, target_len)
        return [*range(n_sink), *range(length - (target_len - n_sink), length)]

    def target_len(self, length: int, target: int) -> int:
        """What memory pressure shrinks a sequence to: at most sinks plus the window."""
        return min(target, self.protected_prefix + self.window_size)

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        n_sink = min(self.protected_prefix, target_len)
        return streaming_scores(cache.num_kv_heads, cache.length, target_len, n_sink)

    def params(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "protected_prefix": self.protected_prefix}
