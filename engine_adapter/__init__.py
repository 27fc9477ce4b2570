"""engine_adapter: the engine process of sage, in four layers a folder each.

    cache/    the torch-free cache core: block allocator (free list of block ids), radix prefix
              cache, cache manager (allocation, eviction through a `sage_eviction` policy, hot
              swap, stats), eviction events, errors
    model/    the transformer: config, tokenizer, weights loaders, the paged KV pool (the K/V
              tensors, holding the cache core's allocator), the decoder, sampling
    serving/  the engine: config, continuous-batching scheduler, the engine loop, the control
              server on a Unix socket, Prometheus metrics
    sim/      the trace-driven simulator: workloads, cost model, the simulation over the cache
              core (never torch), `sage llm benchmark --mode sim`

Dependencies point down only: serving -> model, cache; model -> cache (the allocator);
sim -> cache. docs/architecture.md draws the layers and the contracts between them.

Importing this package imports neither torch nor any submodule; import what you need, e.g.
``from engine_adapter.cache.cache_manager import CacheManager``.
"""

from __future__ import annotations

__all__: list[str] = []
