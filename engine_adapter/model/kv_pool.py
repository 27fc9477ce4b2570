"""The paged KV pool: one K and one V tensor per layer, allocated once, beside its block allocator.

A block holds the keys and values of `block_size` consecutive tokens of one sequence in every
layer. Token position `p` of a sequence whose block table is `bt` lives in slot
`bt[p // block_size] * block_size + p % block_size` of the flattened
`[num_blocks * block_size, num_kv_heads, head_dim]` view of each layer's tensor.

Which block ids are free lives in `engine_adapter.cache.block_allocator.BlockAllocator`
(`pool.allocator`), pure Python, so the cache manager and the simulator never need torch. On the
``"meta"`` device the tensors have shapes but no storage (tests of shapes and sizing).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.sizes import parse_bytes

__all__ = ["PagedKVPool", "check_positive_ints", "resolve_device", "resolve_dtype"]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is cuda when available, else cpu; anything else as torch reads it."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device (auto, cpu, cuda, cuda:N, meta)") from exc


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or a name such as ``"float16"`` / ``"bf16"``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    found = _DTYPES.get(dtype.strip().lower())
    if found is None:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(sorted(_DTYPES))}")
    return found


def _bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> int:
    element = torch.empty((), dtype=dtype, device="meta").element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element


def _mem_available_bytes() -> int:
    """MemAvailable of /proc/meminfo, in bytes (falls back to physical pages where it is absent)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_positive_ints(**values: int) -> None:
    """Raise ValueError naming the first of `values` that is not a positive int (a bool is not)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive int")


class PagedKVPool:
    """Fixed-size K/V block storage for every layer, with the `BlockAllocator` of its block ids.

    Args:
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads per layer (after grouping).
        head_dim: Size of one head.
        block_size: Tokens per block.
        num_blocks: Blocks in the pool.
        dtype: Element type of K and V.
        device: ``"auto"`` (cuda when available, else cpu), ``"cpu"``, ``"cuda[:N]"``, or
            ``"meta"`` (shapes only, no memory: for simulation).

    Attributes:
        k_cache: One tensor per layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        v_cache: Same for values.
        allocator: The free list of block ids, for the cache manager.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        device: str = "auto",
    ) -> None:
        check_positive_ints(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
        )
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.dtype = resolve_dtype(dtype)
        self.device = resolve_device(device)
        self.bytes_per_block = _bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, self.dtype)

        # One scratch block past the allocator's blocks (id `num_blocks`, see `scratch_slots`):
        # the padded rows of a static decode step (engine_adapter.model.graphs) write there.
        # The allocator never hands it out, and k_cache/v_cache do not show it.
        shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
        make = torch.empty if self.device.type == "meta" else torch.zeros
        k_all = [make(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        v_all = [make(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        self.k_cache: list[torch.Tensor] = [t[:num_blocks] for t in k_all]
        self.v_cache: list[torch.Tensor] = [t[:num_blocks] for t in v_all]
        flat = ((num_blocks + 1) * block_size, num_kv_heads, head_dim)
        self._k_flat = [t.view(flat) for t in k_all]
        self._v_flat = [t.view(flat) for t in v_all]

        # Which blocks are free is the cache core's business: the manager takes this allocator.
        self.allocator = BlockAllocator(num_blocks, block_size)

    @property
    def total_bytes(self) -> int:
        """Bytes of K and V over all layers and blocks (0 allocated on meta; the one scratch block
        not counted)."""
        return self.bytes_per_block * self.num_blocks

    @property
    def scratch_slots(self) -> range:
        """Slots of the scratch block: no sequence owns them, so writes there are dropped."""
        first = self.num_blocks * self.block_size
        return range(first, first + self.block_size)

    # ---- K/V access -----------------------------------------------------------------------

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `layer` as ``[slots, num_kv_heads, head_dim]`` views, the scratch block's
        slots (`scratch_slots`) included."""
        return self._k_flat[layer], self._v_flat[layer]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K and V of `n` tokens.

        Args:
            layer: Layer index.
            slots: int64 ``[n]``; slot = block_id * block_size + offset (see `slot_mapping`).
            k: ``[n, num_kv_heads, head_dim]``.
            v: Same shape as `k`.
        """
        if slots.device != self.device and self.device.type != "meta":
            slots = slots.to(self.device)
        self._k_flat[layer].index_copy_(0, slots, k.to(self.dtype))
        self._v_flat[layer].index_copy_(0, slots, v.to(self.dtype))

    def gather(
        self, layer: int, block_table: Sequence[int] | torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the first `num_tokens` tokens of a sequence.

        Args:
            layer: Layer index.
            block_table: The sequence's block ids in order (at least ceil(num_tokens / block_size)).
            num_tokens: Tokens to return.

        Returns:
            ``(k, v)``, each ``[num_tokens, num_kv_heads, head_dim]`` (a copy).
        """
        bs = self.block_size
        n_blocks = -(-num_tokens // bs)
        if not isinstance(block_table, torch.Tensor):
            if len(block_table) < n_blocks:
                raise ValueError(
                    f"block table of {len(block_table)} blocks cannot hold {num_tokens} tokens "
                    f"(block_size={bs})"
                )
            table = torch.tensor(list(block_table[:n_blocks]), dtype=torch.long, device=self.device)
        else:
            if block_table.numel() < n_blocks:
                raise ValueError(
                    f"block table of {block_table.numel()} blocks cannot hold {num_tokens} tokens "
                    f"(block_size={bs})"
                )
            table = block_table[:n_blocks].to(device=self.device, dtype=torch.long)
        shape = (n_blocks * bs, self.num_kv_heads, self.head_dim)
        k = self.k_cache[layer].index_select(0, table).view(shape)[:num_tokens]
        v = self.v_cache[layer].index_select(0, table).view(shape)[:num_tokens]
        return k, v

    @staticmethod
    def slot_mapping(
        block_table: Sequence[int] | torch.Tensor,
        start: int,
        end: int,
        block_size: int,
        *,
        device: str | torch.device | None = None,
    ) -> torch.Tensor:
        """Slots of token positions ``[start, end)`` of a sequence with this block table.

        Returns:
            int64 ``[end - start]``: ``block_table[p // block_size] * block_size + p % block_size``.
        """
        if end < start or start < 0:
            raise ValueError(f"token range [{start}, {end}) is not valid")
        if end > start and -(-end // block_size) > len(block_table):
            raise ValueError(
                f"block table of {len(block_table)} blocks cannot hold position {end - 1} "
                f"(block_size={block_size})"
            )
        positions = torch.arange(start, end, dtype=torch.long)
        if isinstance(block_table, torch.Tensor):
            table = block_table.to(device="cpu", dtype=torch.long)
        else:
            table = torch.tensor(list(block_table), dtype=torch.long)
        if len(table) == 0:
            table = torch.zeros(1, dtype=torch.long)
        slots = table[positions // block_size] * block_size + positions % block_size
        return slots if device is None else slots.to(device)

    # ---- sizing -------------------------------------------------------------------------

    @classmethod
    def bytes_for_block(
        cls, *, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype | str
    ) -> int:
        """Bytes of K and V of one block over all layers."""
        return _bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, resolve_dtype(dtype))

    @classmethod
    def blocks_for_memory(
        cls,
        budget: int | str,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype | str = torch.float32,
    ) -> int:
        """How many blocks fit in `budget` bytes (an int, or a string such as ``"2GiB"``).

        Raises:
            ValueError: The budget is not a size, or does not hold a single block.
        """
        nbytes = parse_bytes(budget)
        per_block = cls.bytes_for_block(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
        )
        blocks = nbytes // per_block
        if blocks < 1:
            raise ValueError(
                f"KV cache memory {budget!r} ({nbytes} bytes) holds no block of {per_block} bytes"
            )
        return blocks

    @classmethod
    def blocks_for_utilization(
        cls,
        fraction: float,
        *,
        device: str | torch.device = "auto",
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype | str = torch.float32,
    ) -> int:
        """How many blocks fit in `fraction` of the memory free now.

        CUDA: free device memory (``torch.cuda.mem_get_info``), so call it after the weights are
        loaded. CPU: ``MemAvailable`` of /proc/meminfo.

        Raises:
            ValueError: `fraction` outside (0, 1], a meta device, or no block fits.
        """
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory utilization {fraction!r} must be in (0, 1]")
        dev = resolve_device(device)
        if dev.type == "cuda":
            free_bytes, _total = torch.cuda.mem_get_info(dev)
        elif dev.type == "cpu":
            free_bytes = _mem_available_bytes()
        else:
            raise ValueError(f"memory utilization cannot size a pool on device {str(dev)!r}; give num_blocks")
        return cls.blocks_for_memory(
            int(free_bytes * fraction),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
        )

    def __repr__(self) -> str:
        return (
            f"PagedKVPool(num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, block_size={self.block_size}, num_blocks={self.num_blocks}, "
            f"dtype={self.dtype}, device={self.device}, free={self.allocator.num_free})"
        )
