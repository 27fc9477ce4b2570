"""The serving engine: the scheduler, the engine loop and its control API.

The engine (a request's way in and out):

    config.py               EngineConfig: flags > environment > YAML > defaults, checked in one place
    engine.py               Engine: the parts' assembly, the loop thread and its inbox, submission,
                            colocation's admission in the loop
    engine_thread.py        the one thread that owns torch: threads, load, warm-up, steps
    engine_parts.py         the builders of the parts: the pool's size, the cache manager,
                            token-level eviction, colocation's gates
    intake.py               RequestIntake: a request's checks against the model and the pool, its SLOs
    control.py              EngineControl (the base of Engine): the control plane's queries and swaps
    handles.py              RequestHandle: a submitted completion's deltas and result
    errors.py               RequestError, EngineClosedError, AdmissionRejected
    engine_hooks.py         EngineHooks: the engine's SchedulerHooks (metrics, lifetime, colocation)
    colocation.py           ColocationGates (the scheduler's side) and EngineColocation (the loop's)
    metrics.py              EngineMetrics: the sage:* Prometheus metrics, declared in one table
    cache_histograms.py     the cache's age histograms and regret on /metrics, read at each scrape
    quota_metrics.py        SaltQuotaMetrics: the per-salt quotas on /metrics (salts with one only)
    account_metrics.py      AccountCounters: the prompt cache's totals per tenant and salt on /metrics

The scheduler (one step: admit, reserve or preempt, forward, sample, release):

    scheduler.py            Scheduler: admission, reservation and preemption, the step
    sequence.py             its records: Sequence, RequestOutput, SchedulerLimits, StepStats
    hooks.py                SchedulerHooks, what it tells its owner and asks it; NoHooks
    outputs.py              a sequence's text, stop strings and the deltas it emits
    compression.py          SequenceCompressor: token-level eviction in the step
    prefetch.py             QueuePrefetch: the queue's host/disk prefixes loaded while they wait
    prefix_compression.py   PrefixCompressor: compress-on-evict's compactions of cached prefixes
    embedding_batch.py      embedding requests' records and handle
    embedding_scheduler.py  EmbeddingScheduler: the embedding queue and each step's chunks

The control API (HTTP/1.1 JSON on the engine's socket):

    server.py               the engine process: socket, pid file, uvicorn, signals, draining shutdown
    app.py                  one handler per endpoint over the engine (`AppState`)
    requests.py             errors as JSON, the body within its limit, the shared field checks
    completion_requests.py  POST /v1/completions and /v1/chat/completions, OpenAI-shaped answers
    messages_requests.py    POST /v1/messages: Anthropic's body, its cache_control markers
    messages.py             POST /v1/messages and count_tokens: Anthropic's answer, stream and errors
    prompt_cache.py         the providers' prompt-cache fields as a CacheContract; read/written usage
    submit.py               a generation request of either API submitted, its refusals as ApiError
    embedding_requests.py   POST /v1/embeddings
    control_requests.py     the policy swaps, the logs' and the tree's queries
    quota_routes.py         PUT/GET/DELETE /v1/cache/quotas/{salt}, GET /v1/cache/quotas
    streams.py              SSE completion chunks and NDJSON eviction events, in daemon threads
    http_limits.py          what uvicorn does not bound: deadlines, a connection cap, JSON errors
    auth.py                 the API key over TCP (a bearer token, or x-api-key)
    openapi.py              the OpenAPI document of all of it (docs/openapi.json), from
                            openapi_types.py (the shared schema parts), openapi_schemas.py,
                            openapi_messages.py (Anthropic's API, the prompt-cache fields),
                            openapi_quotas.py (the per-salt quotas) and openapi_receipts.py
                            (a request's cache receipt, the totals per salt)
    worker_routes.py        the routes routers call on their workers (server/model info, load, flush)
    kv_events.py            KV cache events in vLLM's format over ZMQ, off the engine thread

Imports: `engine_adapter.model`, `engine_adapter.cache`, `engine_adapter.token_eviction`,
`engine_adapter.colocation`, `engine_adapter.paths` and `engine_adapter.safe_yaml` (the
config), and `sage_eviction`; never `engine_adapter.sim` or `sage_cli`. Within
the package the scheduler's modules never import the engine's, and the control API's modules
import the engine only for types (`server.py` inside the function that starts it): the engine
imports torch, and `errors.py`, `requests.py` and its endpoint families do not. Importing this
package imports no submodule; import what you need.
"""

from __future__ import annotations

__all__: list[str] = []
