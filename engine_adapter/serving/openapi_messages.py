"""The OpenAPI schemas of Anthropic's Messages API and of the prompt-cache fields (issue 51).

`messages_paths` gives ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``;
`openai_cache_fields` the prompt-cache fields of OpenAI's two routes, `chat_text_part` a chat
content part with its marker and `openai_usage` their usage. engine_adapter.serving.openapi
assembles them into the document.
"""

from __future__ import annotations

from engine_adapter.serving.openapi_types import BOOL, INT, NUM, STR, Schema, nullable, obj, ref

__all__ = [
    "anthropic_error_schema",
    "chat_text_part",
    "messages_paths",
    "openai_cache_fields",
    "openai_usage",
]

# A duration string: "30m", "1h", "24h", "1h30m", "90s".
DURATION: Schema = {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"}
_CACHE_CONTROL: Schema = obj({"type": {"const": "ephemeral"}}, {"ttl": {"enum": ["5m", "1h"]}}, extra=False)
_TEXT_BLOCK: Schema = obj(
    {"type": {"const": "text"}, "text": STR},
    {"cache_control": nullable(_CACHE_CONTROL), "citations": {"type": "null"}},
    extra=False,
)
_BLOCKS: Schema = {"type": "array", "items": _TEXT_BLOCK, "minItems": 1}
_ERROR_STATUSES = {
    "400": "A malformed request, or one not served (tools, images, thinking): the message says which.",
    "404": "A model other than the one served.",
    "413": "The body is over the engine's max_body_bytes.",
    "429": "With colocation on: admission control rejected the request.",
    "503": "The engine is shutting down, or too many connections are open.",
}


def anthropic_error_schema() -> Schema:
    """Anthropic's error shape."""
    return obj({"type": {"const": "error"}, "error": obj({"type": STR, "message": STR})})


def openai_cache_fields() -> dict[str, Schema]:
    """OpenAI's prompt-cache fields of both routes (docs/concepts/prompt-caching.md)."""
    return {
        "prompt_cache_key": nullable({"type": "string", "minLength": 1}),
        "prompt_cache_retention": nullable({"enum": ["in_memory", "24h"]}),
        "prompt_cache_options": nullable(
            obj(
                {},
                {"mode": nullable({"enum": ["implicit", "explicit"]}), "ttl": nullable(DURATION)},
                extra=False,
            )
        ),
    }


def chat_text_part() -> Schema:
    """A chat message's text part, with ``prompt_cache_breakpoint``: the end of a prefix to write."""
    mark = nullable(obj({"mode": {"const": "explicit"}}, extra=False))
    return obj({"type": {"const": "text"}, "text": STR}, {"prompt_cache_breakpoint": mark})


def openai_usage() -> Schema:
    """Usage: read tokens (``cached_tokens``), written ones (``cache_write_tokens``, OpenAI's
    client's name) and sage's ``cache_ttl_s``, the lifetime granted to what was written."""
    details = obj(
        {"cached_tokens": INT},
        {"compressed_cached_tokens": INT, "cache_write_tokens": INT, "cache_ttl_s": nullable(NUM)},
    )
    return obj(
        {"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT},
        {"prompt_tokens_details": details},
    )


def _anthropic_errors() -> dict[str, Schema]:
    # the transport's own limits (a 408, a 503 for too many connections) answer below the route,
    # in the control API's shape
    shape = {"anyOf": [ref("AnthropicError"), ref("Error")]}
    return {
        code: {"description": text, "content": {"application/json": {"schema": shape}}}
        for code, text in _ERROR_STATUSES.items()
    }


def _conversation() -> tuple[dict[str, Schema], dict[str, Schema]]:
    """The required and optional fields that say what the prompt is."""
    message = obj(
        {"role": {"enum": ["user", "assistant"]}, "content": {"anyOf": [STR, _BLOCKS]}}, extra=False
    )
    required = {"model": STR, "messages": {"type": "array", "items": message, "minItems": 1}}
    optional = {
        "system": nullable({"anyOf": [STR, _BLOCKS]}),
        "cache_control": nullable(_CACHE_CONTROL),
        "tools": nullable({"type": "array", "maxItems": 0}),
        "tool_choice": nullable(obj({"type": {"const": "none"}}, extra=False)),
        "thinking": nullable(obj({"type": {"const": "disabled"}}, extra=False)),
    }
    return required, optional


def _message_request() -> Schema:
    required, optional = _conversation()
    required["max_tokens"] = {"type": "integer", "minimum": 1}
    optional |= {
        "stop_sequences": nullable({"type": "array", "items": STR}),
        "temperature": nullable({"type": "number", "minimum": 0}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable({"type": "integer", "minimum": 0}),
        "metadata": nullable(obj({}, {"user_id": nullable(STR)}, extra=False)),
        "stream": nullable(BOOL),
        "service_tier": nullable({"enum": ["auto", "standard_only"]}),
        "tenant": nullable(STR),
        "priority": nullable(INT),
        "cache_salt": nullable({"type": "string", "minLength": 1}),
    }
    return obj(required, optional, extra=False)


def _message_answer() -> Schema:
    usage = obj(
        {
            "input_tokens": INT,
            "output_tokens": INT,
            "cache_creation_input_tokens": INT,
            "cache_read_input_tokens": INT,
            "cache_creation": obj({"ephemeral_5m_input_tokens": INT, "ephemeral_1h_input_tokens": INT}),
        },
        {"cache_ttl_s": nullable(NUM)},
    )
    return obj(
        {
            "id": STR,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": STR,
            "content": {"type": "array", "items": obj({"type": {"const": "text"}, "text": STR})},
            "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence"]},
            "stop_sequence": nullable(STR),
            "usage": usage,
        }
    )


def _operation(summary: str, description: str, body: Schema, example: Schema, ok: Schema) -> Schema:
    return {
        "summary": summary,
        "description": description,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": body, "example": example}},
        },
        "responses": {"200": ok, **_anthropic_errors()},
    }


def messages_paths() -> dict[str, Schema]:
    """Anthropic's Messages API."""
    hello = {"model": "sage-tiny", "messages": [{"role": "user", "content": "Hello"}]}
    required, optional = _conversation()
    message_ok = {
        "description": "The message; with stream: true, Anthropic's server-sent events",
        "content": {
            "application/json": {"schema": _message_answer()},
            "text/event-stream": {"schema": STR},
        },
    }
    count_ok = {
        "description": "The prompt's tokens",
        "content": {"application/json": {"schema": obj({"input_tokens": INT})}},
    }
    return {
        "/v1/messages": {
            "post": _operation(
                "Anthropic-compatible messages, rendered with the model's chat template",
                "cache_control on blocks writes the prompt up to the last marked block with the longest "
                "lifetime asked; at the top level, the whole prompt. input_tokens + cache_read_input_tokens "
                "+ cache_creation_input_tokens is the prompt. Tool use, images and thinking are a 400.",
                _message_request(),
                {**hello, "max_tokens": 4},
                message_ok,
            )
        },
        "/v1/messages/count_tokens": {
            "post": _operation(
                "The prompt's tokens for a messages body",
                "As the chat template renders it; nothing is generated.",
                obj(required, optional, extra=False),
                hello,
                count_ok,
            )
        },
    }
