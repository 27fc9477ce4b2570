"""The token-level policies of spec 002: ``should_evict(cache, mem_available)``, ``evict(cache,
target_len)``, ``name()``, and the scores they keep tokens by.

Each score function takes tensors and returns ``[kv_heads, L]`` (higher is kept), with the
semantics of NVIDIA kvpress 0.5.5's presses (the differential tests in
tests/test_token_eviction_kvpress.py check the kept indices are exactly kvpress's):

=========  =============================  ==================================================
policy     kvpress                        score
=========  =============================  ==================================================
sliding    StreamingLLMPress(n_sink)      the first `n_sink` (the spec's protected prefix)
                                          and the most recent tokens
snapkv     SnapKVPress(window, kernel)    attention of the last `window` queries onto the
                                          earlier keys, mean over queries, 1-D average pool,
                                          mean over each GQA group; the window always kept
h2o        ObservedAttentionPress         attention each key received from every query that
                                          saw it, divided by their number, mean over each
                                          group; plus the `recent_window` newest always kept
tova       TOVAPress                      attention of the newest query, mean over all heads
                                          (one token set for every KV head); newest kept
=========  =============================  ==================================================

Scores come from the real attention without a ``T x T`` matrix: snapkv and tova use the queries
the decoder's `AttentionObserver` kept (``window x T`` per head), h2o the sums it accumulated
in query chunks. The kept count is kvpress's ``max(1, int(L * (1 - compression_ratio)))``
(`kept_for_ratio`), the same for every layer and head.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F

from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.token_eviction import DEFAULT_EVICTION_WINDOW, TOKEN_POLICY_NAMES
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = [
    "H2OPolicy",
    "NoEvictionPolicy",
    "SlidingWindowPolicy",
    "SnapKVPolicy",
    "TOVAPolicy",
    "TokenEvictionPolicy",
    "kept_for_ratio",
    "make_token_policy",
    "observed_attention_scores",
    "snapkv_scores",
    "streaming_scores",
    "top_kept",
    "tova_scores",
    "window_attention",
]


def kept_for_ratio(length: int, compression_ratio: float) -> int:
    """Tokens kept when a fraction `compression_ratio` of `length` is removed (kvpress's rule)."""
    if not 0.0 <= compression_ratio < 1.0:
        raise ValueError(f"compression ratio {compression_ratio!r} must be in [0, 1)")
    return max(1, int(length * (1 - compression_ratio)))


def top_kept(scores: torch.Tensor, n_keep: int) -> torch.Tensor:
    """The `n_keep` highest-scoring cache indices per row of `scores` ``[..., L]``, ascending."""
    return scores.topk(n_keep, dim=-1).indices.sort(dim=-1).values


# ---- scores (tensor in, tensor out) -------------------------------------------------------


def window_attention(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Softmax attention of the last ``w`` queries onto all ``L`` keys, causal inside the window,
    then the window's own columns dropped: ``[heads, w, L - w]``.

    Args:
        queries: ``[heads, w, D]``, rotated, the queries of cache indices ``L-w .. L-1``.
        keys: ``[kv_heads, L, D]``, rotated.
    """
    heads, window, dim = queries.shape
    kv_heads, length, _ = keys.shape
    k = keys.repeat_interleave(heads // kv_heads, dim=0)
    weights = torch.matmul(queries, k.transpose(1, 2)) / math.sqrt(dim)
    mask = torch.triu(torch.full_like(weights, float("-inf")), diagonal=length - window + 1)
    weights = torch.softmax(weights + mask, dim=-1, dtype=torch.float32).to(queries.dtype)
    return weights[..., :-window]


def snapkv_scores(queries: torch.Tensor, keys: torch.Tensor, kernel_size: int = 5) -> torch.Tensor:
    """SnapKV's scores ``[kv_heads, L]``; the window (``queries.shape[1]``) scores highest."""
    heads, window, _ = queries.shape
    kv_heads, length, _ = keys.shape
    scores = window_attention(queries, keys).mean(dim=-2)  # [heads, L - w]
    scores = F.avg_pool1d(scores[None], kernel_size=kernel_size, padding=kernel_size // 2, stride=1)[0]
    scores = scores.view(kv_heads, heads // kv_heads, length - window).mean(1)
    return F.pad(scores, (0, window), value=scores.max().item() + 1)


def tova_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """TOVA's scores ``[kv_heads, L]``: the newest query's attention, mean over heads, the
    same for every KV head; the newest token scores highest. `query`: ``[heads, 1, D]``."""
    scores = window_attention(query[:, -1:], keys).mean(0)  # [1, L - 1]
    scores = scores.repeat(keys.shape[0], 1)
    return F.pad(scores, (0, 1), value=scores.max().item() + 1)


def streaming_scores(kv_heads: int, length: int, n_keep: int, n_sink: int) -> torch.Tensor:
    """StreamingLLM's scores ``[kv_heads, L]``: 0 for the pruned tokens right after the sinks."""
    n_pruned = length - n_keep
    scores = torch.ones(kv_heads, length)
    scores[:, n_sink : n_sink + n_pruned] = 0
    return scores


def observed_attention_scores(attention_sum: torch.Tensor, seen: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """H2O's scores ``[kv_heads, L]``: mean attention received per query that saw the key, mean
    over each GQA group (kvpress's ObservedAttentionPress when every prompt query was seen)."""
    heads, length = attention_sum.shape
    scores = attention_sum / seen.clamp(min=1.0)
    return scores.view(kv_heads, heads // kv_heads, length).mean(1)


# ---- the policies --------------------------------------------------------------------------


class TokenEvictionPolicy(ABC):
    """The spec's ``EvictionPolicy`` for one sequence's tokens.

    Subclasses give `scores` (or override `keep_indices`); `evict` compacts the sequence in the
    pool. A policy keeps no per-sequence state: what it scores by lives in the sequence's
    `AttentionObserver` (made by `make_observer`), so one policy serves every sequence and can be
    swapped between two steps.
    """

    observation_window: int = 0
    accumulate_attention: bool = False

    @abstractmethod
    def name(self) -> str:
        """The policy's name (``--token-eviction``)."""

    def min_length(self) -> int:
        """Shortest sequence it can shrink (what it always keeps, plus one)."""
        return 2

    def should_evict(self, cache: SequenceKV, mem_available: int) -> bool:
        """Whether `cache` can and should shrink with `mem_available` bytes left (the caller has
        compared that with its threshold)."""
        del mem_available
        return cache.length >= self.min_length()

    def make_observer(self) -> AttentionObserver | None:
        """What the attention must collect for this policy, per sequence (None: nothing)."""
        if self.observation_window <= 0 and not self.accumulate_attention:
            return None
        return AttentionObserver(window=self.observation_window, accumulate=self.accumulate_attention)

    def evict(self, cache: SequenceKV, target_len: int) -> int:
        """Compact `cache` to `target_len` tokens per layer and KV head; returns tokens removed."""
        if target_len >= cache.length:
            return 0
        target_len = max(1, target_len)
        return cache.compact(self.keep_indices(cache, target_len))

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        """Cache indices to keep, ``[layers, kv_heads, target_len]``, ascending."""
        return torch.stack(
            [top_kept(self.scores(cache, layer, target_len), target_len) for layer in range(cache.num_layers)]
        )

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        """``[kv_heads, L]`` scores of layer `layer` (higher kept)."""
        raise NotImplementedError(f"{type(self).__name__} gives no scores")

    def params(self) -> dict[str, Any]:
        """Its parameters (for stats and logs)."""
        return {}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"


class NoEvictionPolicy(TokenEvictionPolicy):
    """The default: never evicts; behaviour identical to an engine without token eviction."""

    def name(self) -> str:
        return "none"

    def should_evict(self, cache: SequenceKV, mem_available: int) -> bool:
        return False

    def evict(self, cache: SequenceKV, target_len: int) -> int:
        return 0


class SlidingWindowPolicy(TokenEvictionPolicy):
    """StreamingLLM: the `protected_prefix` first tokens (attention sinks) and the most recent.

    Args:
        window_size: Under memory pressure it keeps at most this many recent tokens after the
            sinks (the spec's ``--eviction-window``).
        protected_prefix: Sink tokens never evicted (kvpress's ``n_sink``, 4 by default).
    """

    def __init__(self, window_size: int = DEFAULT_EVICTION_WINDOW, protected_prefix: int = 4) -> None:
        if window_size < 1 or protected_prefix < 0:
            raise ValueError("window_size must be >= 1 and protected_prefix >= 0")
        self.window_size = window_size
        self.protected_prefix = protected_prefix

    def name(self) -> str:
        return "sliding"

    def min_length(self) -> int:
        return self.protected_prefix + 2

    def target_len(self, length: int, target: int) -> int:
        """What memory pressure shrinks a sequence to: at most sinks plus the window."""
        return min(target, self.protected_prefix + self.window_size)

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        n_sink = min(self.protected_prefix, target_len)
        return streaming_scores(cache.num_kv_heads, cache.length, target_len, n_sink)

    def params(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "protected_prefix": self.protected_prefix}


class _QueryScored(TokenEvictionPolicy):
    """A policy scoring by the queries its observer kept: falls back to the most recent tokens
    when it has none (a sequence admitted before the policy was swapped in)."""

    def _queries(self, cache: SequenceKV, layer: int) -> torch.Tensor | None:
        obs = cache.observer
        q = None if obs is None else obs.queries.get(layer)
        if q is None or q.shape[1] >= cache.length:
            return None
        return q

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        q = self._queries(cache, layer)
        if q is None:
            return torch.arange(cache.length, dtype=torch.float32).repeat(cache.num_kv_heads, 1)
        return self._score(q, cache.keys(layer))

    def _score(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class SnapKVPolicy(_QueryScored):
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

    def _score(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return snapkv_scores(queries, keys, self.kernel_size)

    def params(self) -> dict[str, Any]:
        return {"observation_window": self.observation_window, "kernel_size": self.kernel_size}


class TOVAPolicy(_QueryScored):
    """TOVA: drop what the newest query attends to least, averaged over all heads."""

    observation_window = 1

    def name(self) -> str:
        return "tova"

    def _score(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return tova_scores(queries, keys)


class H2OPolicy(TokenEvictionPolicy):
    """H2O: heavy hitters by accumulated attention, plus the `recent_window` newest tokens.

    Args:
        recent_window: Newest tokens always kept (0: kvpress's ObservedAttentionPress exactly).
    """

    accumulate_attention = True

    def __init__(self, recent_window: int = 32) -> None:
        if recent_window < 0:
            raise ValueError("recent_window must be >= 0")
        self.recent_window = recent_window

    def name(self) -> str:
        return "h2o"

    def min_length(self) -> int:
        return self.recent_window + 2

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        obs = cache.observer
        total = None if obs is None else obs.attention_sum.get(layer)
        seen = None if obs is None else obs.seen.get(layer)
        if total is None or seen is None or total.shape[1] != cache.length:
            return torch.arange(cache.length, dtype=torch.float32).repeat(cache.num_kv_heads, 1)
        scores = observed_attention_scores(total, seen, cache.num_kv_heads)
        recent = min(self.recent_window, target_len)
        if recent > 0:
            scores = scores.clone()
            scores[:, cache.length - recent :] = scores.max() + 1
        return scores

    def params(self) -> dict[str, Any]:
        return {"recent_window": self.recent_window}


def make_token_policy(
    name: str, *, window: int = DEFAULT_EVICTION_WINDOW, **params: Any
) -> TokenEvictionPolicy:
    """The policy called `name`, with ``--eviction-window`` `window` (the sliding window) and
    its own params (e.g. ``observation_window=32`` for snapkv).

    Raises:
        ValueError: Unknown name (the message lists them) or a bad param.
    """
    try:
        if name == "none":
            return NoEvictionPolicy()
        if name == "sliding":
            return SlidingWindowPolicy(window_size=window, **params)
        if name == "snapkv":
            return SnapKVPolicy(**params)
        if name == "h2o":
            return H2OPolicy(**params)
        if name == "tova":
            return TOVAPolicy(**params)
    except TypeError as exc:
        raise ValueError(f"token eviction policy {name!r}: {exc}") from exc
    raise ValueError(f"unknown token eviction policy {name!r}; choose one of {', '.join(TOKEN_POLICY_NAMES)}")
