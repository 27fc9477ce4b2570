"""The control API's request parsing and JSON: bodies and queries checked field by field, errors as JSON.

Every error, from a malformed body to a value out of range, is an `ApiError`, answered as
``{"error": {"type": str, "message": str}}`` with a 4xx or 5xx status. `Completion` and
`ChatCompletion` are the parsed bodies of ``POST /v1/completions`` and
``POST /v1/chat/completions`` and build the OpenAI-shaped answers and stream chunks.
"""

from __future__ import annotations

import functools
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from engine_adapter.serving.config import DEFAULT_MAX_BODY_BYTES

__all__ = [
    "CHAT_FIELDS",
    "EMBEDDING_FIELDS",
    "COMPLETION_FIELDS",
    "POLICY_FIELDS",
    "TOKEN_POLICY_FIELDS",
    "ApiError",
    "ChatCompletion",
    "Completion",
    "EmbeddingRequest",
    "bad_value",
    "dumps",
    "error_json",
    "endpoint",
    "http_exception",
    "json_body",
    "json_response",
    "logs_query",
    "policy_swap",
    "token_policy_swap",
    "unhandled_exception",
    "usage",
]

log = structlog.get_logger("sage.server")

MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES  # an app built without an EngineConfig (tests) uses the default
MAX_LOG_TAIL = 1_000_000
FOLLOW_POLL_S = 0.5  # how long a follow stream waits on the event queue before checking the engine

# The top-level fields of POST /v1/completions: OpenAI's that we serve, and sage's extensions.
COMPLETION_FIELDS = frozenset(
    {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
        "stream_options", "user", "n", "logprobs", "echo",
        "priority", "tenant", "cache_salt", "ignore_eos", "kv_compression", "slo_ttft_ms", "slo_tpot_ms",
    }
)  # fmt: skip
CHAT_FIELDS = (COMPLETION_FIELDS - {"prompt", "echo"}) | {"messages", "max_completion_tokens"}
# POST /v1/embeddings: OpenAI's fields (`dimensions` is refused: the model's width is served) and
# sage's extensions (tenant, priority, the deadline SLO).
EMBEDDING_FIELDS = frozenset(
    {"model", "input", "encoding_format", "user", "dimensions", "tenant", "priority", "slo_deadline_ms"}
)
MAX_SLO_MS = 86_400_000.0  # a day: beyond it an SLO is a typo, not a target
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the texts of one request
POLICY_FIELDS = frozenset({"policy", "params"})
TOKEN_POLICY_FIELDS = frozenset({"policy"})
LOGS_QUERY = frozenset({"tail", "follow"})


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


def _opt_int(body: dict[str, Any], field: str, *, minimum: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_value(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise bad_value(field, f"must be >= {minimum}, got {value}")
    return value


def _opt_float(body: dict[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_value(field, f"must be a number, got {value!r}")
    return float(value)


def opt_slo_ms(body: dict[str, Any], field: str) -> float | None:
    """An SLO extension field in milliseconds: a positive number up to a day, or absent."""
    value = _opt_float(body, field)
    if value is None:
        return None
    if not 0.0 < value <= MAX_SLO_MS:
        raise bad_value(field, f"must be a number of milliseconds in (0, {MAX_SLO_MS:.0f}], got {value:g}")
    return value


def _served_model(body: dict[str, Any], served_model: str) -> str:
    """The body's `model`, which may be omitted but must name the served model when given."""
    model = _opt_str(body, "model")
    if model is not None and model != served_model:
        raise ApiError(
            404,
            "model_not_found",
            f"model {model!r} is not served here; this engine serves {served_model!r}",
        )
    return served_model


def _opt_str(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_value(field, f"must be a string, got {value!r}")
    return value


def _opt_bool(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_value(field, f"must be true or false, got {value!r}")
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
        raise bad_value("prompt", f"batches of prompts are not served ({len(prompt)} given); send one")
    if isinstance(prompt, str):
        if not prompt:
            raise bad_value("prompt", "must not be empty")
        return prompt
    if _is_token_ids(prompt):
        if not prompt:
            raise bad_value("prompt", "must not be empty")
        if any(t < 0 for t in prompt):
            raise bad_value("prompt", "token ids must be >= 0")
        return list(prompt)
    raise bad_value("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")


def _stop(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise bad_value("stop", f"must be a string or a list of strings, got {stop!r}")


def _kv_compression(value: Any) -> Any:
    """A request's ``kv_compression: {"policy": NAME, "ratio": R}`` (None when absent)."""
    from engine_adapter.token_eviction import KVCompression

    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"policy", "ratio"}:
        raise bad_value("kv_compression", f'must be {{"policy": NAME, "ratio": R}}, got {value!r:.80}')
    try:
        return KVCompression(value["policy"], value["ratio"])
    except ValueError as exc:
        raise bad_value("kv_compression", str(exc).removeprefix("kv_compression.")) from None


def token_policy_swap(body: dict[str, Any]) -> str:
    """The policy name of a ``PUT /v1/eviction/token`` body, checked."""
    policy = body.get("policy")
    if not isinstance(policy, str) or not policy:
        raise bad_value("policy", f"must be a token policy name, got {policy!r:.80}")
    return policy


def policy_swap(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The policy name and params of a ``PUT /v1/eviction/policy`` body, checked."""
    policy = body.get("policy")
    if not isinstance(policy, str) or not policy:
        raise bad_value("policy", f"must be a policy name, got {policy!r}")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_value("params", f"must be an object of policy params, got {params!r}")
    return policy, params


def logs_query(request: Request) -> tuple[int, bool]:
    """``tail`` and ``follow`` of ``GET /v1/eviction/logs``, checked."""
    unknown = sorted(set(request.query_params) - LOGS_QUERY)
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
        raise bad_value("tail", f"must be an integer, got {raw_tail!r}") from None
    if not 0 <= tail <= MAX_LOG_TAIL:
        raise bad_value("tail", f"must be between 0 and {MAX_LOG_TAIL}, got {tail}")
    raw_follow = request.query_params.get("follow", "false").lower()
    if raw_follow not in ("true", "false", "1", "0"):
        raise bad_value("follow", f"must be true or false, got {raw_follow!r}")
    return tail, raw_follow in ("true", "1")


TREE_QUERY = frozenset({"depth", "max_nodes"})


def tree_query(request: Request) -> tuple[int, int]:
    """``depth`` (default 8) and ``max_nodes`` (default 200) of ``GET /v1/cache/tree``, checked
    against the bounds of `engine_adapter.cache.tree`."""
    from engine_adapter.cache.tree import MAX_DEPTH, MAX_NODES

    unknown = sorted(set(request.query_params) - TREE_QUERY)
    if unknown:
        raise ApiError(
            400,
            "unknown_field",
            f"unknown query parameter {', '.join(map(repr, unknown))}; accepted: depth, max_nodes",
        )
    values = []
    for name, default, top in (("depth", 8, MAX_DEPTH), ("max_nodes", 200, MAX_NODES)):
        raw = request.query_params.get(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise bad_value(name, f"must be an integer, got {raw[:40]!r}") from None
        if not 1 <= value <= top:
            raise bad_value(name, f"must be between 1 and {top}, got {value}")
        values.append(value)
    return values[0], values[1]


# --------------------------------------------------------------------------------------------
# Completions


class Completion:
    """A parsed POST /v1/completions body."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        self.model = _served_model(body, served_model)
        self.prompt: Any = self._read_prompt(body)
        n = _opt_int(body, "n")
        if n is not None and n != 1:
            raise bad_value("n", f"only n=1 is served, got {n}")
        if body.get("logprobs") not in (None, 0):
            raise bad_value("logprobs", "log probabilities are not served; send null")
        if _opt_bool(body, "echo", False):
            raise bad_value("echo", "echo is not served; send false")
        self.stream = _opt_bool(body, "stream", False)
        options = body.get("stream_options")
        if options is not None:
            if not isinstance(options, dict) or set(options) - {"include_usage"}:
                raise bad_value("stream_options", f'must be {{"include_usage": bool}}, got {options!r}')
            if not self.stream:
                raise bad_value("stream_options", "only allowed with stream=true")
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
            raise bad_value("cache_salt", "must not be empty; leave it out for no salt")
        self.kv_compression = _kv_compression(body.get("kv_compression"))
        # SLO extensions (spec 004); None: the tenant's default from the engine config.
        self.slo_ttft_ms = opt_slo_ms(body, "slo_ttft_ms")
        self.slo_tpot_ms = opt_slo_ms(body, "slo_tpot_ms")
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


class ChatCompletion(Completion):
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
            raise bad_value("messages", str(exc)) from None

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text} if text or finish_reason is None else {}
        if not self._role_sent:  # OpenAI's first delta names the role
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._envelope(self.object_name, {"delta": delta, "finish_reason": finish_reason})

    def answer(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return self._envelope("chat.completion", {"message": message, "finish_reason": finish_reason})


class EmbeddingRequest:
    """A parsed POST /v1/embeddings body (OpenAI's format, sage's SLO and tenant extensions)."""

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        self.model = _served_model(body, served_model)
        self.inputs = _embedding_inputs(body)
        encoding = _opt_str(body, "encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise bad_value("encoding_format", f"must be 'float' or 'base64', got {encoding!r:.40}")
        self.encoding_format = encoding
        if body.get("dimensions") is not None:
            raise bad_value("dimensions", "the model's own width is served; leave it out")
        self.user = _opt_str(body, "user")
        tenant = _opt_str(body, "tenant")
        self.tenant = tenant if tenant is not None else self.user
        self.priority = _opt_int(body, "priority") or 0
        self.slo_deadline_ms = opt_slo_ms(body, "slo_deadline_ms")
        self.request_id = f"emb-{uuid.uuid4().hex}"

    def answer(self, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
        """OpenAI's answer: one ``embedding`` object per input, in input order."""
        from engine_adapter.model.pooling import encode_base64

        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode_base64(v) if self.encoding_format == "base64" else v,
            }
            for i, v in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }


def _embedding_inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """`input`: a string, a list of strings, token ids, or a list of token-id lists; none empty."""
    if "input" not in body or body["input"] is None:
        raise ApiError(400, "invalid_value", "'input' is required: a string or a list of strings")
    value = body["input"]
    if isinstance(value, str):
        items: list[Any] = [value]
    elif _is_token_ids(value) and value:
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise bad_value("input", f"must be a string or a list of strings, got {type(value).__name__}")
    if not items:
        raise bad_value("input", "must not be an empty list")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise bad_value("input", f"at most {MAX_EMBEDDING_INPUTS} inputs per request, got {len(items)}")
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise bad_value("input", f"input {i} is an empty string")
            out.append(item)
        elif _is_token_ids(item):
            if not item:
                raise bad_value("input", f"input {i} is an empty list of token ids")
            if any(t < 0 for t in item):
                raise bad_value("input", f"input {i}: token ids must be >= 0")
            out.append(list(item))
        else:
            raise bad_value(
                "input", f"input {i} must be a string or a list of token ids, got {type(item).__name__}"
            )
    return out


def usage(output: Any) -> dict[str, Any]:
    prompt_tokens = int(output.prompt_tokens)
    completion_tokens = int(output.completion_tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": int(output.cached_tokens)},
    }
