"""The host tier of the KV cache (``--host-kv-cache``): a second K/V pool in host memory.

Blocks the device pool demotes wait here until a lookup promotes them back (issue 30). Each
layer's K and V are one tensor ``[num_blocks, block_size, num_kv_heads, head_dim]``, the device
pool's layout per block, so a block moves between the two with one ``index_select`` on one side
and one ``index_copy_`` on the other, per layer, for any number of blocks.

Beside a CUDA device pool the tensors are pinned (page-locked): a copy from pageable memory is
staged by the driver through a pinned bounce buffer and cannot overlap anything, a copy from
pinned memory is a DMA the GPU runs on its own. The copies run on the pool's own CUDA stream
(`copy_stream`) so that the forward's stream only waits where it must
(`engine_adapter.model.tier_copy`). Beside a CPU pool it is a plain tensor pool.

Which slot holds which block is the cache core's business (`engine_adapter.cache.tier_moves`):
this pool only stores bytes at the slots it is told.

Imports: torch and the model's KV pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine_adapter.model.kv_pool import PagedKVPool, check_positive_ints, resolve_dtype

__all__ = ["HostKVPool"]


class HostKVPool:
    """K/V blocks in host memory, shaped like a `PagedKVPool`'s, addressed by slot index.

    Args:
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Size of one head.
        block_size: Tokens per block.
        num_blocks: Slots of the pool.
        dtype: Element type of K and V (the device pool's: a block moves as stored).
        pin: Page-locked tensors and a copy stream (needs CUDA; for a CUDA device pool).

    Attributes:
        k_cache: One CPU tensor per layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        v_cache: Same for values.
        copy_stream: The CUDA stream the tier's copies run on; None on the CPU.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype | str = torch.float32,
        pin: bool = False,
    ) -> None:
        check_positive_ints(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
        )
        if pin and not torch.cuda.is_available():
            raise ValueError("a pinned host pool needs CUDA: pin=True is for a CUDA device pool")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.dtype = resolve_dtype(dtype)
        self.pinned = pin
        self.bytes_per_block = PagedKVPool.bytes_for_block(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=self.dtype,
        )
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: a slot never written reads as zeros, never as another process's bytes.
        self.k_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=self.dtype, pin_memory=pin) for _ in range(num_layers)
        ]
        self.v_cache: list[torch.Tensor] = [
            torch.zeros(shape, dtype=self.dtype, pin_memory=pin) for _ in range(num_layers)
        ]
        self.copy_stream: Any = torch.cuda.Stream() if pin else None  # type: ignore[no-untyped-call]

    @classmethod
    def like(cls, pool: PagedKVPool, num_blocks: int) -> HostKVPool:
        """A host pool of `num_blocks` slots for blocks of `pool` (same shape and dtype), pinned
        with a copy stream when `pool` is on CUDA."""
        return cls(
            num_layers=pool.num_layers,
            num_kv_heads=pool.num_kv_heads,
            head_dim=pool.head_dim,
            block_size=pool.block_size,
            num_blocks=num_blocks,
            dtype=pool.dtype,
            pin=pool.device.type == "cuda",
        )

    @property
    def total_bytes(self) -> int:
        """Bytes of K and V over all layers and slots."""
        return self.bytes_per_block * self.num_blocks

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """One layer's K (or V) of one block: ``(block_size, num_kv_heads, head_dim)``."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    def check_slots(self, slots: Sequence[int]) -> torch.Tensor:
        """`slots` as an int64 CPU index.

        Raises:
            IndexError: A slot outside ``[0, num_blocks)`` (index_copy_ would write out of
                bounds in a release build of some kernels, so it is checked here).
        """
        for slot in slots:
            if not 0 <= slot < self.num_blocks:
                raise IndexError(f"host slot {slot} is outside the host pool's {self.num_blocks} slots")
        return torch.tensor(list(slots), dtype=torch.long)

    def __repr__(self) -> str:
        return (
            f"HostKVPool(num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, block_size={self.block_size}, num_blocks={self.num_blocks}, "
            f"dtype={self.dtype}, pinned={self.pinned})"
        )
