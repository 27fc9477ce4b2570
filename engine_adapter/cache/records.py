"""The records the cache manager hands across its boundary: allocations, lookups, swaps, sequences.

What comes in is a `request.CacheRequest`; these go out (and `SequenceState` is what the manager
keeps per running sequence). Imports only `cached_block`, `compressed` and `request`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.compressed import CompressedPrefix
from engine_adapter.cache.request import CacheRequest

__all__ = ["Allocation", "LookupResult", "PinnedPrefix", "SequenceState", "SwapResult"]


@dataclass(slots=True)
class Allocation:
    """What `allocate` gives the scheduler.

    Attributes:
        sequence_id: The sequence.
        block_table: Its pool block ids in token order (a copy).
        num_cached_blocks: Leading blocks served from the prefix cache (already computed).
        num_cached_tokens: ``num_cached_blocks * block_size``: the prefill starts here.
        num_new_blocks: Blocks freshly allocated for tokens to compute.
        num_evicted_blocks: Blocks evicted to make room.
        num_host_blocks: Of the cached blocks, those loaded back from the host tier (into fresh
            blocks; the moves are in `CacheManager.take_moves`, to run before the prefill).
        num_disk_blocks: Of the cached blocks, those loaded back from the disk tier.
        num_compressed_blocks: Of the cached blocks, those of a compressed prefix (they follow
            the tree's; `num_cached_tokens` counts the tokens they stand for, not hold).
        num_compressed_tokens: Tokens of the prompt served from that compressed prefix.
        compressed_kept: Tokens per layer and KV head its blocks hold (the rest of its last
            block is padding, to mask from attention).
        compressed_key: The compressed prefix's name (the engine keeps its kept positions), or
            None without a compressed hit.
    """

    sequence_id: int
    block_table: list[int]
    num_cached_blocks: int
    num_cached_tokens: int
    num_new_blocks: int
    num_evicted_blocks: int
    num_host_blocks: int = 0
    num_disk_blocks: int = 0
    num_compressed_blocks: int = 0
    num_compressed_tokens: int = 0
    compressed_kept: int = 0
    compressed_key: Hashable | None = None


@dataclass(slots=True)
class LookupResult:
    """What `lookup` finds, without changing anything.

    Attributes:
        num_cached_blocks: Leading full blocks cached now.
        num_cached_tokens: Tokens they hold.
        num_new_blocks: Blocks an `allocate` would have to take from the pool.
        num_available_blocks: Free blocks plus blocks eviction could reclaim (not counting the hit).
        fits: Whether `allocate` would succeed now.
    """

    num_cached_blocks: int
    num_cached_tokens: int
    num_new_blocks: int
    num_available_blocks: int
    fits: bool


@dataclass(slots=True)
class PinnedPrefix:
    """A pinned prefix, to hand back to `unpin`."""

    keys: tuple[Hashable, ...]
    num_blocks: int
    num_newly_pinned: int


@dataclass(slots=True)
class SwapResult:
    """The outcome of a hot swap (`PUT /v1/eviction/policy`)."""

    old_name: str
    old_params: dict[str, Any]
    new_name: str
    new_params: dict[str, Any]
    swap_time_s: float
    entries: int
    entries_time_s: float
    build_time_s: float

    def to_dict(self) -> dict[str, Any]:
        """The API's response shape."""
        return {
            "old": {"name": self.old_name, "params": dict(self.old_params)},
            "new": {"name": self.new_name, "params": dict(self.new_params)},
            "swap_time_s": self.swap_time_s,
            "entries": self.entries,
        }


@dataclass(slots=True)
class SequenceState:
    """A running sequence's blocks, as the manager keeps them (read-only for callers).

    ``block_table[:len(cached_path)]`` are cached blocks this sequence holds a reference on
    (a root path of the tree); the rest are private to it until it is freed. What the request
    brought (tenant, priority, deadline, ...) is `request`, as the caller built it.
    """

    request: CacheRequest
    block_table: list[int]
    cached_path: list[CachedBlock]
    keys: list[Hashable]  # known keys of its full blocks
    salt: str | None
    num_prompt_tokens: int
    num_tokens: int  # tokens its blocks are reserved for
    num_prompt_blocks: int = 0  # ceil(num_prompt_tokens / block_size)
    prefix_idle: float | None = None  # seconds its cached prefix had been idle at admission
    created_at: float = 0.0
    last_access: float = 0.0
    access_count: int = 1
    # Token-level eviction compacted its K/V: its blocks no longer hold the prefix its tokens
    # name, so they are never committed to nor shared through the prefix cache.
    compressed: bool = False
    # The compressed prefix it hit (`compressed`): its blocks follow `cached_path` in the table,
    # read-only and locked, never freed by this sequence.
    compressed_prefix: CompressedPrefix | None = None
    # Blocks past this index are not cached at its finish (explicit writes, generated tokens
    # not cached; `retention`); None: no limit.
    write_limit: int | None = None
    retain_until: float | None = None  # the expiry its writes and hits get (a lifetime asked)
    # Blocks from this index on get `short_until` instead (`CacheContract.short_ttl`); None: all
    # get `retain_until`. The shorter lifetime is the deeper one: parents outlive children.
    short_from: int | None = None
    short_until: float | None = None

    @property
    def private_blocks(self) -> list[int]:
        """Its blocks that neither the tree nor a compressed prefix owns."""
        entry = self.compressed_prefix
        skip = len(self.cached_path) + (0 if entry is None else len(entry.blocks))
        return self.block_table[skip:]

    @property
    def sequence_id(self) -> int:
        """The sequence's id (its request's)."""
        return self.request.sequence_id

    @property
    def num_cached_blocks(self) -> int:
        """Leading blocks shared with the prefix cache."""
        return len(self.cached_path)
