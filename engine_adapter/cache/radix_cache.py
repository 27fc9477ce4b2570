"""The radix index: a prefix cache at block granularity (docs/architecture.md, "Cache core").

One node (`cached_block.CachedBlock`) per full block of `block_size` tokens, keyed by its chained
hash (`block_keys`): equal keys mean equal prefixes, so the cache is a dict from key to node plus
parent links, and a lookup walks the request's block keys until the first miss.

A block is *evictable* when its ref count is 0, it is not pinned and it has no cached child.
Evicting a leaf can make its parent evictable (cascade), so leaves go first. Locks and pins
cover whole root paths, which means a block with ref count 0 and no pin has no locked or pinned
block below it: every such block can be reclaimed by cascading eviction, and
`num_reclaimable` counts them in O(1).

The policy is told every change through its incremental interface (docs/architecture.md,
"Policy interface") and is the only thing that orders blocks; no method here passes over all
blocks, except `check` and `reclaim_all`, which are not on a hot path.

The cache does not own pool memory: `evict` returns the evicted nodes and the caller frees
their block ids. Its hot paths have a compiled twin (`_core.pyx`, `CompiledRadixCache`);
`new_radix_cache` picks one. Imports `block_keys`, `block_meta` (the records a commit makes),
`cached_block`, `errors`, `explain` and the policy library; nothing that imports it.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.block_meta import BlockMetaFields
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.errors import BlockStateError, CacheInvariantError, PinLimitError
from engine_adapter.cache.explain import EXPLAIN_CANDIDATES, build_explanation
from sage_eviction import EntryMeta, EvictionPolicy
from sage_eviction.native import implementation, load

__all__ = [
    "CORE_MODULE",
    "CompiledRadixCache",
    "RadixCache",
    "new_radix_cache",
]


class RadixCache:
    """Cached blocks keyed by chained hash, their ref counts and pins, and the policy's view.

    Args:
        policy: Orders evictable blocks; told every change.
        num_blocks: Pool size, for `max_pinned_ratio`.
        max_pinned_ratio: At most this fraction of the pool may be pinned.
    """

    def __init__(self, policy: EvictionPolicy, *, num_blocks: int, max_pinned_ratio: float = 0.5) -> None:
        if not 0.0 <= max_pinned_ratio <= 1.0:
            raise ValueError(f"max_pinned_ratio={max_pinned_ratio!r} must be within [0, 1]")
        self.policy = policy
        self.num_blocks = num_blocks
        self.max_pinned_ratio = max_pinned_ratio
        self.max_pinned = int(max_pinned_ratio * num_blocks)
        self._blocks: dict[Hashable, CachedBlock] = {}
        self.num_pinned = 0  # blocks with pin_count > 0
        self.num_reclaimable = 0  # blocks with ref_count == 0 and pin_count == 0

    # ---- queries ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def get(self, key: Hashable) -> CachedBlock | None:
        """The cached block with this key, or None."""
        return self._blocks.get(key)

    @property
    def num_evictable(self) -> int:
        """Blocks the policy may choose right now (leaves with ref count 0, not pinned)."""
        return self.policy.num_evictable

    def match(self, keys: Iterable[Hashable]) -> list[CachedBlock]:
        """The longest cached prefix of `keys` (a root path), without touching anything."""
        blocks = self._blocks
        path: list[CachedBlock] = []
        parent: CachedBlock | None = None
        for key in keys:
            block = blocks.get(key)
            if block is None or block.parent is not parent:
                break
            path.append(block)
            parent = block
        return path

    def touch(self, path: Iterable[CachedBlock], now: float | None = None) -> None:
        """Report a hit on each block to the policy."""
        access = self.policy.access
        if now is None:
            now = time.time()
        for block in path:
            access(block.key, now)

    # ---- ref counts and pins --------------------------------------------------------------

    def lock(self, path: Iterable[CachedBlock]) -> None:
        """Add one reference to each block (a running sequence uses them)."""
        set_evictable = self.policy.set_evictable
        for block in path:
            if block.ref_count == 0 and block.pin_count == 0:
                self.num_reclaimable -= 1
            block.ref_count += 1
            if block.evictable:
                block.evictable = False
                set_evictable(block.key, False)

    def unlock(self, path: Sequence[CachedBlock]) -> None:
        """Drop one reference from each block.

        Raises:
            BlockStateError: A block's ref count is already 0; nothing changed.
        """
        for block in path:
            if block.ref_count <= 0:
                raise BlockStateError(f"unlock of {block!r} whose ref count is already 0")
        for block in path:
            block.ref_count -= 1
            if block.ref_count == 0 and block.pin_count == 0:
                self.num_reclaimable += 1
                if block.num_children == 0:
                    block.evictable = True
                    self.policy.set_evictable(block.key, True)

    def pin(self, path: Sequence[CachedBlock]) -> int:
        """Pin each block of a root path (nested pins count).

        Returns:
            Blocks newly pinned.

        Raises:
            PinLimitError: More than `max_pinned_ratio` of the pool would be pinned; nothing changed.
        """
        new = sum(1 for block in path if block.pin_count == 0)
        if self.num_pinned + new > self.max_pinned:
            raise PinLimitError(
                f"pinning {new} more blocks would pin {self.num_pinned + new} of {self.num_blocks}, "
                f"above max_pinned_ratio={self.max_pinned_ratio} ({self.max_pinned} blocks)"
            )
        set_evictable = self.policy.set_evictable
        for block in path:
            if block.pin_count == 0:
                self.num_pinned += 1
                if block.ref_count == 0:
                    self.num_reclaimable -= 1
            block.pin_count += 1
            if block.evictable:
                block.evictable = False
                set_evictable(block.key, False)
        return new

    def unpin(self, path: Sequence[CachedBlock]) -> int:
        """Drop one pin from each block.

        Returns:
            Blocks no longer pinned at all.

        Raises:
            BlockStateError: A block is not pinned; nothing changed.
        """
        for block in path:
            if block.pin_count <= 0:
                raise BlockStateError(f"unpin of {block!r}, which is not pinned")
        released = 0
        for block in path:
            block.pin_count -= 1
            if block.pin_count == 0:
                released += 1
                self.num_pinned -= 1
                if block.ref_count == 0:
                    self.num_reclaimable += 1
                    if block.num_children == 0:
                        block.evictable = True
                        self.policy.set_evictable(block.key, True)
        return released

    # ---- insert, evict, remove ------------------------------------------------------------

    def insert(
        self,
        parent: CachedBlock | None,
        key: Hashable,
        block_id: int,
        meta: EntryMeta,
        *,
        sequence_id: int | None = None,
        locked: bool = False,
        leaf: bool = True,
    ) -> CachedBlock:
        """Cache a block under `parent` (None: a first block).

        Args:
            parent: The previous block of its prefix, which must be cached.
            key: Its chained hash; must not be cached yet.
            block_id: The pool block that holds its K/V; the cache now owns it.
            meta: The policy's record.
            sequence_id: The sequence that computed it.
            locked: Insert it with one reference (the sequence keeps using it); the parent must
                then be locked by the same sequence.
            leaf: False when a child follows at once (a chain): it enters the policy
                non-evictable, which saves the policy a flip per block; call `refresh` on the
                last block of the chain if no child came.

        Raises:
            BlockStateError: The key is already cached or the parent is not.
        """
        blocks = self._blocks
        if key in blocks:
            raise BlockStateError(f"block {format_block_key(key)} is already cached")
        if parent is not None:
            if blocks.get(parent.key) is not parent:
                raise BlockStateError(f"parent {parent!r} of block {format_block_key(key)} is not cached")
            parent.num_children += 1
            if parent.evictable:
                parent.evictable = False
                self.policy.set_evictable(parent.key, False)
        block = CachedBlock(key, block_id, parent, meta, sequence_id, 1 if locked else 0)
        blocks[key] = block
        if not locked:
            self.num_reclaimable += 1
        evictable = leaf and not locked
        block.evictable = evictable
        self.policy.insert(key, meta, evictable=evictable)
        return block

    def reclaimable_in(self, path: Sequence[CachedBlock]) -> int:
        """Blocks of `path` with ref count 0 and no pin: what locking it takes from `num_reclaimable`."""
        return sum(1 for block in path if block.ref_count == 0 and block.pin_count == 0)

    def commit(
        self,
        path: list[CachedBlock],
        keys: Sequence[Hashable],
        table: Sequence[int],
        sequence_id: int,
        fields: BlockMetaFields,
    ) -> int:
        """Cache a running sequence's blocks ``keys[len(path):]`` locked, each under the last
        (`CacheManager.commit_blocks`): one call per request, the loop stays here.

        Block ``i`` gets pool block ``table[i]`` and ``fields.meta(i)``; stops at the first key
        already cached (another sequence cached it meanwhile). Appends the new blocks to `path`.

        Returns:
            Blocks newly cached.
        """
        parent = path[-1] if path else None
        blocks = self._blocks
        added = 0
        for i in range(len(path), len(keys)):
            key = keys[i]
            if key in blocks:
                break
            block = self.insert(parent, key, table[i], fields.meta(i), sequence_id=sequence_id, locked=True)
            path.append(block)
            parent = block
            added += 1
        return added

    def release(
        self,
        path: list[CachedBlock],
        keys: Sequence[Hashable],
        table: Sequence[int],
        sequence_id: int,
        fields: BlockMetaFields,
    ) -> tuple[int, list[int]]:
        """Release a sequence that stops running (`CacheManager.free_sequence`): cache its blocks
        ``keys[len(path):]`` unlocked, then drop its references on `path`.

        A key already cached under the same parent keeps the cached block (the sequence's copy
        is freed); a key cached under another parent ends the caching (the caller's keys
        disagree with the tree there). The new blocks enter as a chain (`insert` with
        ``leaf=False``, the last refreshed).

        Returns:
            Blocks newly cached, and the pool block ids of `table` to free.

        Raises:
            BlockStateError: A block of `path` has ref count 0 (after the inserts, as `unlock`).
        """
        parent = path[-1] if path else None
        get = self._blocks.get
        to_free: list[int] = []
        added = 0
        stop = max(len(keys), len(path))  # table[len(path):stop] go to the tree or are duplicates
        last_new: CachedBlock | None = None
        for i in range(len(path), len(keys)):
            key = keys[i]
            existing = get(key)
            if existing is None:
                # inserted as a non-leaf (its child follows); the chain's last is refreshed below
                parent = last_new = self.insert(
                    parent, key, table[i], fields.meta(i), sequence_id=sequence_id, leaf=False
                )
                added += 1
            elif existing.parent is parent:
                to_free.append(table[i])  # a duplicate of a cached block: keep the cached one
                parent = existing
            else:
                stop = i
                break
        if last_new is not None:
            self.refresh(last_new)
        to_free.extend(table[stop:])
        self.unlock(path)
        return added, to_free

    def refresh(self, block: CachedBlock) -> None:
        """Recompute a block's evictability and tell the policy when it changed."""
        should = block.ref_count == 0 and block.pin_count == 0 and block.num_children == 0
        if block.evictable != should:
            block.evictable = should
            self.policy.set_evictable(block.key, should)

    def evict(self, n: int) -> tuple[list[CachedBlock], float]:
        """Evict up to `n` blocks in policy order, cascading to parents that become leaves.

        The policy is asked for one victim at a time, so a parent freed by a cascade competes
        with the other leaves exactly as its own score says.

        Returns:
            The evicted blocks (their pool block ids are the caller's to free) and the wall
            time in seconds spent in the policy's decisions.

        Raises:
            CacheInvariantError: The policy chose a block that was not evictable (a policy bug).
        """
        victims: list[CachedBlock] = []
        if n <= 0:
            return victims, 0.0
        policy = self.policy
        evict = policy.evict
        blocks = self._blocks
        clock = time.perf_counter
        decision = 0.0
        while len(victims) < n:
            t0 = clock()
            keys = evict(1)
            decision += clock() - t0
            if not keys:
                break
            key = keys[0]
            block = blocks.pop(key, None)
            if block is None or block.ref_count or block.pin_count or block.num_children:
                if block is not None:
                    blocks[key] = block
                raise CacheInvariantError(
                    f"policy {policy.name!r} evicted {format_block_key(key)}, which is "
                    f"{'not cached' if block is None else repr(block)}"
                )
            self.num_reclaimable -= 1
            block.evictable = False
            parent = block.parent
            if parent is not None:
                parent.num_children -= 1
                if parent.num_children == 0 and parent.ref_count == 0 and parent.pin_count == 0:
                    parent.evictable = True
                    policy.set_evictable(parent.key, True)
            victims.append(block)
        return victims, decision

    def evict_explained(
        self, n: int, candidates: int = EXPLAIN_CANDIDATES
    ) -> tuple[list[CachedBlock], float, list[dict[str, Any]]]:
        """`evict(n)` that also says why each victim went (`engine_adapter.cache.explain`).

        Before each victim the policy names the next `candidates + 1` entries with their
        explanations (not timed: the decision time is the same `evict(1)` calls as `evict`).
        O(n) per victim in the cached blocks; only with explanation on.

        Returns:
            The evicted blocks, the decision time in seconds, and one record per victim.
        """
        victims: list[CachedBlock] = []
        records: list[dict[str, Any]] = []
        decision = 0.0
        policy = self.policy
        while len(victims) < n:
            # The record is built before the eviction: what was cached, evictable and skipped
            # when the policy chose (the cascade after it may make a skipped parent evictable).
            upcoming = policy.explain_next(candidates + 1)
            record = None
            if upcoming:
                record = build_explanation(
                    values=upcoming[0][1],
                    upcoming=upcoming[1:],
                    blocks=self._blocks,
                    held=self._blocks.values(),
                    rank_of=policy.rank,
                    fmt=format_block_key,
                    limit=candidates,
                )
            got, seconds = self.evict(1)
            decision += seconds
            if not got:
                break
            block = got[0]
            if record is None or upcoming[0][0] != block.key:
                # the policy's explained order and its choice disagree: say so rather than guess
                record = {"values": {"policy": policy.name, "note": "not the explained next victim"}}
            record["ranks_by"] = policy.explains_by
            records.append(record)
            victims.append(block)
        return victims, decision, records

    def remove(self, block: CachedBlock) -> None:
        """Take an evictable leaf out of the cache other than by eviction (policy.remove).

        Raises:
            BlockStateError: It is not an unreferenced, unpinned, cached leaf.
        """
        if self._blocks.get(block.key) is not block:
            raise BlockStateError(f"{block!r} is not cached")
        if block.ref_count or block.pin_count or block.num_children:
            raise BlockStateError(f"{block!r} is referenced, pinned or has children")
        del self._blocks[block.key]
        self.num_reclaimable -= 1
        block.evictable = False
        self.policy.remove(block.key)
        parent = block.parent
        if parent is not None:
            parent.num_children -= 1
            if parent.num_children == 0 and parent.ref_count == 0 and parent.pin_count == 0:
                parent.evictable = True
                self.policy.set_evictable(parent.key, True)

    def reclaim_all(self) -> list[CachedBlock]:
        """Remove every unreferenced, unpinned block, leaves first (a prefix-cache reset).

        O(n log n); not for hot paths. Returns the removed blocks; the caller frees their ids.
        """
        candidates = [b for b in self._blocks.values() if b.ref_count == 0 and b.pin_count == 0]
        candidates.sort(key=lambda b: b.depth, reverse=True)
        for block in candidates:
            self.remove(block)
        return candidates

    @property
    def policy_calls(self) -> str:
        """How this cache calls its policy: "python" (its methods) here; the compiled core's
        cache says "compiled" where the policy has a table of C functions (`sage_eviction._core`)."""
        return "python"

    def set_policy(self, policy: EvictionPolicy) -> None:
        """Use `policy` from now on; it must already hold exactly the cached blocks."""
        self.policy = policy

    def blocks(self) -> list[CachedBlock]:
        """Every cached block (O(n): for checks, tests and the swap)."""
        return list(self._blocks.values())

    # ---- checks ---------------------------------------------------------------------------

    def check(self) -> None:
        """Verify the tree and the policy against each other in O(n) (tests only).

        Raises:
            CacheInvariantError: With what is wrong.
        """

        def fail(msg: str) -> None:
            raise CacheInvariantError(msg)

        blocks = self._blocks
        children: dict[int, int] = {}
        pinned = reclaimable = evictable = 0
        policy = self.policy
        for key, block in blocks.items():
            if block.key != key:
                fail(f"{block!r} is stored under key {format_block_key(key)}")
            if block.ref_count < 0:
                fail(f"{block!r} has a negative ref count")
            if block.pin_count < 0:
                fail(f"{block!r} has a negative pin count")
            parent = block.parent
            if parent is not None:
                if blocks.get(parent.key) is not parent:
                    fail(f"{block!r} is cached but its parent {parent!r} is not (not prefix-closed)")
                if parent.depth != block.depth - 1:
                    fail(f"{block!r} has depth {block.depth} under a parent of depth {parent.depth}")
                children[id(parent)] = children.get(id(parent), 0) + 1
                if block.ref_count > parent.ref_count:
                    fail(f"{block!r} has more references than its parent {parent!r} (locks are paths)")
                if block.pin_count > parent.pin_count:
                    fail(f"{block!r} has more pins than its parent {parent!r} (pins are paths)")
            if block.pin_count:
                pinned += 1
            if block.ref_count == 0 and block.pin_count == 0:
                reclaimable += 1
            if key not in policy:
                fail(f"{block!r} is cached but the policy {policy.name!r} does not hold it")
        for block in blocks.values():
            expected_children = children.get(id(block), 0)
            if block.num_children != expected_children:
                fail(f"{block!r} counts {block.num_children} children, has {expected_children}")
            should = block.ref_count == 0 and block.pin_count == 0 and block.num_children == 0
            if block.evictable != should:
                fail(f"{block!r} evictable flag is {block.evictable}, should be {should}")
            if policy.is_evictable(block.key) != should:
                fail(f"policy {policy.name!r} has {block!r} evictable={not should}, should be {should}")
            evictable += should
        if len(policy) != len(blocks):
            fail(f"policy {policy.name!r} holds {len(policy)} entries, the cache {len(blocks)} blocks")
        if policy.num_evictable != evictable:
            fail(f"policy {policy.name!r} counts {policy.num_evictable} evictable, the cache {evictable}")
        if pinned != self.num_pinned:
            fail(f"num_pinned={self.num_pinned} but {pinned} blocks are pinned")
        if pinned > self.max_pinned:
            fail(f"{pinned} pinned blocks exceed max_pinned={self.max_pinned}")
        if reclaimable != self.num_reclaimable:
            fail(f"num_reclaimable={self.num_reclaimable} but {reclaimable} blocks are unreferenced")


# ---- the compiled core ------------------------------------------------------------------------

CORE_MODULE = "engine_adapter.cache._core"
_core = load(CORE_MODULE)

CompiledRadixCache: type[RadixCache] | None = None
"""`RadixCache` with its hot paths (match, touch, lock, unlock, insert, refresh, evict,
reclaimable_in, commit, release) and `CachedBlock` in C, from engine_adapter/cache/_core.pyx;
None when that is not built or `SAGE_PURE_PYTHON` forces pure Python. The rest is `RadixCache`'s."""

if _core is not None:

    class _CompiledRadixCache(_core.RadixCore, RadixCache):  # type: ignore[misc,name-defined]
        """`RadixCache` whose hot paths run in C (engine_adapter/cache/_core.pyx)."""

    CompiledRadixCache = _CompiledRadixCache


def new_radix_cache(
    policy: EvictionPolicy, *, num_blocks: int, max_pinned_ratio: float = 0.5, compiled: bool | None = None
) -> RadixCache:
    """A `RadixCache`, its hot paths compiled or in pure Python (same API, same results).

    Args:
        compiled: True: the compiled core (`CompiledRadixCache`), which must be built; False:
            pure Python; None: compiled when it is built and not forced off (`sage_eviction.native`).

    Raises:
        RuntimeError: `compiled=True` and the compiled core is not built.
    """
    if compiled is None:
        compiled = CompiledRadixCache is not None
    if not compiled:
        return RadixCache(policy, num_blocks=num_blocks, max_pinned_ratio=max_pinned_ratio)
    if CompiledRadixCache is None:
        raise RuntimeError(f"the compiled radix cache is {implementation(CORE_MODULE)}")
    return CompiledRadixCache(policy, num_blocks=num_blocks, max_pinned_ratio=max_pinned_ratio)
