"""The state of a cache manager that a failed call must leave alone (shared by the cache tests)."""

from __future__ import annotations

from typing import Any

from engine_adapter.cache.cache_manager import CacheManager


def snapshot(m: CacheManager) -> Any:
    """Free list, tree, policy entries, block tables and the counters (not the timings)."""
    stats = m.stats()
    return (
        m.allocator.free_block_ids(),
        [(b.key, b.block_id, b.ref_count, b.pin_count, b.evictable) for b in m.radix.blocks()],
        [(e.key, e.evictable) for e in m.policy.entries()],
        {s: list(m.sequence(s).block_table) for s in m.sequence_ids()},
        {k: v for k, v in stats.to_dict().items() if "time" not in k},
    )
