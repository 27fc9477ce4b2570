"""engine_adapter: the engine process of sage, a folder per layer.

    cache/           the torch-free cache core: CacheRequest, the CacheManager front over its
                     parts (admission, running sequences, queue protection, reservations,
                     compaction, pins, eviction, the policy binding, metrics), the radix prefix
                     cache (compiled core optional), the block allocator, eviction events
    model/           the transformer: config, tokenizer, chat templates, weights loaders (GGUF,
                     safetensors), the paged KV pool (the K/V tensors over the cache core's
                     allocator), the decoder, sampling, pooling
    colocation/      LLM + embedding colocation (spec 004): Algorithms 1-3 and the controller,
                     pure Python, called by the engine and by the simulator
    token_eviction/  token-level eviction inside a sequence (spec 002): a torch-free registry
                     of token policies, one press per file, the memory-pressure monitor
    serving/         the engine: config, the continuous-batching scheduler and its hooks, the
                     engine loop, the control server on a Unix socket, Prometheus metrics
    sim/             the trace-driven simulator over the same cache core (never torch):
                     workloads, cost model, sweeps, `sage llm benchmark --mode sim`, and the
                     colocation study
    paths.py         where an engine's files live ($SAGE_HOME, socket, pid, logs)
    safe_yaml.py     YAML read with limits (configs, cost models)

Imports point down only: serving and sim (independent of each other) over token_eviction, over
model and colocation (independent), over cache, over paths and safe_yaml; nothing here imports
sage_cli. The import-linter contracts in pyproject.toml check it (docs/architecture.md,
"Layers").

Importing this package imports neither torch nor any submodule; import what you need, e.g.
``from engine_adapter.cache.cache_manager import CacheManager``.
"""

from __future__ import annotations

__all__: list[str] = []
