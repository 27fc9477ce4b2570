"""The control API as a Starlette app: one handler per endpoint over the engine in `AppState`.

The engine's methods block (they take the engine lock or wait for tokens), so the handlers call
the short ones through `asyncio.to_thread` and wait for tokens and events in daemon threads of
their own (`_ThreadPump`), so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from engine_adapter.serving.engine import Engine

from engine_adapter.serving.requests import (
    _CHAT_FIELDS,
    _COMPLETION_FIELDS,
    _LOGS_QUERY,
    _POLICY_FIELDS,
    FOLLOW_POLL_S,
    MAX_LOG_TAIL,
    ApiError,
    _bad_value,
    _ChatCompletion,
    _Completion,
    _dumps,
    _endpoint,
    _http_exception,
    _json_body,
    _json_response,
    _sse,
    _unhandled_exception,
    _usage,
)

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
    """

    engine: Engine
    socket: str | None
    started: int
    request_shutdown: Callable[[], None]
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


@_endpoint
async def health(request: Request) -> Response:
    engine = _state(request).engine
    status = "draining" if getattr(engine, "draining", False) else "ok"
    return _json_response({"status": status, "name": engine.name, "pid": os.getpid()})


@_endpoint
async def engine_info(request: Request) -> Response:
    state = _state(request)
    info = dict(await asyncio.to_thread(state.engine.info))
    info["socket"] = state.socket
    info["pid"] = os.getpid()
    return _json_response(info)


@_endpoint
async def eviction_stats(request: Request) -> Response:
    stats = await asyncio.to_thread(_state(request).engine.eviction_stats)
    return _json_response(stats.to_dict())


@_endpoint
async def reset_cache(request: Request) -> Response:
    freed = await asyncio.to_thread(_state(request).engine.reset_prefix_cache)
    return _json_response({"freed_blocks": freed})


@_endpoint
async def eviction_policies(request: Request) -> Response:
    return _json_response(await asyncio.to_thread(_state(request).engine.policies))


@_endpoint
async def set_policy(request: Request) -> Response:
    from engine_adapter.serving.engine import RequestError
    from sage_eviction.errors import PolicyConfigError

    body = await _json_body(request, _POLICY_FIELDS, "PUT /v1/eviction/policy")
    policy = body.get("policy")
    if not isinstance(policy, str) or not policy:
        raise _bad_value("policy", f"must be a policy name, got {policy!r}")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _bad_value("params", f"must be an object of policy params, got {params!r}")
    try:
        answer = await asyncio.to_thread(_state(request).engine.set_policy, policy, params)
    except (PolicyConfigError, RequestError) as exc:  # their messages say what exists
        raise ApiError(400, "invalid_policy", str(exc)) from None
    log.info(
        "policy swapped", old=answer.get("old"), new=answer.get("new"), swap_time_s=answer.get("swap_time_s")
    )
    return _json_response(answer)


def _logs_query(request: Request) -> tuple[int, bool]:
    """``tail`` and ``follow`` of ``GET /v1/eviction/logs``, checked."""
    unknown = sorted(set(request.query_params) - _LOGS_QUERY)
    if unknown:
        raise ApiError(
            400,
            "unknown_field",
            f"unknown query parameter {', '.join(map(repr, unknown))}; accepted: follow, tail",
        )
    raw_tail = request.query_params.get("tail", "100")
    try:
        tail = int(raw_tail)
    except ValueError:
        raise _bad_value("tail", f"must be an integer, got {raw_tail!r}") from None
    if not 0 <= tail <= MAX_LOG_TAIL:
        raise _bad_value("tail", f"must be between 0 and {MAX_LOG_TAIL}, got {tail}")
    raw_follow = request.query_params.get("follow", "false").lower()
    if raw_follow not in ("true", "false", "1", "0"):
        raise _bad_value("follow", f"must be true or false, got {raw_follow!r}")
    return tail, raw_follow in ("true", "1")


@_endpoint
async def eviction_logs(request: Request) -> Response:
    engine = _state(request).engine
    tail, follow = _logs_query(request)
    if not follow:
        events = await asyncio.to_thread(engine.eviction_events, tail)
        return _json_response({"events": list(events)})
    # Subscribe before reading the tail so that no event falls between the two; the events that
    # arrive in both are sent once.
    subscription = engine.subscribe_events()
    try:
        events = list(await asyncio.to_thread(engine.eviction_events, tail)) if tail else []
    except BaseException:
        engine.unsubscribe_events(subscription)
        raise
    return StreamingResponse(_follow(engine, subscription, events), media_type="application/x-ndjson")


@_endpoint
async def completions(request: Request) -> Response:
    body = await _json_body(request, _COMPLETION_FIELDS, "POST /v1/completions")
    state = _state(request)
    return await _serve_completion(state, _Completion(body, state.served_model))


@_endpoint
async def chat_completions(request: Request) -> Response:
    body = await _json_body(request, _CHAT_FIELDS, "POST /v1/chat/completions")
    state = _state(request)
    return await _serve_completion(state, _ChatCompletion(body, state.served_model))


@_endpoint
async def models(request: Request) -> Response:
    state = _state(request)
    model = {"id": state.served_model, "object": "model", "created": state.started, "owned_by": "sage"}
    return _json_response({"object": "list", "data": [model]})


def _submit(engine: Engine, completion: _Completion, sampling: Any) -> Any:
    prompt = completion.prompt
    if isinstance(completion, _ChatCompletion):
        prompt = engine.chat_prompt(prompt)
    return engine.submit(
        prompt,
        sampling,
        priority=completion.priority,
        tenant=completion.tenant,
        cache_salt=completion.cache_salt,
        request_id=completion.request_id,
    )


async def _serve_completion(state: AppState, completion: _Completion) -> Response:
    """Submit a parsed completion or chat request; stream it, or answer it whole."""
    from engine_adapter.serving.engine import EngineClosedError, RequestError

    sampling = completion.sampling_params()
    if not state.admits_requests:
        raise ApiError(503, "unavailable", "the engine is shutting down and admits no new requests")
    try:
        handle = await asyncio.to_thread(_submit, state.engine, completion, sampling)
    except RequestError as exc:  # it can never be served
        raise ApiError(400, "invalid_request", str(exc)) from None
    except EngineClosedError as exc:  # it began draining between the check and the submit
        raise ApiError(503, "unavailable", str(exc)) from None
    if completion.stream:
        return StreamingResponse(
            _stream_completion(completion, handle),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    output = await _call_in_daemon_thread(handle.result, f"sage-wait-{completion.request_id}")
    if output.finish_reason == "error":
        raise ApiError(500, "engine_error", output.error or "the engine failed on this request")
    answer = completion.answer(output.text, output.finish_reason)
    answer["usage"] = _usage(output)
    return _json_response(answer)


@_endpoint
async def shutdown(request: Request) -> Response:
    log.info("shutdown requested", via="api")
    # The answer goes out first; the drain starts once it is sent.
    return Response(
        _dumps({"status": "draining"}),
        media_type="application/json",
        background=BackgroundTask(_state(request).shutdown_once),
    )


@_endpoint
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    engine = _state(request).engine
    registry = await asyncio.to_thread(engine.metrics_registry)  # it refreshes gauges under the lock
    return Response(await asyncio.to_thread(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/v1/engine", engine_info, methods=["GET"]),
    Route("/v1/eviction/stats", eviction_stats, methods=["GET"]),
    Route("/v1/eviction/policies", eviction_policies, methods=["GET"]),
    Route("/v1/eviction/policy", set_policy, methods=["PUT"]),
    Route("/v1/eviction/logs", eviction_logs, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/cache/reset", reset_cache, methods=["POST"]),
    Route("/v1/engine/shutdown", shutdown, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
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
        exception_handlers={HTTPException: _http_exception, Exception: _unhandled_exception},
    )
    app.state.engine = engine
    app.state.sage = AppState(
        engine=engine,
        socket=str(socket_path) if socket_path is not None else None,
        started=int(time.time()),
        request_shutdown=request_shutdown or drain_in_background,
    )
    return app


_END = object()


class _ThreadPump:
    """Runs a blocking iterator in a daemon thread and hands its items to the event loop.

    Waiting on the engine (a request's tokens, new eviction events) blocks for as long as the
    engine takes. A thread of the loop's default executor per waiting request would cap the
    concurrent requests at its size (min(32, cores + 4)), and a non-daemon worker stuck on a
    request could hold the process at exit; one daemon thread per waiting request has neither
    problem. Iterate with ``async for``; an exception of the iterator is raised there.
    """

    def __init__(self, items: Iterator[Any], name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()  # set when the consumer is gone: the producer stops early
        threading.Thread(target=self._run, args=(items,), name=name, daemon=True).start()

    def _post(self, item: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody will read
            return False
        return True

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if self.cancelled.is_set() or not self._post(item):
                    return
            self._post(_END)
        except BaseException as exc:
            self._post(exc)

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancelled.set()


async def _call_in_daemon_thread(fn: Callable[[], Any], name: str) -> Any:
    """`fn()` in a daemon thread of its own (see `_ThreadPump`), awaited without blocking the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        def settle() -> None:
            if not future.done():  # the awaiting handler may have been cancelled
                setter(value)

        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            deliver(future.set_exception, exc)
        else:
            deliver(future.set_result, result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


def _new_events(
    engine: Engine, subscription: queue.Queue[dict[str, Any]], cancelled: Callable[[], bool]
) -> Iterator[dict[str, Any]]:
    """The events put on `subscription`, until the engine stops (then what is left) or `cancelled()`."""
    while not cancelled():
        try:
            yield subscription.get(timeout=FOLLOW_POLL_S)
        except queue.Empty:
            if getattr(engine, "stopped", False):
                break
    while not cancelled():
        try:
            yield subscription.get_nowait()
        except queue.Empty:
            return


async def _follow(
    engine: Engine, subscription: queue.Queue[dict[str, Any]], tail: list[dict[str, Any]]
) -> AsyncIterator[str]:
    """NDJSON: the tail, then each new event until the engine stops or the client goes away."""
    seen = {_dumps(event) for event in tail}
    stop = threading.Event()
    try:
        for event in tail:
            yield _dumps(event) + "\n"
        async for event in _ThreadPump(_new_events(engine, subscription, stop.is_set), "sage-follow"):
            line = _dumps(event)
            if seen:
                if line in seen:  # delivered with the tail already
                    seen.discard(line)
                    continue
                seen.clear()  # past the overlap: nothing more can repeat
            yield line + "\n"
    finally:
        stop.set()
        engine.unsubscribe_events(subscription)


async def _stream_completion(completion: _Completion, handle: Any) -> AsyncIterator[str]:
    """Server-sent events: one chunk per delta, the finish reason and usage last, then [DONE]."""
    finished = False
    try:
        async for output in _ThreadPump(iter(handle), f"sage-stream-{completion.request_id}"):
            if output.finished:
                finished = True
                if output.finish_reason == "error":
                    message = output.error or "the engine failed on this request"
                    yield _sse({"error": {"type": "engine_error", "message": message}})
                    break
                chunk = completion.chunk(output.text, output.finish_reason)
                chunk["usage"] = _usage(output)
                yield _sse(chunk)
                if completion.include_usage:
                    usage_chunk = completion.chunk("", None)
                    usage_chunk["choices"] = []
                    usage_chunk["usage"] = _usage(output)
                    yield _sse(usage_chunk)
                break
            if output.text:
                yield _sse(completion.chunk(output.text, None))
    except Exception as exc:
        log.error("stream failed", request_id=completion.request_id, exc_info=exc)
        yield _sse({"error": {"type": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
    finally:
        if not finished:
            handle.abort()  # the client went away, or the stream failed: free the slot
    yield "data: [DONE]\n\n"
