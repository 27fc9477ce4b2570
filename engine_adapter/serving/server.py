"""The engine's control server: a Starlette app over a Unix socket (docs/architecture.md, "Control API").

    GET  /health                   {"status", "name", "pid"}
    GET  /v1/engine                engine info, plus "socket" and "pid"
    GET  /v1/eviction/stats        eviction statistics (docs/architecture.md, "Metrics")
    GET  /v1/eviction/policies     the policies and their params, and the active one
    PUT  /v1/eviction/policy       hot swap: {"policy", "params"} -> {"old", "new", "swap_time_s", "entries"}
    GET  /v1/eviction/logs         ?tail=N (default 100) -> {"events"}; &follow=true streams NDJSON
    POST /v1/completions           OpenAI-compatible text completion; "stream": true sends SSE
                                   (sage extensions: priority, tenant, cache_salt, ignore_eos)
    POST /v1/cache/reset           drop every unreferenced cached block -> {"freed_blocks"}
    POST /v1/engine/shutdown       {"status": "draining"}, then a draining shutdown
    GET  /metrics                  Prometheus text

Every error, from a malformed body to an unknown route or a bug, is answered as JSON:
``{"error": {"type": str, "message": str}}`` with a 4xx or 5xx status; never an HTML page or a
traceback. The engine's methods block (they take the engine lock or wait for tokens), so the
handlers call the short ones through `asyncio.to_thread` and wait for tokens and events in
daemon threads of their own (`_ThreadPump`), so the event loop keeps serving.

`serve(config)` is the engine process: it binds the socket itself (mode 0600 from the moment it
exists), writes ``<stem>.pid`` next to it, builds and starts the `Engine`, runs uvicorn on the
bound socket, and on SIGTERM, SIGINT or ``POST /v1/engine/shutdown`` drains the engine, stops
uvicorn, removes the socket and the pid file and returns 0. Run it as
``python -m engine_adapter.serving.server --config-json '{"name": "default", ...}'``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import json
import math
import os
import queue
import signal
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
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
    from engine_adapter.serving.config import EngineConfig
    from engine_adapter.serving.engine import Engine

__all__ = ["ApiError", "build_app", "main", "serve"]

log = structlog.get_logger("sage.server")

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_LOG_TAIL = 1_000_000
FOLLOW_POLL_S = 0.5  # how long a follow stream waits on the event queue before checking the engine

# The top-level fields of POST /v1/completions: OpenAI's that we serve, and sage's extensions.
_COMPLETION_FIELDS = frozenset(
    {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
        "stream_options", "user", "n", "logprobs", "echo",
        "priority", "tenant", "cache_salt", "ignore_eos",
    }
)  # fmt: skip
_CHAT_FIELDS = (_COMPLETION_FIELDS - {"prompt", "echo"}) | {"messages", "max_completion_tokens"}
_POLICY_FIELDS = frozenset({"policy", "params"})
_LOGS_QUERY = frozenset({"tail", "follow"})


# --------------------------------------------------------------------------------------------
# Errors and JSON


class ApiError(Exception):
    """An error answered to the client as ``{"error": {"type", "message"}}`` with `status`."""

    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers

    def response(self) -> Response:
        return _error_response(self.status, self.type, self.message, self.headers)


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity somewhere: send null rather than fail the request
        return json.dumps(_finite(value), allow_nan=False, separators=(",", ":"))


def _json_response(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(_dumps(value), status_code=status, headers=headers, media_type="application/json")


def _error_response(
    status: int, type_: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return _json_response({"error": {"type": type_, "message": message}}, status, headers)


_HTTP_ERROR_TYPES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    503: "unavailable",
}


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405 (route without this method), as JSON."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 404:
        message = f"no route {request.url.path}"
    elif status == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method {request.method} not allowed on {request.url.path}; allowed: {allowed}"
    else:
        message = str(exc.detail)
    return _error_response(status, _HTTP_ERROR_TYPES.get(status, "http_error"), message, exc.headers)


async def _unhandled_exception(request: Request, exc: Exception) -> Response:
    """The last resort, for an exception raised outside an endpoint (a middleware)."""
    log.error("unhandled exception", path=request.url.path, exc_info=exc)
    return _error_response(500, "internal_error", f"internal server error: {type(exc).__name__}: {exc}")


Endpoint = Callable[[Request], Awaitable[Response]]


def _endpoint(fn: Endpoint) -> Endpoint:
    """Turn `ApiError` into its answer and any other exception into a logged 500, both as JSON."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except ApiError as exc:
            return exc.response()
        except Exception as exc:
            log.error("request failed", method=request.method, path=request.url.path, exc_info=exc)
            return _error_response(
                500, "internal_error", f"internal server error: {type(exc).__name__}: {exc}"
            )

    return wrapper


async def _json_body(request: Request, allowed: frozenset[str], what: str) -> dict[str, Any]:
    """The request's body as a JSON object with no field outside `allowed`."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(413, "request_too_large", f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, "request_too_large", f"body of {len(raw)} bytes exceeds {MAX_BODY_BYTES}")
    if not raw.strip():
        raise ApiError(400, "invalid_json", f"{what}: the body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"{what}: malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(
            400, "invalid_request", f"{what}: the body must be a JSON object, not {type(body).__name__}"
        )
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            400,
            "unknown_field",
            f"{what}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(sorted(allowed))}",
        )
    return body


def _bad_value(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid_value", f"{field!r}: {message}")


def _opt_int(body: dict[str, Any], field: str, *, minimum: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad_value(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise _bad_value(field, f"must be >= {minimum}, got {value}")
    return value


def _opt_float(body: dict[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad_value(field, f"must be a number, got {value!r}")
    return float(value)


def _opt_str(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad_value(field, f"must be a string, got {value!r}")
    return value


def _opt_bool(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad_value(field, f"must be true or false, got {value!r}")
    return value


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _prompt(body: dict[str, Any]) -> str | list[int]:
    """`prompt`: a string or a list of token ids; a batch of exactly one of either is unwrapped."""
    if "prompt" not in body or body["prompt"] is None:
        raise ApiError(400, "invalid_value", "'prompt' is required: a string or a list of token ids")
    prompt = body["prompt"]
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and (isinstance(prompt[0], str) or _is_token_ids(prompt[0]))
    ):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise _bad_value("prompt", f"batches of prompts are not served ({len(prompt)} given); send one")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad_value("prompt", "must not be empty")
        return prompt
    if _is_token_ids(prompt):
        if not prompt:
            raise _bad_value("prompt", "must not be empty")
        if any(t < 0 for t in prompt):
            raise _bad_value("prompt", "token ids must be >= 0")
        return list(prompt)
    raise _bad_value("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")


def _stop(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise _bad_value("stop", f"must be a string or a list of strings, got {stop!r}")


# --------------------------------------------------------------------------------------------
# Completions


class _Completion:
    """A parsed POST /v1/completions body."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        model = _opt_str(body, "model")
        if model is not None and model != served_model:
            raise ApiError(
                404,
                "model_not_found",
                f"model {model!r} is not served here; this engine serves {served_model!r}",
            )
        self.model = served_model
        self.prompt: Any = self._read_prompt(body)
        n = _opt_int(body, "n")
        if n is not None and n != 1:
            raise _bad_value("n", f"only n=1 is served, got {n}")
        if body.get("logprobs") not in (None, 0):
            raise _bad_value("logprobs", "log probabilities are not served; send null")
        if _opt_bool(body, "echo", False):
            raise _bad_value("echo", "echo is not served; send false")
        self.stream = _opt_bool(body, "stream", False)
        options = body.get("stream_options")
        if options is not None:
            if not isinstance(options, dict) or set(options) - {"include_usage"}:
                raise _bad_value("stream_options", f'must be {{"include_usage": bool}}, got {options!r}')
            if not self.stream:
                raise _bad_value("stream_options", "only allowed with stream=true")
        self.include_usage = bool(options and _opt_bool(options, "include_usage", False))
        sampling: dict[str, Any] = {}
        max_tokens = _opt_int(body, "max_tokens", minimum=1)
        if max_tokens is None:  # the chat API's newer name
            max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        for field in ("temperature", "top_p"):
            value = _opt_float(body, field)
            if value is not None:
                sampling[field] = value
        top_k = _opt_int(body, "top_k", minimum=-1)
        if top_k is not None:
            sampling["top_k"] = max(top_k, 0)  # vLLM's -1 and sage's 0 both mean "no top-k"
        stop = _stop(body)
        if stop is not None:
            sampling["stop"] = stop
        seed = _opt_int(body, "seed")
        if seed is not None:
            sampling["seed"] = seed
        if _opt_bool(body, "ignore_eos", False):  # vLLM's extension: benchmarks fix output lengths
            sampling["ignore_eos"] = True
        self.sampling_kwargs = sampling
        self.user = _opt_str(body, "user")
        self.priority = _opt_int(body, "priority") or 0
        tenant = _opt_str(body, "tenant")
        self.tenant = tenant if tenant is not None else self.user
        self.cache_salt = _opt_str(body, "cache_salt")
        if self.cache_salt == "":
            raise _bad_value("cache_salt", "must not be empty; leave it out for no salt")
        self.request_id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _read_prompt(self, body: dict[str, Any]) -> Any:
        return _prompt(body)

    def sampling_params(self) -> Any:
        from engine_adapter.model.sampling import SamplingParams

        try:
            return SamplingParams(**self.sampling_kwargs)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_value", str(exc)) from None

    def _envelope(self, object_name: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice, "logprobs": None}],
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """One server-sent event's object."""
        return self._envelope(self.object_name, {"text": text, "finish_reason": finish_reason})

    def answer(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """The whole answer of a request that does not stream."""
        return self.chunk(text, finish_reason)


class _ChatCompletion(_Completion):
    """A parsed POST /v1/chat/completions body: the same fields as a completion, with messages
    instead of a prompt; the engine renders them with the model's chat template."""

    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        super().__init__(body, served_model)
        self._role_sent = False

    def _read_prompt(self, body: dict[str, Any]) -> Any:
        from engine_adapter.model.chat_template import ChatTemplateError, parse_messages

        try:
            return parse_messages(body.get("messages"))
        except ChatTemplateError as exc:
            raise _bad_value("messages", str(exc)) from None

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text} if text or finish_reason is None else {}
        if not self._role_sent:  # OpenAI's first delta names the role
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._envelope(self.object_name, {"delta": delta, "finish_reason": finish_reason})

    def answer(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return self._envelope("chat.completion", {"message": message, "finish_reason": finish_reason})


def _usage(output: Any) -> dict[str, Any]:
    prompt_tokens = int(output.prompt_tokens)
    completion_tokens = int(output.completion_tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": int(output.cached_tokens)},
    }


def _sse(value: Any) -> str:
    return f"data: {_dumps(value)}\n\n"


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
        The app; `engine` is also at ``app.state.engine``.
    """
    if socket_path is None:
        socket_path = getattr(getattr(engine, "config", None), "socket", None)
    socket_str = str(socket_path) if socket_path is not None else None
    shutdown_once = threading.Lock()
    shutdown_requested = False

    def default_shutdown() -> None:
        threading.Thread(
            target=lambda: engine.shutdown(drain=True), name="sage-engine-shutdown", daemon=True
        ).start()

    trigger_shutdown = request_shutdown or default_shutdown

    def shutdown_in_background() -> None:
        nonlocal shutdown_requested
        with shutdown_once:
            if shutdown_requested:
                return
            shutdown_requested = True
        trigger_shutdown()

    started = int(time.time())

    def served_model() -> str:
        config = getattr(engine, "config", None)
        model = getattr(config, "model", None)
        return str(model) if model is not None else "sage-tiny"

    @_endpoint
    async def health(request: Request) -> Response:
        status = "draining" if getattr(engine, "draining", False) else "ok"
        return _json_response({"status": status, "name": engine.name, "pid": os.getpid()})

    @_endpoint
    async def engine_info(request: Request) -> Response:
        info = dict(await asyncio.to_thread(engine.info))
        info["socket"] = socket_str
        info["pid"] = os.getpid()
        return _json_response(info)

    @_endpoint
    async def eviction_stats(request: Request) -> Response:
        stats = await asyncio.to_thread(engine.eviction_stats)
        return _json_response(stats.to_dict())

    @_endpoint
    async def reset_cache(request: Request) -> Response:
        freed = await asyncio.to_thread(engine.reset_prefix_cache)
        return _json_response({"freed_blocks": freed})

    @_endpoint
    async def eviction_policies(request: Request) -> Response:
        return _json_response(await asyncio.to_thread(engine.policies))

    @_endpoint
    async def set_policy(request: Request) -> Response:
        body = await _json_body(request, _POLICY_FIELDS, "PUT /v1/eviction/policy")
        policy = body.get("policy")
        if not isinstance(policy, str) or not policy:
            raise _bad_value("policy", f"must be a policy name, got {policy!r}")
        params = body.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise _bad_value("params", f"must be an object of policy params, got {params!r}")
        from engine_adapter.serving.engine import RequestError
        from sage_eviction.errors import PolicyConfigError

        try:
            answer = await asyncio.to_thread(engine.set_policy, policy, params)
        except (PolicyConfigError, RequestError) as exc:  # their messages say what exists
            raise ApiError(400, "invalid_policy", str(exc)) from None
        log.info(
            "policy swapped",
            old=answer.get("old"),
            new=answer.get("new"),
            swap_time_s=answer.get("swap_time_s"),
        )
        return _json_response(answer)

    @_endpoint
    async def eviction_logs(request: Request) -> Response:
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
        if raw_follow in ("false", "0"):
            events = await asyncio.to_thread(engine.eviction_events, tail)
            return _json_response({"events": list(events)})
        # Subscribe before reading the tail so that no event falls between the two; the events
        # that arrive in both are sent once.
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
        return await serve_completion(_Completion(body, served_model()))

    @_endpoint
    async def chat_completions(request: Request) -> Response:
        body = await _json_body(request, _CHAT_FIELDS, "POST /v1/chat/completions")
        return await serve_completion(_ChatCompletion(body, served_model()))

    @_endpoint
    async def models(request: Request) -> Response:
        model = {"id": served_model(), "object": "model", "created": started, "owned_by": "sage"}
        return _json_response({"object": "list", "data": [model]})

    def submit(completion: _Completion, sampling: Any) -> Any:
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

    async def serve_completion(completion: _Completion) -> Response:
        sampling = completion.sampling_params()
        if getattr(engine, "draining", False) or getattr(engine, "stopped", False):
            raise ApiError(503, "unavailable", "the engine is shutting down and admits no new requests")
        from engine_adapter.serving.engine import EngineClosedError, RequestError

        try:
            handle = await asyncio.to_thread(submit, completion, sampling)
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
            background=BackgroundTask(shutdown_in_background),
        )

    @_endpoint
    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = await asyncio.to_thread(engine.metrics_registry)  # it refreshes gauges under the lock
        return Response(await asyncio.to_thread(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
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
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_AccessLog)],
        exception_handlers={HTTPException: _http_exception, Exception: _unhandled_exception},
    )
    app.state.engine = engine
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


# --------------------------------------------------------------------------------------------
# The process


class SocketInUseError(RuntimeError):
    """A live engine already answers on the socket."""


def _socket_is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # A timeout or EAGAIN means someone holds it (a full backlog): better not steal it.
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    else:
        return True
    finally:
        probe.close()


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 from its creation.

    A stale socket file (nothing accepts on it: a crashed engine) is replaced; a live one is
    never taken over.

    Raises:
        SocketInUseError: An engine answers on `path`.
        OSError: `path` exists and is not a socket, or it cannot be bound.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if len(os.fsencode(path)) >= 108:
        raise OSError(
            errno.ENAMETOOLONG, f"socket path is {len(os.fsencode(path))} bytes, the limit is 107", str(path)
        )
    with contextlib.suppress(FileNotFoundError):
        mode = path.lstat().st_mode
        if not stat.S_ISSOCK(mode):
            raise OSError(errno.EEXIST, "exists and is not a socket; not replacing it", str(path))
        if _socket_is_live(path):
            raise SocketInUseError(f"an engine is already serving on {path}")
        log.info("replacing stale socket", socket=str(path))
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600: never readable by others, not even briefly
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SocketInUseError(f"an engine is already serving on {path}") from None
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)  # listen at once, so that a second server probing the path sees it live
    return sock


def _remove_if_ours(path: Path, inode: int | None) -> None:
    """Remove `path` if it is still the file we created (a successor may have replaced it)."""
    with contextlib.suppress(FileNotFoundError):
        if inode is None or path.lstat().st_ino == inode:
            path.unlink()


def _uvicorn_server(config: Any, on_signal: Callable[[int], None]) -> Any:
    """A uvicorn Server whose SIGINT/SIGTERM call `on_signal` on the event loop.

    uvicorn's own handlers set `should_exit` at once (in-flight requests would then race the
    engine's drain) and re-raise the signal after `serve` returns (the process would die by it
    before removing its socket); ours drain first and let `serve` return normally.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            loop = asyncio.get_running_loop()

            def handler(sig: int, _frame: Any) -> None:
                loop.call_soon_threadsafe(on_signal, sig)

            original = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, previous in original.items():
                    signal.signal(sig, previous)

    return DrainingServer(config)


class _Stopper:
    """Drains the engine, then tells uvicorn to exit; a second signal aborts what is left."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.server: Any = None
        self._lock = threading.Lock()
        self._draining = False

    def request(self, reason: str) -> None:
        with self._lock:
            if self._draining:
                return
            self._draining = True
        log.info("draining", reason=reason)
        threading.Thread(target=self._drain, name="sage-drain", daemon=True).start()

    def _drain(self) -> None:
        try:
            self.engine.shutdown(drain=True)
        except Exception as exc:
            log.error("engine shutdown failed", exc_info=exc)
        finally:
            self.server.should_exit = True

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self._draining:
            self.request(name)
            return
        log.warning("second signal: aborting the requests in flight", signal=name)
        threading.Thread(
            target=lambda: self.engine.shutdown(drain=False, timeout=5.0), name="sage-abort", daemon=True
        ).start()
        self.server.should_exit = True
        self.server.force_exit = True


class _StartupInterrupted(Exception):
    """SIGTERM while the model loads (before uvicorn's handlers are in place)."""


def _interrupt_startup(sig: int, _frame: Any) -> None:
    raise _StartupInterrupted(signal.Signals(sig).name)


def _configure_logging(level: str) -> None:
    import logging

    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)


def serve(config: EngineConfig, *, log_level: str | None = None) -> int:
    """Run the engine described by `config` behind the control API until it is told to stop.

    Logs go to stderr through structlog: a startup line (socket, model, policy) at info, one
    line per request at debug. `log_level` defaults to ``$SAGE_LOG_LEVEL``, else info.

    Returns:
        0 after a clean (drained) shutdown; 1 when the socket is held by a live engine or
        cannot be bound, or the engine fails to start.
    """
    import uvicorn

    _configure_logging(log_level or os.environ.get("SAGE_LOG_LEVEL", "info"))
    socket_path = config.socket_path  # EngineConfig fills $SAGE_HOME/run/<name>.sock when unset
    pid_path = config.pid_path
    try:
        sock = bind_unix_socket(socket_path)
    except SocketInUseError as exc:
        print(
            f"sage engine: {exc} (pid file {pid_path}); stop it first or pick another --name/--socket",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"sage engine: cannot bind {socket_path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    socket_inode = socket_path.lstat().st_ino
    pid_inode: int | None = None
    engine: Engine | None = None
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        tmp = pid_path.with_name(f".{pid_path.name}.{os.getpid()}")
        tmp.write_text(f"{os.getpid()}\n", encoding="utf-8")
        os.replace(tmp, pid_path)
        pid_inode = pid_path.lstat().st_ino

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupt_startup)
        from engine_adapter.serving.engine import Engine

        try:
            engine = Engine(config)
            engine.start()
        except _StartupInterrupted as exc:
            log.info("stopped while starting", signal=str(exc))
            return 0
        except Exception as exc:
            log.error("engine failed to start", error=f"{type(exc).__name__}: {exc}")
            print(f"sage engine: failed to start: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1

        stopper = _Stopper(engine)
        app = build_app(engine, socket_path=socket_path, request_shutdown=lambda: stopper.request("api"))
        uv_config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=30,  # after the drain: time for the answers to be written
            timeout_keep_alive=5,
        )
        stopper.server = _uvicorn_server(uv_config, stopper.on_signal)
        info = engine.info()
        log.info(
            "engine serving",
            socket=str(socket_path),
            pid=os.getpid(),
            name=engine.name,
            model=info.get("model"),
            policy=(info.get("policy") or {}).get("name"),
            device=info.get("device"),
            num_blocks=info.get("num_blocks"),
        )
        # _StartupInterrupted: a SIGTERM in the instant before uvicorn took the signals over.
        with contextlib.suppress(_StartupInterrupted):
            stopper.server.run(sockets=[sock])
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already stopping; the cleanup is short
        if not engine.stopped:  # uvicorn stopped on its own: still drain what is running
            engine.shutdown(drain=True)
        log.info("engine stopped", socket=str(socket_path))
        return 0
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_sigterm)
        if engine is not None and not engine.stopped:
            with contextlib.suppress(Exception):
                engine.shutdown(drain=False, timeout=5.0)
        sock.close()
        _remove_if_ours(socket_path, socket_inode)
        _remove_if_ours(pid_path, pid_inode)


def main(argv: list[str] | None = None) -> int:
    """``python -m engine_adapter.serving.server --config-json '<json>'``: build the config and `serve`."""
    parser = argparse.ArgumentParser(
        prog="python -m engine_adapter.serving.server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config-json", required=True, help="the EngineConfig as a JSON object")
    parser.add_argument("--log-level", default=os.environ.get("SAGE_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config_json)
    except json.JSONDecodeError as exc:
        print(f"sage engine: --config-json is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(raw, dict):
        print("sage engine: --config-json must be a JSON object", file=sys.stderr)
        return 2
    from engine_adapter.serving.config import EngineConfig

    try:
        config = EngineConfig.from_dict(raw, source="--config-json")
    except (TypeError, ValueError) as exc:
        print(f"sage engine: invalid config: {exc}", file=sys.stderr)
        return 2
    return serve(config, log_level=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
