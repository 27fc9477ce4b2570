"""Greedy generation of one sequence with its prompt compressed once after prefill (as kvpress
does), straight on a decoder and its pool: the kvpress differential tests and the quality
benchmark use it; the engine does the same through its scheduler.

Query-aware: the whole prompt (context and question) is prefilled and compressed, the first
token comes from the uncompressed prefill. Query-agnostic (kvpress's pipeline): the context is
prefilled and compressed first, then the question is prefilled on top of the compressed cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine_adapter.model.decoder import Decoder, ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["CompressedGeneration", "append_tokens", "generate_compressed", "prefill"]


@dataclass(slots=True)
class CompressedGeneration:
    """What `generate_compressed` produced and measured."""

    token_ids: list[int]
    prompt_tokens: int
    kept_tokens: int
    blocks_before: int
    blocks_after: int
    prefill_s: float
    compress_s: float


def prefill(
    decoder: Decoder, pool: PagedKVPool, ids: list[int], policy: TokenEvictionPolicy
) -> tuple[SequenceKV, torch.Tensor]:
    """Prefill `ids` into fresh blocks with the observer `policy` needs; the sequence and the
    logits of its next token."""
    table = pool.allocator.allocate(-(-len(ids) // pool.block_size))
    observer = policy.make_observer()
    out = decoder(ForwardBatch([ids], [0], [table], observers=[observer]), pool)
    return SequenceKV(pool, table, len(ids), observer=observer), out.logits[0]


def append_tokens(decoder: Decoder, pool: PagedKVPool, kv: SequenceKV, ids: list[int]) -> torch.Tensor:
    """Append `ids` to the sequence (growing its table) and return the next-token logits."""
    need = -(-(kv.length + len(ids)) // pool.block_size) - len(kv.block_table)
    if need > 0:
        kv.block_table.extend(pool.allocator.allocate(need))
    batch = ForwardBatch(
        [ids],
        [kv.length],
        [kv.block_table],
        position_offsets=[kv.position_offset],
        observers=[kv.observer],
        key_masks=None if kv.key_mask is None else [kv.key_mask],
    )
    logits: torch.Tensor = decoder(batch, pool).logits[0]
    kv.length += len(ids)
    return logits


def generate_compressed(
    decoder: Decoder,
    pool: PagedKVPool,
    context_ids: list[int],
    policy: TokenEvictionPolicy,
    compression_ratio: float,
    *,
    question_ids: list[int] | None = None,
    max_new_tokens: int = 16,
    eos_ids: frozenset[int] = frozenset(),
) -> CompressedGeneration:
    """Prefill `context_ids`, compress it by `compression_ratio`, then (query-agnostic) feed
    `question_ids` and decode greedily; the blocks are given back to the pool at the end."""
    t0 = time.perf_counter()
    kv, logits = prefill(decoder, pool, context_ids, policy)
    t1 = time.perf_counter()
    blocks_before = kv.num_blocks()
    kept = kept_for_ratio(len(context_ids), compression_ratio) if compression_ratio > 0 else len(context_ids)
    if kept < len(context_ids):
        policy.evict(kv, kept, ratio=compression_ratio)
    t2 = time.perf_counter()
    blocks_after = kv.num_blocks()
    try:
        if question_ids:
            logits = append_tokens(decoder, pool, kv, question_ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(torch.argmax(logits))
            out.append(token)
            if token in eos_ids:
                break
            logits = append_tokens(decoder, pool, kv, [token])
    finally:
        pool.allocator.free(kv.block_table)
    return CompressedGeneration(
        token_ids=out,
        prompt_tokens=len(context_ids) + len(question_ids or []),
        kept_tokens=min(kept, len(context_ids)),
        blocks_before=blocks_before,
        blocks_after=blocks_after,
        prefill_s=t1 - t0,
        compress_s=t2 - t1,
    )
