"""The parsed body of ``POST /v1/embeddings`` and its answer (OpenAI's format).

`EmbeddingRequest` checks OpenAI's fields (``dimensions`` is refused: the model's own width is
served) and sage's extensions (tenant, priority, the ``slo_deadline_ms`` SLO), and builds the
answer: one ``embedding`` object per input, as floats or base64.

Imports: the shared request handling (`requests`); the model's pooling, inside `answer`.
"""

from __future__ import annotations

import uuid
from typing import Any

from engine_adapter.serving.requests import (
    ApiError,
    bad_value,
    check_model,
    is_token_ids,
    opt_int,
    opt_slo_ms,
    opt_str,
)

__all__ = ["EMBEDDING_FIELDS", "MAX_EMBEDDING_INPUTS", "EmbeddingRequest"]

# POST /v1/embeddings: OpenAI's fields (`dimensions` is refused: the model's width is served) and
# sage's extensions (tenant, priority, the deadline SLO).
EMBEDDING_FIELDS = frozenset(
    {"model", "input", "encoding_format", "user", "dimensions", "tenant", "priority", "slo_deadline_ms"}
)
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the texts of one request


class EmbeddingRequest:
    """A parsed POST /v1/embeddings body (OpenAI's format, sage's SLO and tenant extensions)."""

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        self.model = check_model(body, served_model)
        self.inputs = _embedding_inputs(body)
        encoding = opt_str(body, "encoding_format")
        encoding = "float" if encoding is None else encoding  # absent or null; "" is refused
        if encoding not in ("float", "base64"):
            raise bad_value("encoding_format", f"must be 'float' or 'base64', got {encoding!r:.40}")
        self.encoding_format = encoding
        if body.get("dimensions") is not None:
            raise bad_value("dimensions", "the model's own width is served; leave it out")
        self.user = opt_str(body, "user")
        tenant = opt_str(body, "tenant")
        self.tenant = tenant if tenant is not None else self.user
        self.priority = opt_int(body, "priority") or 0
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
    elif is_token_ids(value) and value:
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
        elif is_token_ids(item):
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
