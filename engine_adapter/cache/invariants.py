"""The cache manager's invariants, checked in O(n) (tests and debugging, never a hot path).

free + used = total; the free list has no duplicates and matches the allocator's flags; the tree
and the policy agree (`RadixCache.check`); every running sequence's cached path is a root path of
live blocks matching its block table; reservations own their blocks alone; ref counts equal the
sequences and the waiting requests' protections holding each block, and the protections stay
within their budget; no block is both free and in use, and none is leaked
(docs/architecture.md, "Cache core").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine_adapter.cache.errors import CacheInvariantError

if TYPE_CHECKING:
    from engine_adapter.cache.cache_manager import CacheManager

__all__ = ["check_manager_invariants"]


def check_manager_invariants(manager: CacheManager) -> None:
    """Raise `CacheInvariantError` naming the first invariant `manager` breaks; call under its lock."""
    pool = manager.allocator
    total = manager.num_blocks
    if pool.num_free + pool.num_used != total:
        raise CacheInvariantError(f"free {pool.num_free} + used {pool.num_used} != total {total}")
    free_ids = pool.free_block_ids()
    free_set = set(free_ids)
    if len(free_set) != len(free_ids):
        raise CacheInvariantError("the free list holds a block twice")
    if len(free_ids) != pool.num_free:
        raise CacheInvariantError(f"free list of {len(free_ids)} but num_free={pool.num_free}")
    for block_id in free_ids:
        if not 0 <= block_id < total or not pool.is_free(block_id):
            raise CacheInvariantError(f"block {block_id} is on the free list but not marked free")

    manager.radix.check()
    owner: dict[int, str] = {}
    for block in manager.radix.blocks():
        if block.block_id in owner:
            raise CacheInvariantError(f"block id {block.block_id} backs two cached blocks")
        owner[block.block_id] = "tree"
    refs: dict[int, int] = {}
    for seq in map(manager.sequence, manager.sequence_ids()):
        path = seq.cached_path
        parent = None
        for i, block in enumerate(path):
            if manager.radix.get(block.key) is not block:
                raise CacheInvariantError(
                    f"sequence {seq.sequence_id} holds {block!r}, which was evicted or removed"
                )
            if block.parent is not parent:
                raise CacheInvariantError(f"sequence {seq.sequence_id}'s cached blocks are not a root path")
            if seq.block_table[i] != block.block_id:
                raise CacheInvariantError(
                    f"sequence {seq.sequence_id}'s block table disagrees with its cached path at {i}"
                )
            refs[id(block)] = refs.get(id(block), 0) + 1
            parent = block
        for block_id in seq.block_table[len(path) :]:
            if block_id in owner:
                raise CacheInvariantError(
                    f"block id {block_id} of sequence {seq.sequence_id} is also owned by {owner[block_id]}"
                )
            owner[block_id] = f"sequence {seq.sequence_id}"
    for owner_id, block_ids in manager.reservations().items():  # an embedding batch's workspace
        for block_id in block_ids:
            if block_id in owner:
                raise CacheInvariantError(
                    f"block id {block_id} of reservation {owner_id} is also owned by {owner[block_id]}"
                )
            owner[block_id] = f"reservation {owner_id}"
    protected: dict[object, int] = {}
    for path in manager.protected_paths():  # a waiting request's protection holds a reference
        parent = None
        for block in path:
            if manager.radix.get(block.key) is not block:
                raise CacheInvariantError(f"a queued request protects {block!r}, which is not cached")
            if block.parent is not parent:
                raise CacheInvariantError("a queued request's protected blocks are not a root path")
            refs[id(block)] = refs.get(id(block), 0) + 1
            protected[block.key] = protected.get(block.key, 0) + 1
            parent = block
    if protected != manager._protect_refs:
        raise CacheInvariantError("the protection counts disagree with the protected paths")
    if len(protected) > manager.max_protected:
        raise CacheInvariantError(
            f"{len(protected)} protected blocks exceed max_protected={manager.max_protected}"
        )
    for block in manager.radix.blocks():
        if block.ref_count != refs.get(id(block), 0):
            raise CacheInvariantError(
                f"{block!r} has ref count {block.ref_count} but {refs.get(id(block), 0)} "
                "sequences and queued protections hold it"
            )
    both = free_set.intersection(owner)
    if both:
        raise CacheInvariantError(f"blocks {sorted(both)[:8]} are both free and in use")
    if len(owner) != pool.num_used:
        raise CacheInvariantError(
            f"{pool.num_used} blocks are used but {len(owner)} are owned (a leak or a double count)"
        )
