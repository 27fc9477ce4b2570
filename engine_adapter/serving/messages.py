"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A body is checked by `messages_requests.MessagesRequest` and submitted like a chat completion
(`engine_adapter.serving.submit`); the answer is Anthropic's message, whole or as its stream of
server-sent events (``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``
with ``text_delta``, ``content_block_stop``, ``message_delta`` with the stop reason and the
usage, ``message_stop``). Errors take Anthropic's shape,
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``, with the same
statuses as the OpenAI routes. The usage counts the prompt as Anthropic does: ``input_tokens``
are the tokens neither read from the cache nor written to it, so ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens`` is the prompt
(docs/concepts/prompt-caching.md).

Imports: the shared request handling, the submission path, the streams and the prompt-cache
counts; the engine only as a type.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine_adapter.serving.errors import RequestError
from engine_adapter.serving.messages_requests import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS, MessagesRequest
from engine_adapter.serving.prompt_cache import cache_counts
from engine_adapter.serving.requests import ApiError, Endpoint, dumps, json_body, json_response
from engine_adapter.serving.streams import ThreadPump
from engine_adapter.serving.submit import final_output, submit

if TYPE_CHECKING:
    from engine_adapter.serving.engine import Engine

__all__ = ["anthropic_error_json", "count_message_tokens", "messages"]

log = structlog.get_logger("sage.server")

# Anthropic's error types by status (its API's "Errors" page).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ONE_HOUR_S = 3_600.0
# A request ended by the engine rather than by its model: answered as an error, as Anthropic has
# no stop reason for them.
_ENDED_BY_ENGINE = {"abort": 500, "timeout": 503, "dropped": 503}


def anthropic_error_json(status: int, message: str) -> bytes:
    """An error body in Anthropic's shape (also written by the API-key gate)."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def _anthropic_endpoint(fn: Endpoint) -> Endpoint:
    """Turn `ApiError` and any other exception into Anthropic's error shape."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except ApiError as exc:
            body = anthropic_error_json(exc.status, exc.message)
            return Response(body, status_code=exc.status, headers=exc.headers, media_type="application/json")
        except Exception as exc:
            log.error("request failed", method=request.method, path=request.url.path, exc_info=exc)
            body = anthropic_error_json(500, f"internal server error: {type(exc).__name__}: {exc}")
            return Response(body, status_code=500, media_type="application/json")

    return wrapper


def anthropic_usage(output: Any) -> dict[str, Any]:
    """Anthropic's usage of a `RequestOutput`: the written tokens in the bucket of the lifetime
    the cache granted them (a write with none counts as 5m, Anthropic's default; past the last
    "1h" block of a request that also marked "5m" ones, 5m)."""
    counts = cache_counts(output)
    one_hour = counts.ttl_s is not None and counts.ttl_s >= ONE_HOUR_S
    long = counts.written - counts.written_short if one_hour else 0
    return {
        "input_tokens": counts.uncached,
        "output_tokens": int(output.completion_tokens),
        "cache_creation_input_tokens": counts.written,
        "cache_read_input_tokens": counts.read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": counts.written - long,
            "ephemeral_1h_input_tokens": long,
        },
        "cache_ttl_s": counts.ttl_s,  # sage's extension, as on the OpenAI routes
    }


def _stop(engine: Engine, parsed: MessagesRequest, output: Any) -> tuple[str, str | None]:
    """Anthropic's stop reason and the stop sequence that matched (the engine's "stop" is an
    end of turn or a stop string: the generated tokens, decoded, say which)."""
    if output.finish_reason in _ENDED_BY_ENGINE:
        raise ApiError(
            _ENDED_BY_ENGINE[output.finish_reason], "engine_error", output.error or output.finish_reason
        )
    if output.finish_reason == "length":
        return "max_tokens", None
    if parsed.stop_sequences and output.token_ids:
        decoded = engine.tokenizer.decode(list(output.token_ids))
        rest = decoded[len(output.text) :] if decoded.startswith(output.text) else decoded
        hits = [s for s in parsed.stop_sequences if s in rest]
        if hits:
            return "stop_sequence", min(hits, key=rest.index)
    return "end_turn", None


def _message(
    parsed: MessagesRequest, text: str, stop: tuple[str | None, str | None], usage: Any
) -> dict[str, Any]:
    return {
        "id": parsed.request_id,
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": [{"type": "text", "text": text}] if text or stop[0] else [],
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


def _event(name: str, value: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {dumps({'type': name, **value})}\n\n"


def _error_event(status: int, message: str) -> str:
    return f"event: error\ndata: {anthropic_error_json(status, message).decode()}\n\n"


def _delta(text: str) -> str:
    return _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})


def _opening(parsed: MessagesRequest, output: Any) -> list[str]:
    """message_start (with the usage known once the prompt is in), the text block's start, a ping."""
    return [
        _event("message_start", {"message": _message(parsed, "", (None, None), anthropic_usage(output))}),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _event("ping", {}),
    ]


def _closing(engine: Engine, parsed: MessagesRequest, output: Any) -> list[str]:
    """The last delta, the block's stop, message_delta with the stop reason and the whole usage
    (cumulative, as Anthropic's are), message_stop."""
    reason, sequence = _stop(engine, parsed, output)
    events = [_delta(output.text)] if output.text else []
    delta = {"stop_reason": reason, "stop_sequence": sequence}
    return [
        *events,
        _event("content_block_stop", {"index": 0}),
        _event("message_delta", {"delta": delta, "usage": anthropic_usage(output)}),
        _event("message_stop", {}),
    ]


async def _message_events(engine: Engine, parsed: MessagesRequest, handle: Any) -> AsyncIterator[str]:
    """Anthropic's stream of one message; a failure after the start is an ``error`` event."""
    started = finished = False
    try:
        async for output in ThreadPump(iter(handle), f"sage-stream-{parsed.request_id}"):
            finished = bool(output.finished)
            if finished and output.finish_reason in ("error", "rejected"):
                status = 429 if output.finish_reason == "rejected" else 500
                yield _error_event(status, output.error or "the engine failed on this request")
                break
            if not started:
                started = True
                for event in _opening(parsed, output):
                    yield event
            if finished:
                for event in _closing(engine, parsed, output):
                    yield event
                break
            if output.text:
                yield _delta(output.text)
    except ApiError as exc:
        yield _error_event(exc.status, exc.message)
    except Exception as exc:
        log.error("stream failed", request_id=parsed.request_id, exc_info=exc)
        yield _error_event(500, f"{type(exc).__name__}: {exc}")
    finally:
        if not finished:
            handle.abort()  # the client went away, or the stream failed: free the slot


def _app_state(request: Request) -> Any:
    return request.app.state.sage


@_anthropic_endpoint
async def messages(request: Request) -> Response:
    """POST /v1/messages: Anthropic's Messages API over the served model."""
    body = await json_body(request, MESSAGES_FIELDS, "POST /v1/messages")
    state = _app_state(request)
    parsed = MessagesRequest(body, state.served_model)
    handle = await submit(state.engine, state.admits_requests, parsed)
    if parsed.stream:
        return StreamingResponse(
            _message_events(state.engine, parsed, handle),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    output = await final_output(handle, parsed.request_id)
    stop = _stop(state.engine, parsed, output)
    return json_response(_message(parsed, output.text, stop, anthropic_usage(output)))


@_anthropic_endpoint
async def count_message_tokens(request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens as the chat template renders it."""
    body = await json_body(request, COUNT_TOKENS_FIELDS, "POST /v1/messages/count_tokens")
    state = _app_state(request)
    parsed = MessagesRequest(body, state.served_model, require_max_tokens=False)
    try:
        ids = await asyncio.to_thread(state.engine.chat_prompt, parsed.prompt)
    except RequestError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return json_response({"input_tokens": len(ids)})
