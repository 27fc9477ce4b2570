"""`skim`: sage's own press. Leverage finds what stands out; a short replay of only those
passages decides which of their tokens the model reads back.

No kvpress press is both robust and cheap (docs/token_eviction.md, "skim"). Leverage (keys
that stand out of the layer's key geometry) is cheap and keeps a lone needle, but among other
key-number lines it keeps the numbers and loses which key each belongs to. KVzip replays the
whole context and keeps what the reconstruction reads, which holds on both tasks, at the cost
of a second prefill. `skim` replays only the passages around the tokens leverage ranks highest:

1. Leverage per layer and KV head (`presses.leverage`, z-scored), averaged over layers and
   heads into one salience per token.
2. Spans of `span` tokens centred on the most salient tokens (past the chat template's prefix
   and the sinks), merged, until they cover `replay_fraction` of the context.
3. One replay ("Repeat the previous context exactly." in the chat template, then the spans
   one after the other) through the decoder, as KVzip's (`presses.kvzip`); a key's replay score
   is the most attention any replay query of its group pays it, the softmax over the whole
   context and the replay.
4. Score = leverage z-score + `weight` x replay score: what the replay reads (attention near 1
   on a token it copies) outranks any leverage, and leverage orders the rest. The sinks first.

Every layer and head keeps the same count (the pool frees whole blocks). The cost is leverage's
plus a forward of ``replay_fraction`` of the context's tokens (a prefill's worth for KVzip).
Where it cannot replay (`presses.kvzip.replay_missing`) it falls back to leverage alone.

Imports torch, `presses.base`, `presses.kvzip`, `presses.leverage` and `SequenceKV`.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, top_kept
from engine_adapter.token_eviction.presses.kvzip import KVzipPolicy, replay_missing, replay_scores
from engine_adapter.token_eviction.presses.leverage import LeveragePolicy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["SkimPolicy", "salient_spans"]


def salient_spans(salience: torch.Tensor, first: int, span: int, budget: int) -> list[tuple[int, int]]:
    """Merged ``[start, end)`` spans of about `span` tokens centred on the most salient tokens
    at or past `first`, in context order, covering at most `budget` tokens."""
    length = salience.shape[0]
    covered = torch.zeros(length, dtype=torch.bool)
    total = 0
    for p in salience[first:].argsort(descending=True).tolist():
        centre = p + first
        if covered[centre]:
            continue
        lo, hi = max(first, centre - span // 2), min(length, centre + span - span // 2)
        new = int((~covered[lo:hi]).sum())
        if total + new > budget:
            break
        covered[lo:hi] = True
        total += new
    edges = torch.diff(covered.int(), prepend=torch.tensor([0]), append=torch.tensor([0]))
    starts, ends = (edges == 1).nonzero().squeeze(1), (edges == -1).nonzero().squeeze(1)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


class SkimPolicy(TokenEvictionPolicy):
    """Skim: leverage, with a replay of the salient passages deciding what of them is read.

    Args:
        replay_fraction: Share of the context's tokens replayed (0.05).
        span: Tokens per replayed passage around a salient token (24).
        weight: How far a replayed read outranks leverage (10: attention 0.3 outweighs three
            standard deviations of leverage).
        n_sink: First tokens always kept (4).
        sketch_dimension: Leverage's sketch columns (48).
        seed: Leverage's sketch seed (0).
    """

    track_positions = True
    track_tokens = True

    def __init__(
        self,
        replay_fraction: float = 0.05,
        span: int = 24,
        weight: float = 10.0,
        n_sink: int = 4,
        sketch_dimension: int = 48,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= replay_fraction <= 1.0 or span < 1 or weight < 0 or n_sink < 0:
            raise ValueError("replay_fraction must be in [0, 1], span >= 1, weight >= 0 and n_sink >= 0")
        self.replay_fraction, self.span, self.weight = replay_fraction, span, weight
        self.leverage = LeveragePolicy(sketch_dimension=sketch_dimension, seed=seed)
        self._replay = KVzipPolicy(n_sink=n_sink)  # its replay prompt per tokenizer
        self.n_sink = n_sink

    def name(self) -> str:
        return "skim"

    def min_length(self) -> int:
        return self.n_sink + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(min(self.n_sink, length))) if target_len > self.n_sink else []

    def attention_missing(self, cache: SequenceKV) -> str | None:
        # Without a replay it still scores by leverage: only leverage's needs make it fall back.
        return self.leverage.attention_missing(cache)

    def replay(self, cache: SequenceKV, leverage: list[torch.Tensor]) -> torch.Tensor | None:
        """``[layers, kv_heads, L]`` replay scores of the salient spans (None: no replay)."""
        budget = int(cache.length * self.replay_fraction)
        if budget < 1 or replay_missing(cache) is not None:
            return None
        obs = cache.observer
        assert obs is not None and obs.token_ids is not None
        prompt = self._replay.prompt_for(obs.decoder.tokenizer)
        salience = torch.stack(leverage).mean(dim=(0, 1)).float().cpu()
        spans = salient_spans(salience, max(prompt.prefix_length, self.n_sink), self.span, budget)
        ids = prompt.first + prompt.suffix + [t for lo, hi in spans for t in obs.token_ids[lo:hi]]
        if not spans or replay_missing(cache, len(ids)) is not None:
            return None
        return replay_scores(cache, [(0, cache.length, ids)], n_sink=0)

    def layer_scores(self, cache: SequenceKV, target_len: int) -> list[torch.Tensor]:
        leverage = self.leverage.layer_scores(cache, target_len)
        replayed = self.replay(cache, leverage)
        scores = []
        for layer, lev in enumerate(leverage):
            s = lev if replayed is None else lev + self.weight * replayed[layer].to(lev.device)
            s = s.clone()
            s[:, : self.n_sink] = s.max() + 1
            scores.append(s)
        return scores

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        # One replay serves every layer, so the layers are scored together (`layer_scores`); a
        # caller asking one layer (the contract tests) gets that layer of the whole.
        return self.layer_scores(cache, target_len)[layer]

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        return torch.stack([top_kept(s, target_len) for s in self.layer_scores(cache, target_len)])

    def params(self) -> dict[str, Any]:
        return {
            "replay_fraction": self.replay_fraction,
            "span": self.span,
            "weight": self.weight,
            "n_sink": self.n_sink,
            **self.leverage.params(),
        }
