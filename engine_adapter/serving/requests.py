"""The control API's shared request handling: errors as JSON, bodies read within their limit, fields checked.

Every error, from a malformed body to a value out of range, is an `ApiError`, answered as
``{"error": {"type": str, "message": str}}`` with a 4xx or 5xx status; `endpoint` wraps each
handler so that any other exception is a logged 500 in the same shape. `json_body` reads a body
as a stream that stops at the engine's ``max_body_bytes`` and refuses unknown fields; the
``opt_*`` readers check one field each. The parsers of each endpoint family use them:

    completion_requests.py  POST /v1/completions and /v1/chat/completions, OpenAI-shaped answers
    embedding_requests.py   POST /v1/embeddings
    control_requests.py     the policy swaps and the queries of /v1/eviction/logs and /v1/cache/tree

Imports: Starlette, and the engine config's default body limit; never the engine.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from engine_adapter.serving.config import DEFAULT_MAX_BODY_BYTES

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_SLO_MS",
    "ApiError",
    "bad_value",
    "check_model",
    "dumps",
    "endpoint",
    "error_json",
    "http_exception",
    "is_token_ids",
    "json_body",
    "json_response",
    "opt_bool",
    "opt_float",
    "opt_int",
    "opt_slo_ms",
    "opt_str",
    "unhandled_exception",
]

log = structlog.get_logger("sage.server")

MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES  # an app built without an EngineConfig (tests) uses the default
MAX_SLO_MS = 86_400_000.0  # a day: beyond it an SLO is a typo, not a target


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


def dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity somewhere: send null rather than fail the request
        return json.dumps(_finite(value), allow_nan=False, separators=(",", ":"))


def json_response(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(dumps(value), status_code=status, headers=headers, media_type="application/json")


def error_json(type_: str, message: str) -> bytes:
    """The body of every error answer, also those written below Starlette (limits, API key)."""
    return dumps({"error": {"type": type_, "message": message}}).encode()


def _error_response(
    status: int, type_: str, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    body = error_json(type_, message)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


_HTTP_ERROR_TYPES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    503: "unavailable",
}


async def http_exception(request: Request, exc: Exception) -> Response:
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


async def unhandled_exception(request: Request, exc: Exception) -> Response:
    """The last resort, for an exception raised outside an endpoint (a middleware)."""
    log.error("unhandled exception", path=request.url.path, exc_info=exc)
    return _error_response(500, "internal_error", f"internal server error: {type(exc).__name__}: {exc}")


Endpoint = Callable[[Request], Awaitable[Response]]


def endpoint(fn: Endpoint) -> Endpoint:
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


def _body_limit(request: Request) -> int:
    """The engine's ``max_body_bytes`` (in `AppState`), else the default."""
    state = getattr(getattr(request.app, "state", None), "sage", None)
    return int(getattr(state, "max_body_bytes", MAX_BODY_BYTES))


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, read as a stream that stops at `limit` bytes: a 413 before it is all in memory."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, "request_too_large", f"body of {length} bytes exceeds {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "request_too_large", f"body of more than {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Gone (or cut off at its body deadline): nobody reads the answer; no traceback either.
        raise ApiError(400, "client_disconnected", "the client closed the connection mid-body") from None
    return b"".join(chunks)


async def json_body(request: Request, allowed: frozenset[str], what: str) -> dict[str, Any]:
    """The request's body as a JSON object with no field outside `allowed`."""
    raw = await _read_body(request, _body_limit(request))
    if not raw.strip():
        raise ApiError(400, "invalid_json", f"{what}: the body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "invalid_json", f"{what}: JSON nested too deeply") from None
    except ValueError as exc:  # malformed, not UTF-8, or an integer of thousands of digits
        raise ApiError(400, "invalid_json", f"{what}: malformed JSON: {exc}") from None
    try:
        # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer, hash or log can
        # encode: refuse them here rather than fail later, inside the engine.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "invalid_json", f"{what}: a string holds a lone UTF-16 surrogate") from None
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


def bad_value(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid_value", f"{field!r}: {message}")


def opt_int(body: dict[str, Any], field: str, *, minimum: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_value(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise bad_value(field, f"must be >= {minimum}, got {value}")
    return value


def opt_float(body: dict[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_value(field, f"must be a number, got {value!r}")
    return float(value)


def opt_slo_ms(body: dict[str, Any], field: str) -> float | None:
    """An SLO extension field in milliseconds: a positive number up to a day, or absent."""
    value = opt_float(body, field)
    if value is None:
        return None
    if not 0.0 < value <= MAX_SLO_MS:
        raise bad_value(field, f"must be a number of milliseconds in (0, {MAX_SLO_MS:.0f}], got {value:g}")
    return value


def check_model(body: dict[str, Any], served_model: str) -> str:
    """The body's `model`, which may be omitted but must name the served model when given."""
    model = opt_str(body, "model")
    if model is not None and model != served_model:
        raise ApiError(
            404,
            "model_not_found",
            f"model {model!r} is not served here; this engine serves {served_model!r}",
        )
    return served_model


def opt_str(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_value(field, f"must be a string, got {value!r}")
    return value


def opt_bool(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_value(field, f"must be true or false, got {value!r}")
    return value


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
