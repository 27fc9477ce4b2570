"""`AttentionObserver`: what token-level eviction reads from a sequence's attention as the
decoder's layers run (`engine_adapter.model.decoder` feeds it; re-exported there)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["AttentionObserver"]


@dataclass(eq=False)
class AttentionObserver:
    """What token-level eviction needs from one sequence's attention, collected as the layers run.

    Scoring tokens by attention must not materialise ``T x T`` matrices for a long prompt, so
    the attention layer hands over only what a policy asks for:

    - ``window > 0``: the rotated queries of the sequence's last `window` tokens per layer
      (SnapKV's observation window, TOVA's last query); the scores are computed later against
      the keys in the pool, ``window x T`` per head.
    - ``accumulate``: per layer and query head, the attention each key received summed over
      every query that saw it, and how many queries saw it (H2O's accumulated attention),
      computed in query chunks of `chunk` rows.
    - ``track_positions``: the RoPE position of every key in cache order and the decoder's
      `rotary` (set by the decoder), so that a press can undo the rotation of keys and queries
      exactly (leverage, compactor, expected attention score pre-RoPE vectors) and rotate to
      future positions. Compaction gathers the positions with the keys, per layer and KV head.
    - ``track_tokens``: the token id of every cache index and the `decoder` that ran them (set
      by the decoder, as `rotary` is), for a press that replays the context through the model
      (kvzip). The press runs the decoder where compression runs, on the engine's thread, so
      the model keeps one owner.

    Attributes:
        queries: layer -> ``[heads, <= window, head_dim]``, oldest first.
        attention_sum: layer -> ``[heads, L]`` float32, L the keys in the pool.
        seen: layer -> ``[heads, L]`` float32: queries that attended to each key.
        positions: ``[P, L]`` int64 RoPE positions of the keys in cache order: P = 1 while
            every layer and head holds the same tokens, ``layers * kv_heads`` (row
            ``layer * kv_heads + head``) once a compaction kept different ones; None when
            positions are not tracked or the observer missed some tokens.
        rotary: The decoder's rotary embedding (``cos_sin(positions, dtype)``), or None.
        queries_from: RoPE position of the first token this observer saw (its first query).
        next_position: RoPE position of the next token: every token seen has one below it.
        token_ids: The token id of each cache index while they are all known (tracked, seen
            from index 0, never compacted); else None.
        decoder: The decoder that ran the sequence (`track_tokens`), or None.
    """

    window: int = 0
    accumulate: bool = False
    chunk: int = 256
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    attention_sum: dict[int, torch.Tensor] = field(default_factory=dict)
    seen: dict[int, torch.Tensor] = field(default_factory=dict)
    track_positions: bool = False
    positions: torch.Tensor | None = None
    rotary: Any = None
    queries_from: int | None = None
    next_position: int = 0
    track_tokens: bool = False
    token_ids: list[int] | None = None
    decoder: Any = None

    def note_positions(self, positions: torch.Tensor, start: int) -> None:
        """The new tokens at cache indices ``start..`` have RoPE `positions` ``[n]`` (called once
        per forward, before the layers run). The first call may start past a cached prefix: an
        observer is made when its sequence is admitted, before any compaction, so the prefix
        holds positions ``0..start-1``. A later gap (tokens never seen) forgets them all."""
        if not self.track_positions or positions.numel() == 0:
            return
        new = positions.to(torch.long)
        old = self.positions
        if self.queries_from is None:  # the first tokens this observer sees
            prefix = torch.arange(start, device=new.device, dtype=torch.long)
            self.positions = torch.cat((prefix, new))[None]
            self.queries_from = int(new[0])
        elif old is not None and old.shape[1] == start:
            self.positions = torch.cat((old, new.to(old.device)[None].expand(old.shape[0], -1)), dim=1)
        else:
            self.positions = None
        self.next_position = int(new[-1]) + 1

    def note_forward(self, decoder: Any, ids: Sequence[int], positions: torch.Tensor, start: int) -> None:
        """A forward of `decoder` runs the new tokens `ids` at cache indices ``start..`` with
        RoPE `positions` (called once per forward, before the layers run): what is tracked."""
        if self.track_tokens:
            self.decoder = decoder
            self.note_tokens(list(ids), start)
        if self.track_positions:
            self.rotary = decoder.rotary
            self.note_positions(positions, start)

    def note_tokens(self, ids: list[int], start: int) -> None:
        """The new tokens `ids` sit at cache indices ``start..``: the ids of every cache index
        stay known while the sequence grows from index 0 without a gap (a compaction, or a
        cached prefix the observer never saw, loses them)."""
        if not self.track_tokens:
            return
        if start == 0 and self.token_ids is None:
            self.token_ids = list(ids)
        elif self.token_ids is not None and len(self.token_ids) == start:
            self.token_ids.extend(ids)
        else:
            self.token_ids = None

    def positions_of(self, layer: int, kv_heads: int, length: int) -> torch.Tensor | None:
        """RoPE positions ``[kv_heads, length]`` of layer `layer`'s keys, or None when unknown."""
        pos = self.positions
        if pos is None or pos.shape[1] != length:
            return None
        if pos.shape[0] == 1:
            return pos.expand(kv_heads, -1)
        return pos[layer * kv_heads : (layer + 1) * kv_heads]

    def compact_positions(self, keep: torch.Tensor) -> None:
        """Keep the positions of cache indices `keep` ``[layers, kv_heads, n]``."""
        pos = self.positions
        if pos is None:
            return
        layers, kv_heads, n = keep.shape
        rows = pos.expand(layers * kv_heads, -1) if pos.shape[0] == 1 else pos
        self.positions = rows.gather(1, keep.reshape(layers * kv_heads, n).to(rows.device))

    def observe(self, layer: int, q: torch.Tensor, keys: torch.Tensor, start: int) -> None:
        """Record `q` ``[n, heads, D]`` (the new queries, cache indices ``start..start+n-1``)
        against `keys` ``[kv_heads, start + n, D]`` (every key of the sequence, in cache order)."""
        if self.window > 0:
            new = q.transpose(0, 1)[:, -self.window :]
            old = self.queries.get(layer)
            both = new if old is None else torch.cat((old, new), dim=1)
            self.queries[layer] = both[:, -self.window :].contiguous()
        if self.accumulate:
            self._accumulate(layer, q, keys, start)

    def _accumulate(self, layer: int, q: torch.Tensor, keys: torch.Tensor, start: int) -> None:
        n, heads, dim = q.shape
        total = keys.shape[1]
        groups = heads // keys.shape[0]
        k = keys.float().repeat_interleave(groups, dim=0)  # [heads, L, D]
        acc = torch.zeros(heads, total, dtype=torch.float32, device=q.device)
        key_index = torch.arange(total, device=q.device)
        for lo in range(0, n, self.chunk):
            hi = min(n, lo + self.chunk)
            qc = q[lo:hi].float().transpose(0, 1)  # [heads, c, D]
            w = torch.matmul(qc, k.transpose(1, 2)) / math.sqrt(dim)
            q_index = torch.arange(start + lo, start + hi, device=q.device)
            w = w.masked_fill(key_index[None, None, :] > q_index[None, :, None], float("-inf"))
            acc += torch.softmax(w, dim=-1).sum(dim=1)
        # Key j is seen by the new queries at cache indices >= j.
        seen_new = (start + n - torch.maximum(key_index, torch.tensor(start, device=q.device))).clamp(min=0)
        seen_new = seen_new.float()[None, :].expand(heads, -1)
        old_sum, old_seen = self.attention_sum.get(layer), self.seen.get(layer)
        if old_sum is not None and old_seen is not None:
            kept = old_sum.shape[1]
            acc[:, :kept] += old_sum
            seen_new = seen_new.clone()
            seen_new[:, :kept] += old_seen
        self.attention_sum[layer] = acc
        self.seen[layer] = seen_new.contiguous()
