"""The control API's contract: an OpenAPI 3.1 document, served at ``GET /openapi.json``.

It is built here, in one place, from small schema helpers; ``docs/openapi.json`` is the same
document checked into the repository (``python -m engine_adapter.serving.openapi > docs/openapi.json``
writes it, and a test keeps the two equal). A schemathesis run against a live engine checks that
every answer matches it and that no request gets a 5xx (tests/test_openapi_contract.py).
"""

from __future__ import annotations

import json
from typing import Any

from engine_adapter.serving.openapi_messages import (
    anthropic_error_schema,
    chat_text_part,
    messages_paths,
    openai_cache_fields,
    openai_usage,
)
from engine_adapter.serving.openapi_quotas import quota_paths, quota_schemas
from engine_adapter.serving.openapi_receipts import receipt_paths, receipt_schemas
from engine_adapter.serving.openapi_schemas import (
    cache_schemas,
    engine_schemas,
    eviction_schemas,
    tier_and_token_schemas,
)
from engine_adapter.serving.openapi_types import BOOL, INT, MAP, NUM, STR, Schema
from engine_adapter.serving.openapi_types import nullable as _nullable
from engine_adapter.serving.openapi_types import obj as _obj
from engine_adapter.serving.openapi_types import ref as _ref
from engine_adapter.token_eviction.registry import token_policy_names
from sage_eviction import available_policies

__all__ = ["openapi_document"]


_ERROR_STATUSES = {
    "400": "A malformed or invalid request; the message names the field.",
    "401": "Over TCP: a missing or wrong API key.",
    "404": "A model other than the one served.",
    "408": "The headers or the body did not arrive in time.",
    "413": "The body is over the engine's max_body_bytes.",
    "429": "With colocation on: admission control rejected the request (the message says why).",
    "503": "The engine is shutting down, or too many connections are open.",
}


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: str) -> dict[str, Schema]:
    codes = statuses or tuple(c for c in _ERROR_STATUSES if c != "429")
    return {code: _json(_ref("Error"), _ERROR_STATUSES[code]) for code in codes}


def _operation(
    summary: str,
    ok: Schema,
    *,
    body: Schema | None = None,
    example: Schema | None = None,
    params: list[Schema] | None = None,
    description: str | None = None,
) -> Schema:
    operation: Schema = {"summary": summary, "responses": {"200": ok, **_errors()}}
    if description is not None:
        operation["description"] = description
    if body is not None:
        media: Schema = {"schema": body}
        if example is not None:
            media["example"] = example
        operation["requestBody"] = {"required": True, "content": {"application/json": media}}
    if params:
        operation["parameters"] = params
    return operation


_SLO_MS: Schema = _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 86_400_000})
_PENALTY: Schema = _nullable({"type": "number", "minimum": -2, "maximum": 2})


def _admitted(operation: Schema) -> Schema:
    """An operation that colocation's admission control may answer with a 429."""
    operation["responses"].update(_errors("429"))
    return operation


# The default of max_tokens, as OpenAI's API and vLLM's server have it: 16 for a text completion
# (the legacy API's), the rest of the context for a chat (a chat answer is not cut short unasked).
COMPLETION_MAX_TOKENS = "Most tokens to generate; default 16 (OpenAI's and vLLM's default for completions)."
CHAT_MAX_TOKENS = (
    "Most tokens to generate (max_completion_tokens is the same); default: the rest of the context, "
    "the model's context and the KV pool less the prompt (OpenAI's and vLLM's default for chats)."
)


def _completion_request(
    prompt_field: str, prompt: Schema, extra: dict[str, Schema], max_tokens_doc: str
) -> Schema:
    """The fields of a completion or chat request: OpenAI's that sage serves, and sage's own."""
    fields: dict[str, Schema] = {
        "model": _nullable(STR),
        "max_tokens": {**_nullable({"type": "integer", "minimum": 1}), "description": max_tokens_doc},
        "temperature": _nullable({"type": "number", "minimum": 0}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": _nullable({"type": "integer", "minimum": -1}),
        "stop": _nullable({"anyOf": [STR, {"type": "array", "items": STR}]}),
        "seed": _nullable(INT),
        "stream": _nullable(BOOL),
        "stream_options": _nullable(
            _obj({}, {"include_usage": _nullable(BOOL), "include_obfuscation": _nullable(BOOL)}, extra=False)
        ),
        "user": _nullable(STR),
        "n": _nullable({"type": "integer", "const": 1}),
        "logprobs": {"enum": [None, 0, False]},
        "frequency_penalty": _PENALTY,
        "presence_penalty": _PENALTY,
        "logit_bias": _nullable({"type": "object", "maxProperties": 0}),
        "priority": _nullable(INT),
        "tenant": _nullable(STR),
        "cache_salt": _nullable({"type": "string", "minLength": 1}),
        "ignore_eos": _nullable(BOOL),
        # Token-level eviction: compress the prompt once after prefill (kvpress's compression_ratio).
        "kv_compression": _nullable(
            _obj(
                {
                    # A name, or a spec with params ("adakv:snapkv"), which the engine checks.
                    "policy": {
                        "anyOf": [{"enum": [n for n in token_policy_names() if n != "none"]}, _text()]
                    },
                    "ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                },
                extra=False,
            )
        ),
        # SLOs (spec 004): defaults per tenant from the engine config.
        "slo_ttft_ms": _SLO_MS,
        "slo_tpot_ms": _SLO_MS,
        # OpenAI's prompt-cache fields (docs/concepts/prompt-caching.md)
        **openai_cache_fields(),
    }
    schema = _obj({prompt_field: prompt}, {**fields, **extra}, extra=False)
    # stream_options only with stream: true.
    schema["if"] = {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]}
    schema["then"] = {"properties": {"stream": {"const": True}}, "required": ["stream"]}
    return schema


def _completion_answer(object_name: str, choice: Schema) -> Schema:
    ok = _obj(
        {
            "id": STR,
            "object": {"const": object_name},
            "created": INT,
            "model": _nullable(STR),
            "choices": {"type": "array", "items": choice},
            "usage": openai_usage(),
        }
    )
    return {
        "description": "The whole answer; with stream: true, server-sent events of chunks ending in [DONE].",
        "content": {
            "application/json": {"schema": ok},
            "text/event-stream": {"schema": {"anyOf": [MAP, STR]}},
        },
    }


def _text() -> Schema:
    return {"type": "string", "minLength": 1}


def _token_ids() -> Schema:
    return {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


def _engine_paths() -> dict[str, Schema]:
    """The engine itself: liveness and its info."""
    return {
        "/health": {
            "get": _operation("Liveness", _json(_obj({"status": STR, "name": STR, "pid": INT}), "Alive"))
        },
        "/v1/engine": {
            "get": _operation(
                "The engine: model, device, policy, pool, requests", _json(_ref("Engine"), "Info")
            )
        },
    }


def _eviction_paths() -> dict[str, Schema]:
    """Block-level eviction: stats, the policies and their hot swap."""
    return {
        "/v1/eviction/stats": {
            "get": _operation("Eviction statistics", _json(_ref("EvictionStats"), "Stats"))
        },
        "/v1/eviction/policies": {
            "get": _operation(
                "The policies and their params, and the active one",
                _json(
                    _obj({"active": STR, "policies": {"type": "array", "items": _ref("Policy")}}), "Policies"
                ),
            )
        },
        "/v1/eviction/policy": {
            "put": _operation(
                "Hot swap of the eviction policy",
                _json(
                    _obj(
                        {
                            "old": _ref("PolicyRef"),
                            "new": _ref("PolicyRef"),
                            "swap_time_s": NUM,
                            "entries": INT,
                        }
                    ),
                    "Swapped",
                ),
                # The online policies by name; any other string may be a spec ("slru:k=v"), an
                # alias or another case of a name, which the engine resolves or refuses.
                body=_obj(
                    {"policy": {"anyOf": [{"enum": available_policies(include_offline=False)}, _text()]}},
                    {"params": _nullable(MAP)},
                    extra=False,
                ),
                example={"policy": "lru"},
            )
        },
    }


def _token_and_log_paths() -> dict[str, Schema]:
    """Token-level eviction and its hot swap, and the eviction events."""
    return {
        "/v1/eviction/token": {
            "get": _operation(
                "Token-level eviction: the policy, its settings, what it evicted",
                _json(_ref("TokenEviction"), "Token eviction"),
            ),
            "put": _operation(
                "Hot swap of the token-level policy",
                _json(
                    _obj({"old": STR, "new": STR, "params": MAP, "swap_time_s": NUM}),
                    "Swapped",
                ),
                body=_obj({"policy": {"anyOf": [{"enum": token_policy_names()}, _text()]}}, extra=False),
                example={"policy": "sliding"},
            ),
        },
        "/v1/eviction/logs": {
            "get": _operation(
                "The last eviction events; with follow=true, NDJSON as they happen",
                {
                    "description": "The events (or their NDJSON stream)",
                    "content": {
                        "application/json": {"schema": _obj({"events": {"type": "array", "items": MAP}})},
                        "application/x-ndjson": {"schema": STR},
                    },
                },
                params=[
                    {
                        "name": "tail",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                    },
                    {"name": "follow", "in": "query", "schema": {"type": "boolean"}},
                ],
            )
        },
    }


def _completion_paths() -> dict[str, Schema]:
    """OpenAI's completions and chat completions."""
    finish = _nullable(STR)
    text_choice = _obj({"index": INT, "text": STR, "finish_reason": finish})
    chat_choice = _obj(
        {"index": INT, "message": _obj({"role": STR, "content": STR}), "finish_reason": finish}
    )
    content = {"anyOf": [STR, {"type": "array", "items": chat_text_part()}, {"type": "null"}]}
    message = _obj(
        {"role": {"enum": ["system", "user", "assistant", "tool", "developer"]}}, {"content": content}
    )
    text, ids = _text(), _token_ids()
    # A string or token ids; a batch of exactly one of either is taken as that one.
    prompt = {
        "anyOf": [
            text,
            ids,
            {"type": "array", "items": text, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": ids, "minItems": 1, "maxItems": 1},
        ]
    }
    return {
        "/v1/completions": {
            "post": _admitted(
                _operation(
                    "OpenAI-compatible text completion",
                    _completion_answer("text_completion", text_choice),
                    body=_completion_request(
                        "prompt", prompt, {"echo": _nullable({"const": False})}, COMPLETION_MAX_TOKENS
                    ),
                    description="Without max_tokens it generates at most 16 tokens, as OpenAI's "
                    "completions API and vLLM do.",
                    example={"prompt": "Once upon a time", "max_tokens": 4},
                )
            )
        },
        "/v1/chat/completions": {
            "post": _admitted(
                _operation(
                    "OpenAI-compatible chat completion, rendered with the model's chat template",
                    _completion_answer("chat.completion", chat_choice),
                    body=_completion_request(
                        "messages",
                        {"type": "array", "items": message, "minItems": 1},
                        {
                            "max_completion_tokens": _nullable({"type": "integer", "minimum": 1}),
                            "response_format": _nullable(_obj({"type": {"const": "text"}}, extra=False)),
                            "top_logprobs": _nullable({"type": "integer", "const": 0}),
                        },
                        CHAT_MAX_TOKENS,
                    ),
                    description="Without max_tokens (or max_completion_tokens) it generates until the "
                    "model stops or the context is full: the rest of the model's context and of the KV "
                    "pool after the prompt, as OpenAI's chat API and vLLM do.",
                    example={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
                )
            )
        },
    }


def _embedding_paths() -> dict[str, Schema]:
    """OpenAI's embeddings."""
    text, ids = _text(), _token_ids()
    answer = _obj(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _obj(
                    {
                        "object": {"const": "embedding"},
                        "index": INT,
                        "embedding": {"anyOf": [{"type": "array", "items": NUM}, STR]},
                    }
                ),
            },
            "model": STR,
            "usage": _obj({"prompt_tokens": INT, "total_tokens": INT}),
        }
    )
    body = _obj(
        {
            "input": {
                "anyOf": [
                    text,
                    ids,
                    {"type": "array", "items": {"anyOf": [text, ids]}, "minItems": 1, "maxItems": 2048},
                ]
            }
        },
        {
            "model": _nullable(STR),
            "encoding_format": _nullable({"enum": ["float", "base64"]}),
            "user": _nullable(STR),
            "dimensions": {"type": "null"},
            "tenant": _nullable(STR),
            "priority": _nullable(INT),
            "slo_deadline_ms": _SLO_MS,
        },
        extra=False,
    )
    return {
        "/v1/embeddings": {
            "post": _admitted(
                _operation(
                    "OpenAI-compatible embeddings: the served model's mean-pooled, L2-normalised last "
                    "hidden state, computed in chunks between the LLM's steps",
                    _json(answer, "One vector per input, in input order (base64: little-endian float32s)"),
                    body=body,
                    example={"input": ["Hello", "world"]},
                )
            )
        },
        "/v1/models": {
            "get": _operation(
                "The served model",
                _json(_obj({"object": {"const": "list"}, "data": {"type": "array", "items": MAP}}), "Models"),
            )
        },
    }


def _cache_paths() -> dict[str, Schema]:
    """The prefix cache: reset, its tree and its use."""
    return {
        "/v1/cache/reset": {
            "post": _operation(
                "Drop every unreferenced cached block", _json(_obj({"freed_blocks": INT}), "Reset")
            )
        },
        "/v1/cache/tree": {
            "get": _operation(
                "The radix prefix tree, cut to depth and max_nodes, with recently evicted ghosts",
                _json(_ref("CacheTree"), "The tree"),
                params=[
                    {
                        "name": "depth",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 64},
                    },
                    {
                        "name": "max_nodes",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 2000},
                    },
                ],
            )
        },
        "/v1/cache/usage": {
            "get": _operation(
                "Pool use by tenant and priority class, the queue and the running-batch limit",
                _json(_ref("CacheUsage"), "Pool use"),
            )
        },
    }


def _process_paths() -> dict[str, Schema]:
    """The process: shutdown, metrics and this document."""
    return {
        "/v1/engine/shutdown": {
            "post": _operation(
                "Drain and stop the engine", _json(_obj({"status": {"const": "draining"}}), "Draining")
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus metrics",
                {"description": "Prometheus text exposition", "content": {"text/plain": {"schema": STR}}},
            )
        },
        "/openapi.json": {"get": _operation("This document", _json(MAP, "The OpenAPI document"))},
    }


def _paths() -> dict[str, Schema]:
    """Every path, grouped as the API is (the order is the document's)."""
    return {
        **_engine_paths(),
        **_eviction_paths(),
        **_token_and_log_paths(),
        **_completion_paths(),
        **messages_paths(),
        **_embedding_paths(),
        **_cache_paths(),
        **quota_paths(),
        **receipt_paths(),
        **_process_paths(),
    }


def _components() -> Schema:
    return {
        "schemas": {
            **engine_schemas(),
            **eviction_schemas(),
            **tier_and_token_schemas(),
            **cache_schemas(),
            **quota_schemas(),
            **receipt_schemas(),
            "AnthropicError": anthropic_error_schema(),
        },
        "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the control API (docs/architecture.md, "Control API")."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sage engine control API",
            "version": "1",
            "description": "Served on the engine's Unix socket, and over TCP behind a bearer API key "
            "(every path but /health) when the engine is started with --host and --port.",
        },
        "paths": _paths(),
        "components": _components(),
    }


if __name__ == "__main__":
    print(json.dumps(openapi_document(), indent=2, sort_keys=True))
