"""The control API as a Starlette app: one handler per endpoint over the engine in `AppState`.

The engine's methods block (they take the engine lock or wait for tokens), so the handlers call
the short ones through `asyncio.to_thread` and leave waiting on tokens and events to
`engine_adapter.serving.streams`; bodies are parsed and checked in `engine_adapter.serving.requests`
and its endpoint families (`completion_requests`, `embedding_requests`, `control_requests`);
generation requests are submitted by `engine_adapter.serving.submit`, and Anthropic's
``/v1/messages`` is served by `engine_adapter.serving.messages`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine_adapter.cache.receipts import RECEIPTS_CAPACITY
from engine_adapter.serving.completion_requests import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ChatCompletion,
    Completion,
    usage,
)
from engine_adapter.serving.control_requests import (
    POLICY_FIELDS,
    TOKEN_POLICY_FIELDS,
    logs_query,
    policy_swap,
    token_policy_swap,
    tree_query,
)
from engine_adapter.serving.embedding_requests import EMBEDDING_FIELDS, EmbeddingRequest
from engine_adapter.serving.errors import AdmissionRejected, EngineClosedError, RequestError
from engine_adapter.serving.messages import count_message_tokens, messages
from engine_adapter.serving.quota_routes import QUOTA_ROUTES
from engine_adapter.serving.requests import (
    MAX_BODY_BYTES,
    ApiError,
    dumps,
    endpoint,
    http_exception,
    json_body,
    json_response,
    unhandled_exception,
)
from engine_adapter.serving.streams import call_in_daemon_thread, completion_events, follow_events
from engine_adapter.serving.submit import final_output, submit
from engine_adapter.serving.worker_routes import SGLANG_DEFAULTS, WORKER_ROUTES, drop_router_defaults

if TYPE_CHECKING:
    from engine_adapter.serving.engine import Engine

__all__ = ["AppState", "build_app"]

log = structlog.get_logger("sage.server")


# --------------------------------------------------------------------------------------------
# The app


class _AccessLog:
    """One debug line per request: method, path, status, duration (pure ASGI: streams pass through)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            log.debug(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                duration_ms=round((time.perf_counter() - start) * 1e3, 3),
            )


@dataclass
class AppState:
    """What every handler needs: the engine, where it is served, and the one-shot shutdown.

    Attributes:
        engine: The engine facade (`engine_adapter.serving.engine.Engine`), already started.
        socket: The socket it is served on, reported by ``GET /v1/engine``.
        started: When the app was built (``GET /v1/models``' ``created``).
        request_shutdown: Drains the engine and stops the server; called once.
        max_body_bytes: The largest request body; beyond it a 413.
    """

    engine: Engine
    socket: str | None
    started: int
    request_shutdown: Callable[[], None]
    max_body_bytes: int = MAX_BODY_BYTES
    _shutdown_lock: threading.Lock = field(default_factory=threading.Lock)
    _shutdown_requested: bool = False

    def shutdown_once(self) -> None:
        """Run `request_shutdown` the first time only (the endpoint may be called again)."""
        with self._shutdown_lock:
            if self._shutdown_requested:
                return
            self._shutdown_requested = True
        self.request_shutdown()

    @property
    def served_model(self) -> str:
        model = getattr(getattr(self.engine, "config", None), "model", None)
        return str(model) if model is not None else "sage-tiny"

    @property
    def admits_requests(self) -> bool:
        return not (getattr(self.engine, "draining", False) or getattr(self.engine, "stopped", False))


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.sage
    return state


@endpoint
async def health(request: Request) -> Response:
    engine = _state(request).engine
    status = "draining" if getattr(engine, "draining", False) else "ok"
    return json_response({"status": status, "name": engine.name, "pid": os.getpid()})


@endpoint
async def engine_info(request: Request) -> Response:
    state = _state(request)
    info = dict(await asyncio.to_thread(state.engine.info))
    info["socket"] = state.socket
    info["pid"] = os.getpid()
    return json_response(info)


@endpoint
async def eviction_stats(request: Request) -> Response:
    engine = _state(request).engine
    stats = await asyncio.to_thread(engine.eviction_stats)
    token = await asyncio.to_thread(engine.token_eviction)
    answer = {**stats.to_dict(), "token_eviction": token}
    colocation = await asyncio.to_thread(engine.colocation_stats)
    if colocation is not None:  # only with --colocation: the answer is unchanged without it
        answer["colocation"] = colocation
    return json_response(answer)


@endpoint
async def token_eviction(request: Request) -> Response:
    """GET: the token-level policy and its totals; PUT: its hot swap (one route, so that a 405
    lists both methods)."""
    if request.method == "PUT":
        return await _set_token_policy(request)
    return json_response(await asyncio.to_thread(_state(request).engine.token_eviction))


async def _set_token_policy(request: Request) -> Response:
    body = await json_body(request, TOKEN_POLICY_FIELDS, "PUT /v1/eviction/token")
    policy = token_policy_swap(body)
    try:
        answer = await asyncio.to_thread(_state(request).engine.set_token_policy, policy)
    except RequestError as exc:  # its message lists the policies
        raise ApiError(400, "invalid_policy", str(exc)) from None
    log.info("token policy swapped", old=answer["old"], new=answer["new"])
    return json_response(answer)


@endpoint
async def reset_cache(request: Request) -> Response:
    freed = await asyncio.to_thread(_state(request).engine.reset_prefix_cache)
    return json_response({"freed_blocks": freed})


@endpoint
async def eviction_policies(request: Request) -> Response:
    return json_response(await asyncio.to_thread(_state(request).engine.policies))


@endpoint
async def set_policy(request: Request) -> Response:
    from sage_eviction.errors import PolicyConfigError

    body = await json_body(request, POLICY_FIELDS, "PUT /v1/eviction/policy")
    policy, params = policy_swap(body)
    try:
        answer = await asyncio.to_thread(_state(request).engine.set_policy, policy, params)
    except (PolicyConfigError, RequestError) as exc:  # their messages say what exists
        raise ApiError(400, "invalid_policy", str(exc)) from None
    log.info(
        "policy swapped", old=answer.get("old"), new=answer.get("new"), swap_time_s=answer.get("swap_time_s")
    )
    return json_response(answer)


@endpoint
async def eviction_logs(request: Request) -> Response:
    engine = _state(request).engine
    tail, follow = logs_query(request)
    if not follow:
        events = await asyncio.to_thread(engine.eviction_events, tail)
        return json_response({"events": list(events)})
    # Subscribe before reading the tail so that no event falls between the two; the events that
    # arrive in both are sent once.
    subscription = engine.subscribe_events()
    try:
        events = list(await asyncio.to_thread(engine.eviction_events, tail)) if tail else []
    except BaseException:
        engine.unsubscribe_events(subscription)
        raise
    return StreamingResponse(follow_events(engine, subscription, events), media_type="application/x-ndjson")


@endpoint
async def cache_tree(request: Request) -> Response:
    depth, max_nodes = tree_query(request)
    return json_response(await asyncio.to_thread(_state(request).engine.cache_tree, depth, max_nodes))


@endpoint
async def cache_usage(request: Request) -> Response:
    return json_response(await asyncio.to_thread(_state(request).engine.cache_usage))


@endpoint
async def cache_request(request: Request) -> Response:
    """A recent request's cache receipt and why it missed what it missed (issue 51 item 5)."""
    request_id = request.path_params["request_id"]
    answer = await asyncio.to_thread(_state(request).engine.cache_request, request_id)
    if answer is None:
        raise ApiError(
            404, "not_found", f"no cache receipt for request {request_id!r}: unknown, or older than the last "
            f"{RECEIPTS_CAPACITY} requests the engine keeps",
        )  # fmt: skip
    return json_response(answer)


@endpoint
async def completions(request: Request) -> Response:
    what = "POST /v1/completions"
    body = drop_router_defaults(
        await json_body(request, COMPLETION_FIELDS | SGLANG_DEFAULTS.keys(), what), what
    )
    state = _state(request)
    return await _serve_completion(state, Completion(body, state.served_model))


@endpoint
async def chat_completions(request: Request) -> Response:
    what = "POST /v1/chat/completions"
    # a router in front (SGLang's) adds its extension fields to every body: see worker_routes
    body = drop_router_defaults(await json_body(request, CHAT_FIELDS | SGLANG_DEFAULTS.keys(), what), what)
    state = _state(request)
    return await _serve_completion(state, ChatCompletion(body, state.served_model))


@endpoint
async def embeddings(request: Request) -> Response:
    """POST /v1/embeddings: mean-pooled, L2-normalised last hidden states of the served model,
    computed in the engine loop beside the LLM's steps (engine_adapter.serving.embedding_batch)."""
    body = await json_body(request, EMBEDDING_FIELDS, "POST /v1/embeddings")
    state = _state(request)
    parsed = EmbeddingRequest(body, state.served_model)
    if not state.admits_requests:
        raise ApiError(503, "unavailable", "the engine is shutting down and admits no new requests")
    try:
        handle = await asyncio.to_thread(
            state.engine.submit_embedding,
            parsed.inputs,
            tenant=parsed.tenant,
            priority=parsed.priority,
            slo_deadline_ms=parsed.slo_deadline_ms,
            request_id=parsed.request_id,
        )
    except RequestError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    except EngineClosedError as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    except AdmissionRejected as exc:
        raise ApiError(429, "slo_rejected", str(exc)) from None
    result = await call_in_daemon_thread(handle.result, f"sage-wait-{parsed.request_id}")
    if result.error is not None:
        kind = {429: "slo_rejected", 503: "unavailable"}.get(result.status, "engine_error")
        raise ApiError(result.status if result.status >= 400 else 500, kind, result.error)
    return json_response(parsed.answer(result.vectors, result.prompt_tokens))


@endpoint
async def models(request: Request) -> Response:
    state = _state(request)
    model = {"id": state.served_model, "object": "model", "created": state.started, "owned_by": "sage"}
    return json_response({"object": "list", "data": [model]})


async def _serve_completion(state: AppState, completion: Completion) -> Response:
    """Submit a parsed completion or chat request; stream it, or answer it whole."""
    handle = await submit(state.engine, state.admits_requests, completion)
    if completion.stream:
        return StreamingResponse(
            completion_events(completion, handle),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    output = await final_output(handle, completion.request_id)
    answer = completion.answer(output.text, output.finish_reason)
    answer["usage"] = usage(output)
    return json_response(answer)


@endpoint
async def shutdown(request: Request) -> Response:
    log.info("shutdown requested", via="api")
    # The answer goes out first; the drain starts once it is sent.
    return Response(
        dumps({"status": "draining"}),
        media_type="application/json",
        background=BackgroundTask(_state(request).shutdown_once),
    )


@endpoint
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    engine = _state(request).engine
    registry = await asyncio.to_thread(engine.metrics_registry)  # it refreshes gauges under the lock
    return Response(await asyncio.to_thread(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)


@endpoint
async def openapi(request: Request) -> Response:
    from engine_adapter.serving.openapi import openapi_document

    return json_response(openapi_document())


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/v1/engine", engine_info, methods=["GET"]),
    Route("/v1/eviction/stats", eviction_stats, methods=["GET"]),
    Route("/v1/eviction/policies", eviction_policies, methods=["GET"]),
    Route("/v1/eviction/policy", set_policy, methods=["PUT"]),
    Route("/v1/eviction/token", token_eviction, methods=["GET", "PUT"]),
    Route("/v1/eviction/logs", eviction_logs, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_message_tokens, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/cache/reset", reset_cache, methods=["POST"]),
    Route("/v1/cache/tree", cache_tree, methods=["GET"]),
    Route("/v1/cache/usage", cache_usage, methods=["GET"]),
    Route("/v1/cache/requests/{request_id}", cache_request, methods=["GET"]),
    Route("/v1/engine/shutdown", shutdown, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    *WORKER_ROUTES,
    *QUOTA_ROUTES,
]


def build_app(
    engine: Engine,
    *,
    socket_path: str | os.PathLike[str] | None = None,
    request_shutdown: Callable[[], None] | None = None,
) -> Starlette:
    """The control API of `engine` as a Starlette app.

    Args:
        engine: the engine facade (`engine_adapter.serving.engine.Engine`), already started.
        socket_path: the socket it is served on, reported by ``GET /v1/engine``; defaults to
            ``engine.config.socket``.
        request_shutdown: called (once, after the answer is sent) by ``POST /v1/engine/shutdown``;
            `serve` passes one that drains the engine and then stops uvicorn. Without it the
            endpoint drains the engine in a background thread.

    Returns:
        The app; `engine` is also at ``app.state.engine``, the `AppState` at ``app.state.sage``.
    """
    if socket_path is None:
        socket_path = getattr(getattr(engine, "config", None), "socket", None)

    def drain_in_background() -> None:
        threading.Thread(
            target=lambda: engine.shutdown(drain=True), name="sage-engine-shutdown", daemon=True
        ).start()

    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(_AccessLog)],
        exception_handlers={HTTPException: http_exception, Exception: unhandled_exception},
    )
    app.state.engine = engine
    app.state.sage = AppState(
        engine=engine,
        socket=str(socket_path) if socket_path is not None else None,
        started=int(time.time()),
        request_shutdown=request_shutdown or drain_in_background,
        max_body_bytes=getattr(getattr(engine, "config", None), "max_body_bytes", MAX_BODY_BYTES),
    )
    return app
