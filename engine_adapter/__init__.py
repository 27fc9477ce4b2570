"""engine_adapter: the paged KV pool, the radix prefix cache and the cache manager the engine uses.

Layers (DESIGN 3), each talking only to the one below through a small dataclass:

    CacheManager (cache_manager.py)  -> RadixCache (radix_cache.py) -> policy (sage_eviction)
                                      -> PagedKVPool (pool.py)

Importing this package imports neither torch nor any submodule; import what you need, e.g.
``from engine_adapter.cache_manager import CacheManager``.
"""

from __future__ import annotations

__all__: list[str] = []
