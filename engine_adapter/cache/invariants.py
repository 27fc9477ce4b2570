"""The cache manager's invariants, checked in O(n) (tests and debugging, never a hot path).

free + used = total; the free list has no duplicates and matches the allocator's flags; the tree
and the policy agree (`RadixCache.check`); every running sequence's cached path is a root path of
live blocks matching its block table; reservations own their blocks alone; ref counts equal the
sequences and the waiting requests' protections holding each block, and the protections stay
within their budget; no block is both free and in use, and none is leaked
(docs/architecture.md, "Cache core"). With KV tiers (`check_tier_invariants`): every tier's
slots back exactly one entry each and the capacities hold; each entry's tier policy holds it,
evictable exactly as the rules say; a key lives in at most one tier below the device, and such a
copy says whether the device tree holds it too; the union of the tiers is prefix-closed; and
prefetches' locks count as references.

The cache manager passes its parts (`CacheManager.check_invariants`); this module imports the
parts' types, never the manager.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.compressed import CompressedPrefixes
from engine_adapter.cache.errors import CacheInvariantError
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SequenceState
from engine_adapter.cache.tiers import TierStore

__all__ = ["check_manager_invariants", "check_tier_invariants"]


def check_manager_invariants(
    pool: BlockAllocator,
    radix: RadixCache,
    sequences: Iterable[SequenceState],
    reservations: Mapping[int, list[int]],
    protection: QueueProtection,
    tiers: TierStore | None = None,
    prefetched: Iterable[list[CachedBlock]] = (),
    compressed: CompressedPrefixes | None = None,
) -> None:
    """Raise `CacheInvariantError` naming the first invariant the parts break; call under the
    manager's lock.

    Args:
        pool: The free list.
        radix: The radix index (and through it the policy).
        sequences: The running sequences.
        reservations: Each reservation's block ids.
        protection: The waiting requests' protections.
        tiers: The host/disk tiers, or None.
        prefetched: The locked paths of queued requests' prefetches.
        compressed: The compressed prefixes (compress-on-evict), or None.
    """
    free_set = _check_free_list(pool)
    radix.check()
    owner: dict[int, str] = {}
    for block in radix.blocks():
        if block.block_id in owner:
            raise CacheInvariantError(f"block id {block.block_id} backs two cached blocks")
        owner[block.block_id] = "tree"
    sequences = list(sequences)
    if compressed is not None:
        _check_compressed(compressed, radix, sequences, owner)
    refs: dict[int, int] = {}  # id(block) -> sequences and protections holding it
    for seq in sequences:
        _check_sequence(seq, radix, owner, refs)
    for owner_id, block_ids in reservations.items():  # an embedding batch's workspace
        for block_id in block_ids:
            if block_id in owner:
                raise CacheInvariantError(
                    f"block id {block_id} of reservation {owner_id} is also owned by {owner[block_id]}"
                )
            owner[block_id] = f"reservation {owner_id}"
    _check_protections(protection, radix, refs)
    _count_prefetches(prefetched, radix, refs)
    if tiers is not None:
        check_tier_invariants(tiers, radix)
    for block in radix.blocks():
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


def _count_prefetches(
    prefetched: Iterable[list[CachedBlock]], radix: RadixCache, refs: dict[int, int]
) -> None:
    """A prefetch holds a reference on its whole root path of cached blocks."""
    for path in prefetched:
        for block in path:
            if radix.get(block.key) is not block:
                raise CacheInvariantError(f"a prefetch holds {block!r}, which is not cached")
            refs[id(block)] = refs.get(id(block), 0) + 1


def _check_compressed(
    compressed: CompressedPrefixes, radix: RadixCache, sequences: list[SequenceState], owner: dict[int, str]
) -> None:
    """Compressed entries (stale ones too) own their blocks alone, hold fewer than they stand
    for, and are referenced exactly by the sequences reading them."""
    readers: dict[int, int] = {}
    for seq in sequences:
        if seq.compressed_prefix is not None:
            readers[id(seq.compressed_prefix)] = readers.get(id(seq.compressed_prefix), 0) + 1
    stale = compressed.stale()
    if any(e.ref_count == 0 for e in stale):
        raise CacheInvariantError("a stale compressed prefix no sequence reads still holds its blocks")
    for entry in (*compressed.entries(), *stale):
        if not 0 < len(entry.blocks) < len(entry.keys):
            raise CacheInvariantError(
                f"compressed prefix {entry.key!r} holds {len(entry.blocks)} blocks for {len(entry.keys)}"
            )
        if entry.kept > len(entry.blocks) * compressed.block_size:
            raise CacheInvariantError(f"compressed prefix {entry.key!r} keeps more than its blocks hold")
        if entry.ref_count != readers.get(id(entry), 0):
            raise CacheInvariantError(
                f"compressed prefix {entry.key!r} has ref count {entry.ref_count} but "
                f"{readers.get(id(entry), 0)} sequences read it"
            )
        for block_id in entry.blocks:
            if block_id in owner:
                raise CacheInvariantError(
                    f"block id {block_id} of a compressed prefix is also owned by {owner[block_id]}"
                )
            owner[block_id] = "compressed"


def _check_free_list(pool: BlockAllocator) -> set[int]:
    """The pool's counts and free list agree; returns the free ids."""
    total = pool.num_blocks
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
    return free_set


def _check_sequence(
    seq: SequenceState, radix: RadixCache, owner: dict[int, str], refs: dict[int, int]
) -> None:
    """A running sequence's cached path is a live root path matching its table; it owns the rest."""
    path = seq.cached_path
    parent = None
    for i, block in enumerate(path):
        if radix.get(block.key) is not block:
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
    entry = seq.compressed_prefix
    if entry is not None:
        shared = seq.block_table[len(path) : len(path) + len(entry.blocks)]
        if shared != entry.blocks or owner.get(entry.blocks[0]) != "compressed" or entry.ref_count < 1:
            raise CacheInvariantError(f"sequence {seq.sequence_id} reads a compressed prefix unlocked")
    for block_id in seq.private_blocks:
        if block_id in owner:
            raise CacheInvariantError(
                f"block id {block_id} of sequence {seq.sequence_id} is also owned by {owner[block_id]}"
            )
        owner[block_id] = f"sequence {seq.sequence_id}"


def _check_protections(protection: QueueProtection, radix: RadixCache, refs: dict[int, int]) -> None:
    """Each protection is a live root path; its counts agree and stay within the budget."""
    protected: dict[Hashable, int] = {}
    for path in protection.paths():  # a waiting request's protection holds a reference
        parent = None
        for block in path:
            if radix.get(block.key) is not block:
                raise CacheInvariantError(f"a queued request protects {block!r}, which is not cached")
            if block.parent is not parent:
                raise CacheInvariantError("a queued request's protected blocks are not a root path")
            refs[id(block)] = refs.get(id(block), 0) + 1
            protected[block.key] = protected.get(block.key, 0) + 1
            parent = block
    if protected != protection.counts():
        raise CacheInvariantError("the protection counts disagree with the protected paths")
    if len(protected) > protection.max_protected:
        raise CacheInvariantError(
            f"{len(protected)} protected blocks exceed max_protected={protection.max_protected}"
        )


def check_tier_invariants(tiers: TierStore, radix: RadixCache) -> None:
    """The host/disk tiers against themselves and the device tree (docstring above)."""
    seen: dict[Hashable, str] = {}
    children: dict[Hashable, set[Hashable]] = {}
    last = tiers.levels[-1]
    for level in tiers.levels:
        name = level.tier.value
        if len(level.entries) > level.capacity:
            raise CacheInvariantError(f"{name} holds {len(level.entries)} blocks over its {level.capacity}")
        slots = [e.slot for e in level.entries.values()]
        if len(set(slots)) != len(slots):
            raise CacheInvariantError(f"a {name} slot backs two blocks")
        free = set(level.slots.free_block_ids())
        if free.intersection(slots) or len(free) + len(slots) != level.capacity:
            raise CacheInvariantError(
                f"{name} slots: {len(slots)} used and {len(free)} free of {level.capacity}"
            )
        if len(level.policy) != len(level.entries):
            raise CacheInvariantError(
                f"{name} policy holds {len(level.policy)}, the tier {len(level.entries)}"
            )
        for key, entry in level.entries.items():
            if key in seen:
                raise CacheInvariantError(f"block {key!r} is in {seen[key]} and {name}")
            seen[key] = name
            if entry.key != key or entry.tier is not level.tier or entry.holds < 0:
                raise CacheInvariantError(f"{entry!r} is filed as {key!r} in {name}")
            if entry.on_device != (key in radix):
                raise CacheInvariantError(
                    f"{entry!r} says on_device={entry.on_device}, the device tree disagrees"
                )
            if not entry.on_device:
                children.setdefault(entry.parent_key, set()).add(key)
    for key, entry in ((k, e) for lv in tiers.levels for k, e in lv.entries.items()):
        parent = entry.parent_key
        if not entry.on_device and parent is not None and parent not in radix and parent not in seen:
            raise CacheInvariantError(f"{entry!r}'s parent is in no tier (the tiers are not prefix-closed)")
        level = tiers.levels[0] if entry.tier is tiers.levels[0].tier else tiers.levels[-1]
        should = entry.holds == 0 and (entry.on_device or level is not last or not children.get(key))
        if should and level is last and not entry.on_device and tiers.retention is not None:
            should = key not in tiers.retention.expiry  # retained: held until it expires
        if level.policy.is_evictable(key) != should:
            raise CacheInvariantError(
                f"{entry!r} is evictable={not should} in its policy, should be {should}"
            )
    for key, kids in children.items():
        if tiers.children_of(key) != kids:
            raise CacheInvariantError(f"the tiers count {tiers.children_of(key)} below {key!r}, not {kids}")
