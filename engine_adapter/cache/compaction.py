"""Compaction: a running sequence whose K/V token-level eviction compacts gets a fresh, smaller table.

Its cached prefix is unlocked (those blocks stay in the tree: they still hold the original
prefix, for others to hit or the policy to evict), its private blocks are freed, and new blocks
for the kept tokens are allocated, evicting cached ones only if the free list is short. From
then on the sequence is `compressed`: none of its blocks is committed to the prefix cache.
`sequences.RunningSequences` calls these under the cache manager's lock (its `compaction_gain`
and `compact_sequence`); the engine's token-level eviction (`engine_adapter.token_eviction`)
copies the K/V. Imports
`block_allocator`, `eviction`, `radix_cache` and `records`.
"""

from __future__ import annotations

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SequenceState

__all__ = ["compact", "compaction_gain"]


def compaction_gain(seq: SequenceState, num_tokens: int, block_size: int) -> int:
    """Blocks that compacting `seq` to `num_tokens` would give back to the pool (free or
    reclaimable), less the fresh blocks its copy takes: negative when the sequence holds mostly
    shared prefix blocks, which stay for the others."""
    path = seq.cached_path
    released = len(seq.private_blocks)
    released += sum(1 for b in path if b.ref_count == 1 and b.pin_count == 0)
    return released - -(-num_tokens // block_size)


def compact(
    seq: SequenceState,
    num_tokens: int,
    *,
    block_size: int,
    pool: BlockAllocator,
    radix: RadixCache,
    eviction: EvictionStep,
) -> list[int] | None:
    """Give `seq` a fresh table of ``ceil(num_tokens / block_size)`` blocks and mark it compressed.

    The caller must have copied out the K/V it keeps (the old blocks may be reused at once).

    Returns:
        The new block table (a copy), or None when even eviction cannot give the blocks
        (nothing changed).
    """
    needed = -(-num_tokens // block_size)
    path = seq.cached_path
    private = seq.private_blocks
    # Blocks of its path only it references become reclaimable when it unlocks them.
    freed_by_unlock = sum(1 for b in path if b.ref_count == 1 and b.pin_count == 0)
    if needed > pool.num_free + len(private) + radix.num_reclaimable + freed_by_unlock:
        return None
    radix.unlock(path)
    if private:
        pool.free(private)
    deficit = needed - pool.num_free
    if deficit > 0:
        eviction.evict(deficit, "alloc", pending=needed)
    seq.block_table = pool.allocate(needed)
    seq.cached_path = []
    seq.compressed_prefix = None  # the caller unlocks it
    seq.keys = []
    seq.compressed = True
    seq.num_tokens = num_tokens
    return list(seq.block_table)
