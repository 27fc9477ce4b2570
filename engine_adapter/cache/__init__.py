"""The cache core: pure Python (the radix cache's hot paths optionally compiled), never torch.

    block_allocator.py  BlockAllocator: the free list of the pool's block ids
    radix_cache.py      RadixCache: full blocks keyed by chained hashes, ref counts, pins,
                        leaf-only eviction through the policy
    _core.pyx           the radix cache's hot paths in C (optional; radix_cache.py is the
                        reference and the fallback)
    cache_manager.py    CacheManager: the one object the scheduler, server and simulator drive
    events.py           EvictionEventLog: eviction events as JSON lines, ring buffer, subscribers
    errors.py           the cache's exception tree
    sizes.py            byte sizes such as "2GiB"

Importing this package imports no submodule; import what you need.
"""

from __future__ import annotations

__all__: list[str] = []
