"""Pool reservations: block ids taken off the free list for an owner that is neither a running
sequence nor the prefix cache (an embedding batch's workspace), held until released.

A reservation evicts exactly its deficit first (reason ``reserve``), as an allocation does, and
fails, changing nothing, only when free and reclaimable blocks fall short. Admission and eviction
see reserved blocks as used, neither cached nor reclaimable; the invariants count them as owned.
`Reservations` owns the table of owner -> block ids; the cache manager calls it under its lock.
Imports `block_allocator`, `errors` and `eviction`.
"""

from __future__ import annotations

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.errors import RequestTooLargeError
from engine_adapter.cache.eviction import EvictionStep

__all__ = ["Reservations"]


class Reservations:
    """Block ids held by reservation owners.

    Args:
        pool: The free list reservations take from and give back to.
        eviction: Makes room when the free list is short.
    """

    __slots__ = ("_eviction", "_held", "_pool")

    def __init__(self, pool: BlockAllocator, eviction: EvictionStep) -> None:
        self._pool = pool
        self._eviction = eviction
        self._held: dict[int, list[int]] = {}

    @property
    def num_blocks(self) -> int:
        """Blocks held by reservations now."""
        return sum(len(ids) for ids in self._held.values())

    def snapshot(self) -> dict[int, list[int]]:
        """Each reservation's block ids (copies; for checks and tests)."""
        return {owner: list(ids) for owner, ids in self._held.items()}

    def reserve(self, owner: int, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` blocks for `owner`, evicting when the free list is short.

        Returns:
            The block ids (a copy), or None when free and reclaimable blocks fall short (nothing
            changed).

        Raises:
            ValueError: `owner` already holds a reservation, or `num_blocks` is not positive.
            RequestTooLargeError: More blocks than the pool has.
        """
        if owner in self._held:
            raise ValueError(f"reservation {owner} already holds blocks")
        if num_blocks <= 0:
            raise ValueError(f"cannot reserve {num_blocks} blocks")
        if num_blocks > self._pool.num_blocks:
            raise RequestTooLargeError(
                f"a reservation of {num_blocks} blocks exceeds the pool of {self._pool.num_blocks}"
            )
        deficit = self._eviction.room_for((), num_blocks)
        if deficit is None:
            return None
        if deficit > 0:
            self._eviction.evict(deficit, "reserve", pending=num_blocks)
        ids = self._pool.allocate(num_blocks)
        self._held[owner] = ids
        return list(ids)

    def release(self, owner: int) -> int:
        """Give `owner`'s blocks back to the free list; returns how many (0: none held)."""
        ids = self._held.pop(owner, None)
        if not ids:
            return 0
        self._pool.free(ids)
        return len(ids)
