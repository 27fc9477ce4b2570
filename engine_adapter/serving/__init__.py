"""The serving engine.

    config.py     EngineConfig: flags > environment > YAML > defaults, checked in one place
    scheduler.py  continuous batching with chunked prefill and preemption by recompute
    engine.py     Engine: the model, the pool, the cache manager and the scheduler on one loop
    server.py     the control server: OpenAI-style completions, eviction control, metrics
    metrics.py    Prometheus metrics of the engine and its cache

Importing this package imports no submodule (the engine imports torch); import what you need.
"""

from __future__ import annotations

__all__: list[str] = []
