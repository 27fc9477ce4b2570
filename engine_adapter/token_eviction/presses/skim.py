"""`skim`: sage's own press. A short replay of a sample of the context tells which heads read
the whole context back and which read almost nothing; each head keeps what the replay read.

No kvpress press is both robust and cheap (issue 36). Key-salience presses (leverage, keydiff)
keep the same share of every head and fill it with the keys that stand out; among other
key-number lines they keep every number and lose which key each belongs to. KVzip replays the
whole context and prunes the lowest replay scores over every layer and head at once, and most of
what that buys is the budget it gives each head, not which tokens it picks inside one: on
SmolLM2 at ratio 0.75 a few heads keep (almost) every token, needle lines whole, and most keep
a few dozen (docs/architecture.md, "Replay presses: kvzip and skim"). Those heads are properties of the model
that any stretch of the context shows, so `skim` replays only a sample of it:

1. `replay_fraction` of the context, past the chat template's prefix and the sinks, in spans of
   `span` tokens spread evenly over it (`sampled_spans`).
2. One replay of the spans, one after the other, in KVzip's prompt ("Repeat the previous
   context exactly.", `presses.kvzip`): a key's score in a layer and KV head is the most
   attention a replay query of its group pays it (the softmax over the whole context and the
   replay), for every token of the context, replayed or not.
3. Per-head budgets (`head_budgets`): the threshold KVzip's global prune would set, estimated on
   the replayed tokens (the `ratio` quantile of their scores over every layer and head); a head's
   budget is proportional to the share of its replayed tokens above it, filled up to the kept
   total (``target_len x layers x kv heads``), each head between `n_sink` + 1 tokens and all.
4. Each head keeps its budget's highest replay scores, the sinks first.

Its cost is one forward of ``replay_fraction`` of the context (2.5 %) plus the replay prompt's
~20 tokens; KVzip's is a second prefill. Rows differ in length (`ragged_keep`); the pool pads to
the widest, which a full-budget head makes nearly the whole context, so the bytes held fall
less than a uniform press's. Where it cannot replay (`presses.kvzip.replay_missing`) it keeps
the sinks and the newest tokens in every head and says why.

Imports torch, `presses.base`, `presses.kvzip` and `SequenceKV`.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, ragged_keep, recency_scores
from engine_adapter.token_eviction.presses.kvzip import KVzipPolicy, replay_missing, replay_scores
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["SkimPolicy", "head_budgets", "sampled_spans"]


def sampled_spans(first: int, length: int, span: int, budget: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans of `span` tokens (fewer when `budget` is smaller) spread evenly
    over ``first..length-1``, disjoint and in order, covering at most `budget` tokens."""
    width = min(span, budget, length - first)
    if width < 1:
        return []
    count = max(1, budget // width)
    step = (length - first) / count
    if step < width:  # the budget covers everything past `first`
        return [(first, min(length, first + budget))]
    starts = [first + int(i * step + (step - width) / 2) for i in range(count)]
    return [(lo, lo + width) for lo in starts]


def head_budgets(
    sampled: torch.Tensor, ratio: float, target_len: int, length: int, floor: int
) -> torch.Tensor:
    """``[layers, kv_heads]`` kept counts that sum to ``target_len x layers x kv_heads``, each in
    ``[floor, length]``, proportional (as far as the bounds allow) to the share of each head's
    `sampled` ``[layers, kv_heads, S]`` scores above the `ratio` quantile of them all."""
    flat = sampled.reshape(-1).float()
    pruned = min(flat.numel(), max(1, int(flat.numel() * ratio)))
    threshold = torch.kthvalue(flat, pruned).values
    share = (sampled.float() > threshold).float().mean(dim=-1)
    total = target_len * share.numel()
    floor = min(floor, target_len)
    budget = torch.full_like(share, float(floor))
    for _ in range(share.numel()):  # water-filling: the capped heads' excess goes to the rest
        open_ = budget < length
        rest = total - float(budget.sum())
        if rest <= 0.5 or not bool(open_.any()):
            break
        weights = share * open_
        if float(weights.sum()) == 0.0:  # nothing above the threshold: share the rest evenly
            weights = open_.float()
        budget = torch.clamp(budget + weights / weights.sum() * rest, max=float(length))
    counts = budget.floor().long()
    short = total - int(counts.sum())  # the fractions floor dropped, to the largest of them
    if short > 0:
        fraction = torch.where(counts < length, budget - counts, torch.tensor(-1.0))
        counts.view(-1)[fraction.reshape(-1).topk(short).indices] += 1
    return counts


class SkimPolicy(TokenEvictionPolicy):
    """Skim: per-head budgets and scores from a replay of an evenly spread sample of the context.

    Args:
        replay_fraction: Share of the context's tokens replayed (0.025).
        span: Tokens per replayed span (24).
        n_sink: First tokens always kept (4); every head keeps at least one more.
    """

    track_tokens = True

    def __init__(self, replay_fraction: float = 0.025, span: int = 24, n_sink: int = 4) -> None:
        if not 0.0 < replay_fraction <= 1.0 or span < 1 or n_sink < 0:
            raise ValueError("replay_fraction must be in (0, 1], span >= 1 and n_sink >= 0")
        self.replay_fraction, self.span, self.n_sink = replay_fraction, span, n_sink
        self._replay = KVzipPolicy(n_sink=n_sink)  # its replay prompt per tokenizer

    def name(self) -> str:
        return "skim"

    def min_length(self) -> int:
        return self.n_sink + 2

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(min(self.n_sink, length)))

    def spans_and_ids(self, cache: SequenceKV) -> tuple[list[tuple[int, int]], list[int]] | None:
        """The replayed spans and the replay's ids (None: the context cannot be replayed)."""
        if replay_missing(cache) is not None:
            return None
        obs = cache.observer
        assert obs is not None and obs.token_ids is not None
        prompt = self._replay.prompt_for(obs.decoder.tokenizer)
        first = max(prompt.prefix_length, self.n_sink)
        budget = max(1, round(cache.length * self.replay_fraction))
        spans = sampled_spans(first, cache.length, self.span, budget)
        ids = prompt.first + prompt.suffix + [t for lo, hi in spans for t in obs.token_ids[lo:hi]]
        return (spans, ids) if spans else None

    def attention_missing(self, cache: SequenceKV) -> str | None:
        missing = replay_missing(cache)
        if missing is not None:
            return missing
        planned = self.spans_and_ids(cache)
        if planned is None:
            return f"no token past the template's prefix to replay in {cache.length}"
        return replay_missing(cache, len(planned[1]))

    def all_scores(self, cache: SequenceKV) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """``[layers, kv_heads, L]`` replay scores (recency when it cannot replay), the sinks
        above all, and the replayed spans (none without a replay)."""
        planned = None if self.attention_missing(cache) is not None else self.spans_and_ids(cache)
        spans: list[tuple[int, int]] = []
        if planned is None:
            recency = recency_scores(cache.num_kv_heads, cache.length, self.n_sink)
            scores = recency[None].repeat(cache.num_layers, 1, 1).to(cache.pool.dtype)
        else:
            spans, ids = planned
            scores = replay_scores(cache, [(0, cache.length, ids)], n_sink=0)
        scores[..., : self.n_sink] = scores.amax() + 1.0
        return scores, spans

    def scores(self, cache: SequenceKV, layer: int, target_len: int) -> torch.Tensor:
        # One replay scores every layer (and sets every head's budget, `select`); a caller
        # asking one layer (the contract tests) gets that layer of the whole.
        return self.all_scores(cache)[0][layer]

    def select(self, cache: SequenceKV, target_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        scores, spans = self.all_scores(cache)
        layers, heads, length = scores.shape
        if spans:
            sampled = scores[..., torch.cat([torch.arange(lo, hi) for lo, hi in spans])]
            ratio = self.compression_ratio(length, target_len)
            counts = head_budgets(sampled, ratio, target_len, length, self.n_sink + 1)
        else:
            counts = torch.full((layers, heads), target_len, dtype=torch.long)
        order = scores.argsort(dim=-1, descending=True, stable=True)
        rows = [[order[la, h, : int(counts[la, h])] for h in range(heads)] for la in range(layers)]
        keep, kept = ragged_keep(rows)
        return keep, (None if bool((kept == target_len).all()) else kept)

    def keep_indices(self, cache: SequenceKV, target_len: int) -> torch.Tensor:
        raise NotImplementedError("skim keeps a different count per layer and head: use select")

    def params(self) -> dict[str, Any]:
        return {"replay_fraction": self.replay_fraction, "span": self.span, "n_sink": self.n_sink}
