"""Queue-aware protection: the cached prefixes of waiting requests, held from eviction until they run.

A waiting request's cached prefix holds one reference on each block (like a running sequence),
so no policy can evict it before the request runs. All protections together stay within a budget
of blocks (`max_protected`), and they never fail an allocation that could succeed without them:
the newest yield first (`yield_for`). `QueueProtection` owns the protected paths and the count
of protections on each block; the cache manager calls it under its lock (docs/architecture.md,
"Cache core"). Imports `cached_block` and `radix_cache`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.radix_cache import RadixCache

__all__ = ["QueueProtection"]


class QueueProtection:
    """The protected prefixes of waiting requests, by request id, over one radix index.

    Args:
        radix: The index whose blocks it locks.
        fraction: Of the pool, what all protections may hold together (0: off).

    Attributes:
        max_protected: The budget in blocks.
        yielded: Protections dropped so that an allocation could proceed.
    """

    __slots__ = ("_paths", "_radix", "_refs", "max_protected", "yielded")

    def __init__(self, radix: RadixCache, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"protect_queued={fraction!r} must be within [0, 1]")
        self._radix = radix
        self.max_protected = int(fraction * radix.num_blocks)
        self._paths: dict[Hashable, list[CachedBlock]] = {}  # request id -> its locked path
        self._refs: dict[Hashable, int] = {}  # block key -> protections holding it
        self.yielded = 0

    @property
    def num_blocks(self) -> int:
        """Distinct blocks protected now."""
        return len(self._refs)

    def __bool__(self) -> bool:
        """Whether any request is protected now."""
        return bool(self._paths)

    def paths(self) -> list[list[CachedBlock]]:
        """The locked paths of the protections (copies; for the invariants)."""
        return [list(path) for path in self._paths.values()]

    def counts(self) -> dict[Hashable, int]:
        """Protections holding each block, by key (a copy; for the invariants)."""
        return dict(self._refs)

    def protect(self, request_id: Hashable, path: Sequence[CachedBlock]) -> int:
        """Protect the longest head of `path` that fits in the budget; returns its blocks.

        The caller has released any earlier protection of `request_id`. Blocks another
        protection already holds cost nothing of the budget.
        """
        room = self.max_protected - len(self._refs)
        refs = self._refs
        end = 0
        for block in path:  # the longest head of the path within the budget
            if block.key not in refs:
                if room <= 0:
                    break
                room -= 1
            end += 1
        if end:
            head = list(path[:end])
            self._radix.lock(head)
            for block in head:
                refs[block.key] = refs.get(block.key, 0) + 1
            self._paths[request_id] = head
        return end

    def release(self, request_id: Hashable) -> int:
        """End a request's protection (it left the queue or runs now); returns blocks it held."""
        path = self._paths.pop(request_id, None)
        if path is None:
            return 0
        self._unprotect(path)
        return len(path)

    def release_touching(self, blocks: set[int]) -> int:
        """End every protection whose path holds a block of `blocks` (``id()`` of each; blocks a
        failed tier move made useless); returns protections ended."""
        ended = [rid for rid, path in self._paths.items() if any(id(b) in blocks for b in path)]
        for request_id in ended:
            self._unprotect(self._paths.pop(request_id))
        return len(ended)

    def _unprotect(self, path: list[CachedBlock]) -> None:
        self._radix.unlock(path)
        refs = self._refs
        for block in path:
            left = refs[block.key] - 1
            if left:
                refs[block.key] = left
            else:
                del refs[block.key]

    def _yield_newest(self) -> None:
        """Drop the newest protection (an allocation needs its blocks)."""
        request_id = next(reversed(self._paths))
        self._unprotect(self._paths.pop(request_id))
        self.yielded += 1

    def reclaimable_for(self, path: Sequence[CachedBlock]) -> int:
        """Blocks eviction could reclaim for a request that locks `path`, once every protection
        has yielded (O(protected blocks); O(len(path)) without any)."""
        radix = self._radix
        reclaimable = radix.num_reclaimable - radix.reclaimable_in(path)
        refs = self._refs
        if not refs:
            return reclaimable
        in_path = {b.key for b in path}
        get = radix.get
        for key, count in refs.items():
            block = get(key)
            # held by protections alone: reclaimable once they yield, unless the request locks it
            if block is not None and block.pin_count == 0 and block.ref_count == count and key not in in_path:
                reclaimable += 1
        return reclaimable

    def yield_for(self, deficit: int, path: Sequence[CachedBlock]) -> int:
        """Make `deficit` blocks reclaimable beside the locked `path` by yielding the newest
        protections, only when yielding can make enough; returns the blocks reclaimable then."""
        radix = self._radix
        reclaimable = radix.num_reclaimable - radix.reclaimable_in(path) if path else radix.num_reclaimable
        if deficit > reclaimable and self._paths and deficit <= self.reclaimable_for(path):
            # protection never fails an allocation that could succeed: the newest yield first
            while deficit > reclaimable:
                self._yield_newest()
                reclaimable = radix.num_reclaimable - radix.reclaimable_in(path)
        return reclaimable
