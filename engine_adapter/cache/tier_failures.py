"""What the core does when the engine could not run a tier move (`CacheManager.moves_failed`).

The engine reports the moves whose source it could not read (a disk file missing or failing its
checksum) or whose copy failed. The rule (docs/architecture.md, "Tiers"): a failed block is a
miss, never a wrong answer. A copy below the device is dropped with its descendants below. A
failed promotion leaves garbage in a device block: that block and every device block under it
leave the tree (their K/V is useless past the gap); each running sequence whose cached path
crosses them keeps its path up to the first of them and recomputes from there in the same block
ids, now its own (a second sequence sharing them gets fresh ones), and queued protections and
prefetches over them end. Called under the cache manager's lock. Imports `block_allocator`,
`cached_block`, `errors`, `eviction`, `promotion`, `queue_protection`, `radix_cache`, `records`,
`tier_moves` and `tiers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.promotion import Prefetches
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SequenceState
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.cache.tiers import TierStore

__all__ = ["handle_failed_moves"]


def _subtree(radix: RadixCache, roots: Iterable[CachedBlock]) -> list[CachedBlock]:
    """`roots` and every device block under them, deepest first (O(n) in the tree: rare path)."""
    inside: dict[int, bool] = {id(b): True for b in roots}
    for block in radix.blocks():
        chain: list[CachedBlock] = []
        node: CachedBlock | None = block
        while node is not None and id(node) not in inside:
            chain.append(node)
            node = node.parent
        verdict = node is not None and inside[id(node)]
        for b in chain:
            inside[id(b)] = verdict
    found = [b for b in radix.blocks() if inside.get(id(b))]
    found.sort(key=lambda b: b.depth, reverse=True)
    return found


def _cut_paths(
    sequences: Iterable[SequenceState], radix: RadixCache, gone_ids: set[int]
) -> tuple[dict[int, int], set[int], list[tuple[SequenceState, int]]]:
    """Cut each running sequence's cached path before its first gone block (unlocking the rest).

    Returns:
        Blocks kept per cut sequence; the block ids now private to a sequence; and (sequence,
        table index) pairs whose block another sequence claimed first (they need a fresh one).
    """
    kept: dict[int, int] = {}
    claimed: set[int] = set()
    shared: list[tuple[SequenceState, int]] = []  # (sequence, table index) needing a fresh block
    for seq in sequences:
        path = seq.cached_path
        cut = next((i for i, b in enumerate(path) if id(b) in gone_ids), None)
        if cut is None:
            continue
        radix.unlock(path[cut:])
        for i in range(cut, len(path)):
            if path[i].block_id in claimed:
                shared.append((seq, i))
            claimed.add(path[i].block_id)
        del path[cut:]
        kept[seq.sequence_id] = cut
    return kept, claimed, shared


def handle_failed_moves(
    failed: Sequence[TierMove],
    *,
    radix: RadixCache,
    store: TierStore,
    pool: BlockAllocator,
    eviction: EvictionStep,
    sequences: Iterable[SequenceState],
    protection: QueueProtection,
    prefetches: Prefetches | None,
) -> dict[int, int]:
    """Apply the rule above; returns, for each running sequence whose cached prefix shrank, the
    cached blocks it keeps (it recomputes from that block on).

    Raises:
        NoEvictableBlocksError: A sequence sharing a failed block needs a fresh one and none can
            be freed (the pool is full of locked blocks).
    """
    bad: list[CachedBlock] = []
    for move in failed:
        if move.dst_tier is Tier.DEVICE:
            block = radix.get(move.key)
            if block is not None and block.block_id == move.dst:
                bad.append(block)
            else:
                # It left the tree in the step that loaded it (a loose prefetch evicted again),
                # and its demotion may have copied the garbage below: drop the key's copy there.
                store.drop_key(move.key, "failed")
        else:
            store.drop_key(move.key, "failed")
    if not bad:
        return {}
    gone = _subtree(radix, bad)
    gone_ids = {id(b) for b in gone}
    protection.release_touching(gone_ids)
    if prefetches is not None:
        for request_id, path in list(prefetches.held.items()):
            if any(id(b) in gone_ids for b in path):
                prefetches.cancel(request_id)
    kept, claimed, shared = _cut_paths(sequences, radix, gone_ids)
    for block in gone:
        radix.remove(block)
        # its copy below (write-through) is the unreadable one or an orphan now
        if not store.drop_key(block.key, "failed"):
            store.drop_below(block.key)
    if eviction.quotas:
        eviction.quotas.left(gone)
    pool.free([b.block_id for b in gone if b.block_id not in claimed])
    for seq, index in shared:
        if pool.num_free == 0 and not eviction.evict(1, "alloc"):
            raise NoEvictableBlocksError(
                f"sequence {seq.sequence_id} needs a fresh block after a failed load"
            )
        seq.block_table[index] = pool.allocate(1)[0]
    return kept
