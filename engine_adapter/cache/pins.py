"""Pins: cached prefixes (system prompts) held against eviction, up to `max_pinned_ratio` of the pool.

`Pins` finds the cached full-block prefix of a prompt (`prompt_keys`) and pins or unpins it in
the radix index, which keeps the pin counts (pins nest and cover whole root paths). `pin`
returns a `PinnedPrefix` to hand back to `unpin`. Called under the cache manager's lock.
Imports `cached_block`, `errors`, `prompt_keys`, `radix_cache` and `records`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.errors import BlockStateError
from engine_adapter.cache.prompt_keys import PromptKeys
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import PinnedPrefix

__all__ = ["Pins"]


class Pins:
    """Pinning and unpinning prompts' cached prefixes in one radix index.

    Args:
        radix: The index that keeps the pin counts.
        keys: How a prompt names blocks.
    """

    __slots__ = ("_keys", "_radix")

    def __init__(self, radix: RadixCache, keys: PromptKeys) -> None:
        self._radix = radix
        self._keys = keys

    def _cached_prefix(
        self,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        tenant: str | None,
        cache_salt: str | None,
    ) -> list[CachedBlock]:
        return self._radix.match(self._keys.prefix(token_ids, block_keys, tenant, cache_salt))

    def pin(
        self,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        tenant: str | None,
        cache_salt: str | None,
    ) -> PinnedPrefix:
        """Pin the cached part of a prompt's full-block prefix (one more pin on each block).

        Raises:
            PinLimitError: More than `max_pinned_ratio` of the pool would be pinned; nothing changed.
        """
        path = self._cached_prefix(token_ids, block_keys, tenant, cache_salt)
        return PinnedPrefix(tuple(b.key for b in path), len(path), self._radix.pin(path))

    def unpin(
        self,
        prefix: PinnedPrefix | Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        tenant: str | None,
        cache_salt: str | None,
    ) -> int:
        """Drop one pin from a `PinnedPrefix`, or from the leading pinned run of a prompt's cached
        prefix (given by token ids or keys); returns blocks no longer pinned at all.

        Raises:
            BlockStateError: A block of a `PinnedPrefix` is no longer cached or pinned; nothing
                changed.
        """
        if isinstance(prefix, PinnedPrefix):
            path = self._radix.match(prefix.keys)
            if len(path) != prefix.num_blocks:
                raise BlockStateError(
                    f"pinned prefix of {prefix.num_blocks} blocks has only {len(path)} cached"
                )
        else:
            path = self._cached_prefix(prefix, block_keys, tenant, cache_salt)
            run = 0
            while run < len(path) and path[run].pin_count > 0:
                run += 1
            path = path[:run]
        return self._radix.unpin(path)
