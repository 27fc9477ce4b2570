"""What one forward of the decoder indexes, built once and shared by every layer: the new tokens'
positions and pool slots, each sequence's key slots, and the padded batch's query rows and mask.

`engine_adapter.model.decoder` builds a `_StepIndex` per forward; `engine_adapter.model.graphs`
builds its static decode step's from the same helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine_adapter.model.observer import AttentionObserver

if TYPE_CHECKING:
    from engine_adapter.model.kv_pool import PagedKVPool

__all__: list[str] = []


def _context_kv(
    pool: PagedKVPool, layer: int, step: _StepIndex, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every key and value the batch attends to, ``[B, kv_heads, L, D]`` each, in `dtype`.

    One sequence whose slots are one ascending run of the pool (a fresh sequence's blocks come
    off the allocator in order) reads a view of the pool: no copy. Otherwise the slots are
    gathered; index_select of whole rows is several times faster than advanced indexing on CPU.
    """
    kv_heads, head_dim = pool.num_kv_heads, pool.head_dim
    k_flat, v_flat = pool.flat(layer)
    if step.kv_run is not None:
        lo, hi = step.kv_run
        k_ctx, v_ctx = k_flat[lo:hi].unsqueeze(0), v_flat[lo:hi].unsqueeze(0)
    else:
        assert step.kv_slots is not None  # set whenever fresh_single is False
        padded = (*step.kv_slots.shape, kv_heads, head_dim)
        slots = step.kv_slots.view(-1)
        k_ctx = k_flat.index_select(0, slots).view(padded)
        v_ctx = v_flat.index_select(0, slots).view(padded)
    # [B, L, kv_heads, D] -> [B, kv_heads, L, D]; a K/V dtype other than the model's is cast here.
    return k_ctx.transpose(1, 2).to(dtype), v_ctx.transpose(1, 2).to(dtype)


@dataclass(slots=True)
class _StepIndex:
    """Index tensors of one forward, built once and shared by every layer.

    The attention pads the batch: sequence b's queries are rows ``q_index[b]`` of the flat new
    tokens (padded to the longest slice), its keys are pool slots ``kv_slots[b]`` (padded to the
    longest context; past its end they repeat its first slot), and ``mask[b, 0, i, j]`` lets
    query i see key j when ``j <= position(i)``. Padded query rows see key 0 only (a real key of
    every sequence: no all-masked row, no NaN) and are dropped by ``q_unpad``.
    """

    input_ids: torch.Tensor  # [T]
    cos: torch.Tensor  # [T, D]
    sin: torch.Tensor
    slots: torch.Tensor  # [T] pool slots of the new tokens
    last_index: torch.Tensor  # [B] row of each sequence's last new token
    fresh_single: bool
    kv_slots: torch.Tensor | None = None  # [B, L]
    kv_run: tuple[int, int] | None = None  # B == 1 and kv_slots == range(lo, hi): read a view
    q_index: torch.Tensor | None = None  # [B, Tq]
    q_unpad: torch.Tensor | None = None  # [T] rows of the padded [B * Tq] output, or None if unpadded
    mask: torch.Tensor | None = None  # [B, 1, Tq, L] bool, or None when every query sees every key
    # (batch row, observer, first flat row, new tokens, start) of each observed sequence
    observed: list[tuple[int, AttentionObserver, int, int, int]] = field(default_factory=list)
    key_masks: torch.Tensor | None = None  # [layers, B, heads, 1, L] bool: keys not padding
    # batch-invariant attention (Decoder.batch_invariant): each sequence's start and new tokens,
    # int64 [B] each, beside kv_slots; None: SDPA over the padded batch
    invariant: tuple[torch.Tensor, torch.Tensor] | None = None


def _key_slots(
    block_tables: list[list[int]],
    starts: list[int],
    lengths: list[int],
    block_size: int,
    width: int | None = None,
) -> torch.Tensor:
    """Pool slots of positions ``0..L-1`` of every sequence, ``[B, L]``, L the longest context
    (or `width`, at least that: the static decode step's context bucket)."""
    totals = [s + n for s, n in zip(starts, lengths, strict=True)]
    max_total = max(totals) if width is None else width
    max_blocks = -(-max_total // block_size)
    # Through numpy: torch.tensor of nested lists is ~5x slower (0.5 ms at 64 x 34 blocks).
    rows = [list(t[:max_blocks]) + [0] * (max_blocks - min(len(t), max_blocks)) for t in block_tables]
    tables = torch.from_numpy(np.array(rows, dtype=np.int64))
    in_block = torch.arange(block_size, dtype=torch.long)
    kv_slots = (tables[:, :, None] * block_size + in_block).view(len(rows), -1)[:, :max_total]
    key_pos = torch.arange(max_total, dtype=torch.long)
    # Keys past a sequence's end are masked, but 0 * NaN is NaN: point them at its own first
    # token, never at stale slots that another (perhaps diverged) sequence wrote.
    past_end = key_pos[None, :] >= torch.tensor(totals)[:, None]
    return torch.where(past_end, kv_slots[:, :1], kv_slots)


def _new_token_slots(
    kv_slots: torch.Tensor, starts: list[int], lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``[T]`` of the new tokens and their pool slots ``[T]`` (rows of `kv_slots`)."""
    positions = torch.cat(
        [torch.arange(s, s + n, dtype=torch.long) for s, n in zip(starts, lengths, strict=True)]
    )
    seq_of_token = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return positions, kv_slots.reshape(-1)[seq_of_token * kv_slots.shape[1] + positions]


def _add_padded_attention(
    step: _StepIndex, kv_slots: torch.Tensor, starts: list[int], lengths: list[int], device: torch.device
) -> None:
    """Fill the padded-batch fields of `step`: key slots, query rows, unpadding rows and the mask."""
    lengths_t, starts_t = torch.tensor(lengths), torch.tensor(starts)
    max_new, max_total = max(lengths), kv_slots.shape[1]
    first = lengths_t.cumsum(0) - lengths_t  # row of each sequence's first new token
    j = torch.arange(max_new)
    valid = j[None, :] < lengths_t[:, None]  # [B, Tq]
    step.kv_slots = kv_slots.to(device)
    if len(lengths) == 1:
        first_slot, count = int(kv_slots[0, 0]), kv_slots.shape[1]
        if bool((kv_slots[0] == torch.arange(first_slot, first_slot + count)).all()):
            step.kv_run = (first_slot, first_slot + count)
    step.q_index = torch.where(valid, first[:, None] + j[None, :], first[:, None]).to(device)
    if max_new > 1:
        step.q_unpad = valid.view(-1).nonzero().squeeze(1).to(device)
    uniform_decode = max_new == 1 and all(s + n == max_total for s, n in zip(starts, lengths, strict=True))
    if not uniform_decode:
        key_pos = torch.arange(max_total, dtype=torch.long)
        q_pos = torch.where(valid, starts_t[:, None] + j[None, :], 0)  # [B, Tq]
        step.mask = (key_pos[None, None, :] <= q_pos[:, :, None]).unsqueeze(1).to(device)
