"""Batch-invariant paged attention: each new token attends to exactly its own sequence's keys in
the pool, reduced in key order, so its output never depends on the rest of the batch
(`engine_adapter.model.invariance` has the whole account; docs/concepts/exactness.md).

`paged_attention` runs the compiled kernel (engine_adapter/model/_attention.pyx) and falls back to
`rowwise_attention`, its pure-torch twin, where the core is not built (or `SAGE_PURE_PYTHON=1`);
tests/test_batch_invariance.py holds the two equal.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from sage_eviction import native

if TYPE_CHECKING:
    from engine_adapter.model.kv_pool import PagedKVPool

__all__ = ["KV_DTYPE_CODES", "attention_kernel", "paged_attention", "rowwise_attention"]

ATTENTION_MODULE = "engine_adapter.model._attention"
KV_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The K/V dtypes the compiled kernel reads (widened to float32 exactly)."""


def attention_kernel() -> str:
    """Which invariant attention runs: ``compiled`` or ``rowwise`` (with why)."""
    if native.load(ATTENTION_MODULE) is None:
        return f"rowwise ({native.implementation(ATTENTION_MODULE)})"
    return "compiled"


def paged_attention(
    q: torch.Tensor,
    pool: PagedKVPool,
    layer: int,
    key_slots: torch.Tensor,
    starts: torch.Tensor,
    lengths: torch.Tensor,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """Each new token's attention over its own sequence's keys ``0..position``: ``[T, heads * D]``
    in q's dtype, bit for bit the same whatever else is in the batch.

    Args:
        q: ``[T, heads, D]``, the batch's rotated queries, sequence by sequence.
        pool: The pool the keys and values of this step were already written to.
        layer: The layer whose K/V to read.
        key_slots: ``[B, L]`` int64: the pool slot of every position of every sequence.
        starts: ``[B]`` int64: each sequence's first new position.
        lengths: ``[B]`` int64: each sequence's new tokens.
        keep: None, or ``[B, heads, L]`` bool: False where a key is compaction padding.
    """
    kernel = native.load(ATTENTION_MODULE)
    k_flat, v_flat = pool.flat(layer)
    if kernel is None or pool.dtype not in KV_DTYPE_CODES:
        return rowwise_attention(q, k_flat, v_flat, key_slots, starts, lengths, keep)
    queries = q.float().contiguous()
    out = torch.empty_like(queries)
    kernel.paged_attention(
        queries.numpy(),
        k_flat.data_ptr(),
        v_flat.data_ptr(),
        KV_DTYPE_CODES[pool.dtype],
        pool.num_kv_heads,
        key_slots.numpy(),
        starts.numpy(),
        lengths.numpy(),
        None if keep is None else keep.to(torch.uint8).contiguous().numpy(),
        1.0 / math.sqrt(q.shape[-1]),
        out.numpy(),
    )
    return out.to(q.dtype).view(q.shape[0], -1)


def rowwise_attention(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    key_slots: torch.Tensor,
    starts: torch.Tensor,
    lengths: torch.Tensor,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """`paged_attention` in torch, without the compiled kernel: one SDPA call per row over
    exactly its keys (shape fixed by the row's position alone), in float32. Slow; exact."""
    heads = q.shape[1]
    rows: list[torch.Tensor] = []
    first = 0
    for b, (start, count) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        for i in range(count):
            last = start + i
            slots = key_slots[b, : last + 1]
            k = k_flat.index_select(0, slots).float().transpose(0, 1).unsqueeze(0)
            v = v_flat.index_select(0, slots).float().transpose(0, 1).unsqueeze(0)
            mask = None if keep is None else keep[b, :, : last + 1].view(1, heads, 1, last + 1)
            query = q[first + i].float().view(1, heads, 1, -1)
            rows.append(
                F.scaled_dot_product_attention(query, k, v, attn_mask=mask, enable_gqa=True).view(1, -1)
            )
        first += count
    return torch.cat(rows).to(q.dtype)
