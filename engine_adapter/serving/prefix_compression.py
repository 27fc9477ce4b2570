"""Compress on evict, the engine's half: run the cache core's `CompressMove`s on the pool, and
set up a sequence admitted on a compressed prefix (docs/architecture.md, "Compress on evict").

The cache core (torch-free) decides which chain is compressed and which blocks it keeps; the
press runs here, on the engine thread, before the forward pass of the step that decided it (the
chain's spare blocks are free already and that forward may write them). A move is compacted as
a `SequenceKV` over the chain's blocks whose new table is the move's `dst`: the kept tokens keep
their original RoPE rotation (positions), as token-level compaction keeps them.

Only query-agnostic presses run here: a cached prefix has no query to score by (no observer
window, no accumulated attention); presses that undo RoPE (leverage) get the chain's positions,
and budget wrappers (head-varying counts) are refused, since a hit's padding is derived from
the kept count alone. Imports torch, the cache's records, the pool and token-level eviction.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

import torch

from engine_adapter.cache.compressed import CompressMove, CompressSpec
from engine_adapter.cache.records import Allocation
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.layers import RotaryEmbedding
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.registry import token_policy_from_spec
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["PrefixCompressor", "compress_press"]


def compress_press(spec: CompressSpec) -> TokenEvictionPolicy:
    """The press `spec` names, built and checked to be query-agnostic.

    Raises:
        ValueError: One line: an unknown press or param, a press that scores by queries or
            attention, or a budget wrapper.
    """
    policy = token_policy_from_spec(spec.press)
    if policy.wraps_press:
        raise ValueError(f"compress-on-evict press {spec.press!r} is a budget wrapper: give a press itself")
    if policy.observation_window > 0 or policy.accumulate_attention or _needs_queries(policy):
        raise ValueError(
            f"compress-on-evict press {spec.press!r} scores by queries or attention, which a cached "
            "prefix has none of: use a query-agnostic press (knorm, keydiff, leverage)"
        )
    return policy


def _needs_queries(policy: TokenEvictionPolicy) -> bool:
    observer = policy.make_observer()
    return observer is not None and observer.window != 0


class PrefixCompressor:
    """Runs compress moves on the pool.

    Args:
        pool: The paged pool.
        spec: The press and ratio (`--compress-on-evict`).
        rotary: The decoder's rotary embedding (for the presses that undo RoPE).

    Attributes:
        moves: Moves run; `seconds` the time they took.
        kept_positions: Per compressed prefix (its name), the original positions of the tokens
            it kept, ``[layers, kv_heads, kept]``: a partial hit masks those past its match.
    """

    def __init__(self, pool: PagedKVPool, spec: CompressSpec, rotary: RotaryEmbedding | None) -> None:
        self.pool = pool
        self.spec = spec
        self.policy = compress_press(spec)
        self.rotary = rotary
        self.moves = 0
        self.seconds = 0.0
        self.kept_positions: dict[Hashable, torch.Tensor] = {}

    def run(self, moves: list[CompressMove]) -> None:
        """Compact each move's chain into its kept blocks, in order."""
        t = time.perf_counter()
        for move in moves:
            self._run_one(move)
        self.moves += len(moves)
        self.seconds += time.perf_counter() - t

    def _run_one(self, move: CompressMove) -> None:
        n = len(move.src) * self.pool.block_size
        observer = self.policy.make_observer()
        if observer is not None:  # positions only (`compress_press`): the chain's, from its start
            observer.rotary = self.rotary
            positions = torch.arange(move.start, move.start + n, device=self.pool.device)
            observer.note_positions(positions, 0)
        kv = SequenceKV(
            self.pool,
            list(move.src),
            n,
            position_offset=move.start,
            observer=observer,
            reallocate=lambda _n: list(move.dst),
        )
        self.policy.ratio = self.spec.ratio  # as `TokenEvictionPolicy.evict` sets it
        try:
            keep, counts = self.policy.select(kv, move.kept)
        finally:
            self.policy.ratio = None
        kv.compact(keep, counts)  # uniform counts: `compress_press` refused the wrappers
        self.kept_positions[move.key] = (keep + move.start).cpu()

    def prune(self, live: set[Hashable]) -> None:
        """Forget the kept positions of prefixes the cache core no longer holds."""
        for key in [k for k in self.kept_positions if k not in live]:
            del self.kept_positions[key]

    def hit_mask(self, alloc: Allocation, layers: int, kv_heads: int) -> torch.Tensor:
        """The key mask of a sequence admitted on a compressed prefix (`alloc`): every cache
        index up to the end of the prefix's blocks is real, except the padding after its kept
        tokens and, on a partial hit, the kept tokens at or past the end of the match."""
        assert alloc.compressed_key is not None
        bs = self.pool.block_size
        entry_start = alloc.num_cached_tokens - alloc.num_compressed_tokens
        end = entry_start + alloc.num_compressed_blocks * bs
        mask = torch.ones((layers, kv_heads, end), dtype=torch.bool)
        kept = self.kept_positions[alloc.compressed_key]
        mask[..., entry_start + kept.shape[-1] :] = False
        mask[..., entry_start : entry_start + kept.shape[-1]] = kept < alloc.num_cached_tokens
        return mask
