"""The serving engine.

    config.py     EngineConfig: flags > environment > YAML > defaults, checked in one place
    scheduler.py  continuous batching with chunked prefill and preemption by recompute
    engine.py     Engine: the model, the pool, the cache manager and the scheduler on one loop
    requests.py   the control API's request parsing, errors as JSON, OpenAI-shaped answers
    app.py        the control API: one handler per endpoint over the engine (`AppState`)
    streams.py    SSE completion chunks and NDJSON eviction events, in daemon threads
    server.py     the engine process: socket, pid file, uvicorn, signals, draining shutdown
    metrics.py    Prometheus metrics of the engine and its cache

Importing this package imports no submodule (the engine imports torch); import what you need.
"""

from __future__ import annotations

__all__: list[str] = []
