"""`AttentionObserver`: what token-level eviction reads from a sequence's attention as the
decoder's layers run (`engine_adapter.model.decoder` feeds it; re-exported there)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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

    Attributes:
        queries: layer -> ``[heads, <= window, head_dim]``, oldest first.
        attention_sum: layer -> ``[heads, L]`` float32, L the keys in the pool.
        seen: layer -> ``[heads, L]`` float32: queries that attended to each key.
    """

    window: int = 0
    accumulate: bool = False
    chunk: int = 256
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    attention_sum: dict[int, torch.Tensor] = field(default_factory=dict)
    seen: dict[int, torch.Tensor] = field(default_factory=dict)

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
