"""Pool use by tenant and by priority class: ``GET /v1/cache/usage``, the top view, per-tenant metrics.

Cached blocks count by their policy record (tenant, priority); a running sequence's private
blocks by its request. O(n) in the cached blocks, under the cache manager's lock; not for hot
paths. Imports `block_allocator`, `radix_cache` and `records`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SequenceState

__all__ = ["PRIORITY_CLASSES", "pool_usage"]

PRIORITY_CLASSES = {0: "low", 1: "normal", 2: "high"}
"""The module spec's priority classes, for pool use by class."""


def pool_usage(
    pool: BlockAllocator, radix: RadixCache, sequences: Iterable[SequenceState], reserved_blocks: int
) -> dict[str, Any]:
    """The pool's counts, and its used blocks by tenant (``-``: none) and by priority class.

    Args:
        pool: The free list.
        radix: The radix index.
        sequences: The running sequences.
        reserved_blocks: Blocks held by reservations (counted in neither split).
    """
    by_tenant: dict[str, int] = {}
    by_class: dict[str, int] = {}

    def add(tenant: str | None, priority: int, n: int) -> None:
        if n <= 0:
            return
        t = "-" if tenant is None else tenant
        c = PRIORITY_CLASSES.get(priority, f"priority {priority}")
        by_tenant[t] = by_tenant.get(t, 0) + n
        by_class[c] = by_class.get(c, 0) + n

    for block in radix.blocks():
        add(block.meta.tenant, block.meta.priority, 1)
    for seq in sequences:
        add(seq.request.tenant, seq.request.priority, len(seq.block_table) - len(seq.cached_path))
    return {
        "num_blocks": pool.num_blocks,
        "used_blocks": pool.num_used,
        "free_blocks": pool.num_free,
        "cached_blocks": len(radix),
        "evictable_blocks": radix.num_evictable,
        "pinned_blocks": radix.num_pinned,
        "reserved_blocks": reserved_blocks,
        "by_tenant": by_tenant,
        "by_class": by_class,
    }
