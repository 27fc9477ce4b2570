"""The block allocator: which of the pool's block ids are free, in pure Python.

It is the cache core's view of the pool, kept apart from the K/V tensors the way vLLM keeps its
`BlockPool` apart from the KV tensors the workers own: the cache manager and the simulator need
only ids, so they never import torch. The engine's `PagedKVPool` (`engine_adapter.model.kv_pool`)
holds one of these beside its tensors and hands it to the cache manager. Imports only `errors`.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_adapter.cache.errors import BlockStateError, PoolExhaustedError

__all__ = ["BlockAllocator"]


class BlockAllocator:
    """An O(1) free list over block ids ``0 .. num_blocks - 1``.

    Args:
        num_blocks: Blocks in the pool.
        block_size: Tokens per block (carried for the cache manager, which checks it).
    """

    __slots__ = ("_free", "_fresh", "_is_free", "block_size", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack of the freed blocks, the next handed out last, above the never-used ids
        # `_fresh ..`, handed out in order (a fresh pool gives 0, 1, 2, ...: easier to read in
        # logs and tests). Not a list of every id: a simulator's unbounded pool has millions.
        self._free: list[int] = []
        self._fresh = 0
        self._is_free = bytearray(b"\x01") * num_blocks

    @property
    def num_free(self) -> int:
        """Blocks on the free list."""
        return len(self._free) + self.num_blocks - self._fresh

    @property
    def num_used(self) -> int:
        """Blocks handed out and not yet freed."""
        return self._fresh - len(self._free)

    def is_free(self, block_id: int) -> bool:
        """Whether `block_id` is on the free list."""
        self._check_id(block_id)
        return bool(self._is_free[block_id])

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks off the free list, O(1) each.

        Raises:
            PoolExhaustedError: Fewer than `n` blocks are free; nothing changed.
            ValueError: `n` is negative.
        """
        if n <= 0:
            if n < 0:
                raise ValueError(f"cannot allocate n={n} blocks")
            return []
        free, available = self._free, self.num_free
        if n > available:
            raise PoolExhaustedError(f"cannot allocate {n} blocks: {available} of {self.num_blocks} are free")
        ids = free[-n:]
        del free[-n:]
        ids.reverse()
        if len(ids) < n:
            fresh = self._fresh
            self._fresh = fresh + n - len(ids)
            ids.extend(range(fresh, self._fresh))
        is_free = self._is_free
        for block_id in ids:
            is_free[block_id] = 0
        return ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the free list.

        Raises:
            BlockStateError: An id is out of range, already free, or repeated; nothing changed.
        """
        ids = list(block_ids)
        is_free = self._is_free
        num_blocks = self.num_blocks
        for i, block_id in enumerate(ids):
            if not 0 <= block_id < num_blocks:
                self._undo_marks(ids[:i])
                raise BlockStateError(f"block id {block_id} is outside the pool (0..{num_blocks - 1})")
            if is_free[block_id]:
                self._undo_marks(ids[:i])
                raise BlockStateError(f"double free of block {block_id}")
            is_free[block_id] = 1
        # Push in reverse so that the first freed is the next handed out again.
        self._free.extend(reversed(ids))

    def _undo_marks(self, ids: list[int]) -> None:
        for block_id in ids:
            self._is_free[block_id] = 0

    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockStateError(f"block id {block_id} is outside the pool (0..{self.num_blocks - 1})")

    def free_block_ids(self) -> list[int]:
        """The free list, next to be handed out last (O(n): for checks and tests)."""
        return [*range(self.num_blocks - 1, self._fresh - 1, -1), *self._free]

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free})"
        )
