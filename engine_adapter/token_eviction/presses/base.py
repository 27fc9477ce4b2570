"""What every token-level policy shares: the spec's interface, the kept count, and attention helpers.

`TokenEvictionPolicy` is spec 002's ``EvictionPolicy`` for one sequence's tokens
(``should_evict(cache, mem_available)``, ``evict(cache, target_len)``, ``name()``); a policy
gives `scores` ``[kv_heads, L]`` (higher is kept) and the base keeps the `top_kept` per layer
and KV head. A policy that scores by attention keeps the newest tokens instead when the
sequence's observer saw nothing to score by (`recency_scores`), and says why in
`attention_missing`, which the caller logs and counts (`TokenCacheManager`).
`QueryScoredPolicy` is the base of the policies that score by the queries the decoder's
`AttentionObserver` kept (SnapKV, TOVA). The kept count is kvpress's
``max(1, int(L * (1 - compression_ratio)))`` (`kept_for_ratio`), the same for every layer and head.

Imports torch, the decoder's `AttentionObserver` and `SequenceKV`; nothing of the registry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch

from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = [
    "QueryScoredPolicy",
    "TokenEvictionPolicy",
    "kept_for_ratio",
    "ragged_keep",
    "recency_scores",
    "top_kept",
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


def ragged_keep(rows: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer and KV head kept indices of different counts as one padded ``[layers,
    kv_heads, M]`` tensor (each row ascending, padded by repeating its last index) and the counts
    ``[layers, kv_heads]``."""
    counts = torch.tensor([[len(r) for r in layer] for layer in rows], dtype=torch.long)
    width = int(counts.max())
    padded = [
        [torch.cat([r.sort().values, r.sort().values[-1:].expand(width - len(r))]) for r in layer]
        for layer in rows
    ]
    return torch.stack([torch.stack(layer) for layer in padded]), counts


def recency_scores(kv_heads: int, length: int, sinks: int = 0) -> torch.Tensor:
    """``[kv_heads, L]`` scores that keep the newest tokens (and the `sinks` first ones): what a
    policy falls back to when its observer saw nothing (a sequence admitted before the policy
    was swapped in)."""
    scores = torch.arange(length, dtype=torch.float32).repeat(kv_heads, 1)
    scores[:, : min(sinks, length)] = length
    return scores


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


def check_wrappable(wrapper: str, press: TokenEvictionPolicy) -> None:
    """Refuse what a budget wrapper (adakv, pyramid) cannot share its budget over: another
    wrapper, or a replay press (kvzip, skim), whose scores come from a replay of the context the
    wrappers do not run, and which keeps its own per-head counts (kvzip) already.

    Raises:
        ValueError: The reason, naming the press.
    """
    if getattr(press, "wraps_press", False):
        raise ValueError(f"{wrapper} cannot wrap another budget wrapper ({press.name()})")
    if press.track_tokens:
        raise ValueError(f"{wrapper} cannot wrap a replay press ({press.name()}): use it on its own")


class TokenEvictionPolicy(ABC):
    """The spec's ``EvictionPolicy`` for one sequence's tokens.

    Subclasses give `scores` (or override `keep_indices`); `evict` compacts the sequence in the
    pool. A policy keeps no per-sequence state: what it scores by lives in the sequence's
    `AttentionObserver` (made by `make_observer`), so one policy serves every sequence and can be
    swapped between two steps.

    Attributes:
        observation_window: Newest queries per layer the observer keeps for the policy (0: none).
        accumulate_attention: Whether the observer sums the attention each key received.
        track_positions: Whether the observer tracks the keys' RoPE positions (the presses
            that undo the rotation, `presses.rope`).
        track_tokens: Whether the observer tracks the token ids and the decoder (the presses
            that replay the context through the model, `presses.kvzip`).
        wraps_press: A budget wrapper (adakv, pyramid): its ``press`` param is another
            policy, which the registry builds from a name (`default_press` when none is given).
        window_param: The constructor param that takes the engine's ``--eviction-window``
            (`make_token_policy`'s `window`), or None when the policy has no such window.
    """

    observation_window: int = 0
    accumulate_attention: bool = False
    track_positions: bool = False
    track_tokens: bool = False
    window_param: str | None = None
    wraps_press: bool = False
    default_press = "snapkv"  # a wrapper's press when its spec names none
    ratio: float | None = None  # set by `evict` for the duration of one compression

    @abstractmethod
    def name(self) -> str:
        """The policy's name (``--token-eviction``), the one it is registered under."""

    def min_length(self) -> int:
        """Shortest sequence it can shrink (what it always keeps, plus one)."""
        return 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        """Cache indices it keeps whatever the scores when `length` tokens shrink to
        `target_len` (attention sinks, an observation window, the newest tokens)."""
        del length, target_len
        return []

    def target_len(self, length: int, target: int) -> int:
        """What memory pressure shrinks a sequence of `length` tokens to, given the pressure's
        own `target` (a windowed policy keeps at most its window)."""
        del length
        return target

    def should_evict(self, cache: SequenceKV, mem_available: int) -> bool:
        """Whether `cache` can and should shrink with `mem_available` bytes left (the caller has
        compared that with its threshold)."""
        del mem_available
        return cache.length >= self.min_length()

    def attention_missing(self, cache: SequenceKV) -> str | None:
        """Why the attention this policy scores by is missing for `cache` now, so that it keeps
        the newest tokens instead (`recency_scores`); None when it has what it needs, or scores
        by something else."""
        del cache
        return None

    def make_observer(self) -> AttentionObserver | None:
        """What the attention must collect for this policy, per sequence (None: nothing)."""
        if not (
            self.observation_window > 0
            or self.accumulate_attention
            or self.track_positions
            or self.track_tokens
        ):
            return None
        return AttentionObserver(
            window=self.observation_window,
            accumulate=self.accumulate_attention,
            track_positions=self.track_positions,
            track_tokens=self.track_tokens,
        )

    def evict(self, cache: SequenceKV, target_len: int, *, ratio: float | None = None) -> int:
        """Compact `cache` to `target_len` tokens per layer and KV head (on average, for the
        budget wrappers); returns the cache indices the sequence gave up. `ratio`: the
        compression ratio asked for, which some presses weigh by (None: ``1 - target / L``)."""
        if target_len >= cache.length:
            return 0
        self.ratio = ratio
        try:
            keep, counts = self.select(cache, max(1, target_len))
        finally:
            self.ratio = None
        return cache.compact(keep, counts)

    def compression_ratio(self, length: int, target_len: int) -> float:
        """The ratio of the compression under way: the one `evict` was given, else
        ``1 - target / length`` (kvpress's compression_ratio truncates to the kept count, so
        the ratio itself is the more exact input where a press weighs by it)."""
        return self.ratio if self.ratio is not None else 1 - target_len / length

    def select(self, cache: SequenceKV, target_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What to keep: ``(keep, counts)``, `keep` ``[layers, kv_heads, M]`` ascending per row,
        `counts` ``[layers, kv_heads]`` how many of each row are kept (the rest is padding,
        `ragged_keep`), or None when every row keeps all M (the same budget everywhere)."""
        return self.keep_indices(cache, target_len), None

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        """Cache indices to keep, ``[layers, kv_heads, target_len]``, ascending."""
        return torch.stack([top_kept(scores, target_len) for scores in self.layer_scores(cache, target_len)])

    def layer_scores(self, cache: SequenceKV, target_len: int) -> list[torch.Tensor]:
        """Every layer's ``[kv_heads, L]`` scores, in layer order (the budget wrappers, `adakv`
        and `pyramid`, share them out over heads or layers)."""
        return [self.scores(cache, layer, target_len) for layer in range(cache.num_layers)]

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        """``[kv_heads, L]`` scores of layer `layer` (higher kept)."""
        raise NotImplementedError(f"{type(self).__name__} gives no scores")

    def params(self) -> dict[str, Any]:
        """Its parameters (for stats and logs)."""
        return {}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"


class QueryScoredPolicy(TokenEvictionPolicy):
    """A policy scoring by the queries its observer kept: falls back to the most recent tokens
    when it has none (a sequence admitted before the policy was swapped in)."""

    def _queries(self, cache: SequenceKV, layer: int) -> torch.Tensor | None:
        obs = cache.observer
        q = None if obs is None else obs.queries.get(layer)
        if q is None or q.shape[1] >= cache.length:
            return None
        return q

    def attention_missing(self, cache: SequenceKV) -> str | None:
        if cache.observer is None:
            return "no attention observer (the sequence started before this policy was set)"
        for layer in range(cache.num_layers):
            if self._queries(cache, layer) is None:
                q = cache.observer.queries.get(layer)
                if q is None:
                    return f"no queries observed at layer {layer}"
                return f"the {q.shape[1]} observed queries cover all {cache.length} tokens"
        return None

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        q = self._queries(cache, layer)
        if q is None:
            return recency_scores(cache.num_kv_heads, cache.length)
        return self.query_scores(q, cache.keys(layer))

    @abstractmethod
    def query_scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``[kv_heads, L]`` scores from the observed `queries` ``[heads, w, D]`` and the layer's
        `keys` ``[kv_heads, L, D]``."""
