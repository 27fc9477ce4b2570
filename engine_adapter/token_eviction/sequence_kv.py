"""SequenceKV: the spec's ``KVCache`` for one sequence of the paged pool, and its compaction.

A sequence's K/V live in the blocks of its block table, cache index ``i`` in slot
``table[i // block_size] * block_size + i % block_size`` of every layer. Compaction keeps
``n`` tokens per layer and KV head, gathers them (in their original order) into fresh blocks and
frees the old ones, so the sequence then holds ``ceil(n / block_size)`` blocks.

Different KV heads (and layers) may keep different tokens: a slot of the pool holds one token
per KV head (``[slots, kv_heads, head_dim]``), and after compaction cache index ``j`` of head
``h`` is simply head ``h``'s ``j``-th kept token. Attention never needs to know which: the keys
were rotated with their original RoPE positions when written, and every kept token precedes
every later one, so the causal mask over cache indices stays right. New tokens continue the
original position count through `position_offset` (``ForwardBatch.position_offsets``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.model.kv_pool import PagedKVPool

__all__ = ["CompactionRefused", "Reallocate", "SequenceKV"]


class CompactionRefused(RuntimeError):
    """The owner of the blocks would not (or could not) give a compacted sequence new blocks;
    nothing changed."""


Reallocate = Callable[[int], list[int]]
"""Give the sequence a new block table for ``n`` tokens after releasing its old blocks (the
engine's cache manager does it, `CacheManager.compact_sequence`; nothing is copied)."""


class SequenceKV:
    """One sequence's K/V in the pool: what token-level policies read and compact.

    Args:
        pool: The paged pool.
        block_table: The sequence's blocks in order.
        length: Tokens of the sequence in the pool (cache indices ``0..length-1``).
        position_offset: Tokens evicted before: the RoPE position of cache index ``length`` is
            ``length + position_offset``.
        observer: What its attention exposed for scoring (queries of the last window,
            accumulated attention), or None.
        reallocate: Releases the old blocks and returns the new table for ``n`` tokens; by
            default straight on the pool's allocator (tests, the benchmark).
        key_mask: ``[layers, kv_heads, M]`` bool, False where cache index ``j < M`` of a head
            is padding that attention must skip (a head-varying compaction); indices past M
            are all real. None: no padding.
    """

    def __init__(
        self,
        pool: PagedKVPool,
        block_table: list[int],
        length: int,
        *,
        position_offset: int = 0,
        observer: AttentionObserver | None = None,
        reallocate: Reallocate | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> None:
        if length < 0 or -(-length // pool.block_size) > len(block_table):
            raise ValueError(f"block table of {len(block_table)} blocks cannot hold {length} tokens")
        self.pool = pool
        self.block_table = list(block_table)
        self.length = length
        self.position_offset = position_offset
        self.observer = observer
        self._reallocate = reallocate
        self.key_mask = key_mask

    # ---- reading --------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self.pool.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.pool.num_kv_heads

    def num_blocks(self) -> int:
        """Blocks the sequence's tokens occupy."""
        return -(-self.length // self.pool.block_size)

    def memory_usage_bytes(self) -> int:
        """Bytes of K and V its blocks hold, all layers (the spec's ``memory_usage_bytes``)."""
        return self.num_blocks() * self.pool.bytes_per_block

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of the sequence in cache order, ``[kv_heads, length, head_dim]`` (rotated)."""
        k, _v = self.pool.gather(layer, self.block_table, self.length)
        return k.transpose(0, 1)

    def values(self, layer: int) -> torch.Tensor:
        """Values of the sequence in cache order, ``[kv_heads, length, head_dim]``."""
        _k, v = self.pool.gather(layer, self.block_table, self.length)
        return v.transpose(0, 1)

    def _slots(self) -> torch.Tensor:
        return PagedKVPool.slot_mapping(
            self.block_table, 0, self.length, self.pool.block_size, device=self.pool.device
        )

    def clone(self) -> SequenceKV:
        """A copy in fresh blocks of the pool's allocator, with a copy of the observer: one
        prefill serves several compressions (the quality benchmark compresses copies)."""
        table = self.pool.allocator.allocate(self.num_blocks())
        copy = SequenceKV(
            self.pool,
            table,
            self.length,
            position_offset=self.position_offset,
            key_mask=None if self.key_mask is None else self.key_mask.clone(),
        )
        src, dst = self._slots(), copy._slots()
        for layer in range(self.num_layers):
            k = self.pool.k_cache[layer].view(-1, self.num_kv_heads, self.pool.head_dim)
            v = self.pool.v_cache[layer].view(-1, self.num_kv_heads, self.pool.head_dim)
            self.pool.write(layer, dst, k.index_select(0, src), v.index_select(0, src))
        obs = self.observer
        if obs is not None:
            copy.observer = AttentionObserver(
                window=obs.window,
                accumulate=obs.accumulate,
                chunk=obs.chunk,
                track_positions=obs.track_positions,
                positions=None if obs.positions is None else obs.positions.clone(),
                rotary=obs.rotary,
                queries_from=obs.queries_from,
                next_position=obs.next_position,
                track_tokens=obs.track_tokens,
                token_ids=None if obs.token_ids is None else list(obs.token_ids),
                decoder=obs.decoder,
            )
            copy.observer.queries = {k: t.clone() for k, t in obs.queries.items()}
            copy.observer.attention_sum = {k: t.clone() for k, t in obs.attention_sum.items()}
            copy.observer.seen = {k: t.clone() for k, t in obs.seen.items()}
        return copy

    # ---- compaction -------------------------------------------------------------------------

    def prune_prefix(self, count: int) -> int:
        """Drop the first `count` tokens of every head (the spec's ``prune_prefix``)."""
        if not 0 <= count <= self.length:
            raise ValueError(f"cannot prune {count} of {self.length} tokens")
        keep = torch.arange(count, self.length, device=self.pool.device)
        shape = (self.num_layers, self.num_kv_heads, self.length - count)
        return self.compact(keep[None, None, :].expand(shape))

    def compact(self, keep: torch.Tensor, counts: torch.Tensor | None = None) -> int:
        """Keep, per layer and KV head, the cache indices `keep` ``[layers, kv_heads, n]``
        (ascending along the last axis); returns how many cache indices the sequence gave up.

        With `counts` ``[layers, kv_heads]`` (head-varying budgets), row ``(l, h)`` keeps only
        its first ``counts[l, h]`` indices; the rest of the row is padding, which `key_mask`
        then hides from attention (docs/architecture.md, "Head-varying budgets"). The kept K/V
        are gathered first and the old blocks released only then, so compaction needs no free
        block beyond the ones it frees (a full pool can still compact).
        """
        layers, heads, n = keep.shape
        if (layers, heads) != (self.num_layers, self.num_kv_heads):
            raise ValueError(f"keep has shape {tuple(keep.shape)}: [layers, kv_heads, n] expected")
        if n > self.length or n < 1:
            raise ValueError(f"cannot keep {n} of {self.length} tokens")
        keep = keep.to(device=self.pool.device, dtype=torch.long)
        real = self._real_entries(keep, counts)
        if n == self.length and real is None:
            return 0
        rising = keep[..., 1:] > keep[..., :-1]
        if real is not None:
            rising = rising | ~real[..., 1:]  # padding repeats its row's last index
        if keep.min() < 0 or keep.max() >= self.length or not bool(rising.all()):
            raise ValueError("kept cache indices must be distinct, ascending and inside the sequence")
        self.key_mask = self._kept_mask(keep, real)
        old_slots = self._slots()
        head_index = torch.arange(heads, device=self.pool.device)[None, :]
        gathered: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(layers):
            slot = old_slots[keep[layer]].transpose(0, 1)  # [n, heads]
            flat = (-1, heads, self.pool.head_dim)
            k = self.pool.k_cache[layer].view(flat)[slot, head_index]  # [n, heads, D] (a copy)
            v = self.pool.v_cache[layer].view(flat)[slot, head_index]
            gathered.append((k, v))
        removed, old_length = self.length - n, self.length
        self.block_table = self._new_table(n)
        self.length = n
        self.position_offset += removed
        new_slots = self._slots()
        for layer, (k, v) in enumerate(gathered):
            self.pool.write(layer, new_slots, k, v)
        self._compact_observer(keep, old_length)
        return removed

    def _real_entries(self, keep: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor | None:
        """``[layers, kv_heads, n]`` True where `keep` holds a kept index, not padding."""
        n = keep.shape[-1]
        if counts is None:
            return None
        counts = counts.to(device=keep.device, dtype=torch.long)
        if counts.shape != keep.shape[:2] or int(counts.min()) < 1 or int(counts.max()) > n:
            raise ValueError(f"counts must be [layers, kv_heads] in 1..{n}")
        if bool((counts == n).all()):
            return None
        return torch.arange(n, device=keep.device) < counts[..., None]

    def _kept_mask(self, keep: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor | None:
        """The key mask after keeping `keep`: an index that was padding stays padding."""
        old = self.key_mask
        if old is not None:
            full = torch.ones((*keep.shape[:2], self.length), dtype=torch.bool, device=keep.device)
            full[..., : old.shape[-1]] = old.to(keep.device)
            carried = full.gather(2, keep)
            real = carried if real is None else real & carried
        return real

    def _new_table(self, n: int) -> list[int]:
        if self._reallocate is not None:
            return self._reallocate(n)
        allocator = self.pool.allocator
        allocator.free(self.block_table)
        return allocator.allocate(-(-n // self.pool.block_size))

    def _compact_observer(self, keep: torch.Tensor, old_length: int) -> None:
        """Accumulated attention follows the kept keys (queries are queries: unchanged)."""
        obs = self.observer
        if obs is None:
            return
        obs.compact_positions(keep)
        for table in (obs.attention_sum, obs.seen):
            for layer, values in list(table.items()):
                if values.shape[1] != old_length:  # observed only part of the keys: start over
                    del table[layer]
                    continue
                groups = values.shape[0] // keep.shape[1]
                index = keep[layer].repeat_interleave(groups, dim=0).to(values.device)
                table[layer] = values.gather(1, index)
