"""The parsed body of Anthropic's ``POST /v1/messages`` (and ``/v1/messages/count_tokens``).

`MessagesRequest` checks a body field by field as Anthropic's API does: ``model``,
``max_tokens`` (required), ``messages`` (a string or text blocks each), ``system`` (a string
or text blocks), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``metadata``
(``user_id`` is the request's cache session), ``stream`` and ``cache_control`` on blocks and at
the top level; sage's ``tenant``, ``priority`` and ``cache_salt`` as on the OpenAI routes. Tool
use, images, documents and extended thinking are a 400 that says they are not served. The
conversation becomes chat messages (a message's text blocks joined as OpenAI's text parts are)
and its ``cache_control`` markers a `CacheAsk` (docs/concepts/prompt-caching.md):

- block-level markers: only the prompt up to the last marked block is written, under the
  longest lifetime a marker asks (``"5m"``, Anthropic's default, or ``"1h"``);
- a top-level marker (Anthropic's automatic caching, a marker on the last block): the whole
  prompt is written;
- none: sage's implicit caching as on the OpenAI routes, with no minimum lifetime.

Imports: the shared request handling, the prompt-cache fields and the chat message record.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from engine_adapter.model.chat_template import ChatMessage
from engine_adapter.serving.completion_requests import sampling_params
from engine_adapter.serving.prompt_cache import CacheAsk, conversation_prefix
from engine_adapter.serving.requests import (
    ApiError,
    bad_value,
    check_model,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
)

__all__ = ["COUNT_TOKENS_FIELDS", "MESSAGES_FIELDS", "MessagesRequest"]

MESSAGES_FIELDS = frozenset(
    {
        "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k",
        "metadata", "stream", "cache_control", "tools", "tool_choice", "thinking", "service_tier",
        "tenant", "priority", "cache_salt",
    }
)  # fmt: skip
COUNT_TOKENS_FIELDS = frozenset(
    {"model", "messages", "system", "cache_control", "tools", "tool_choice", "thinking"}
)
# Anthropic's lifetimes of a cache_control marker; "5m" is its default.
CACHE_TTL_S = {"5m": 300.0, "1h": 3_600.0}
MAX_CACHE_MARKERS = 4  # Anthropic's limit, the top-level marker included
_TOOL_BLOCKS = frozenset(
    {
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _ttl(where: str, marker: Any) -> float:
    """A ``cache_control`` marker's lifetime in seconds."""
    if not isinstance(marker, Mapping) or marker.get("type") != "ephemeral" or set(marker) - {"type", "ttl"}:
        raise bad_value(where, f'must be {{"type": "ephemeral", "ttl": "5m" | "1h"}}, got {marker!r:.80}')
    ttl = marker.get("ttl", "5m")
    if ttl not in CACHE_TTL_S:
        raise bad_value(f"{where}.ttl", f'must be "5m" or "1h", got {ttl!r:.40}')
    return CACHE_TTL_S[ttl]


def _block_text(where: str, block: Any) -> str:
    """A content block's text; any block but text is a 400 that says it is not served."""
    kind = block.get("type") if isinstance(block, Mapping) else None
    if kind == "text" and isinstance(block.get("text"), str):
        extra = set(block) - {"type", "text", "cache_control", "citations"}
        if extra or block.get("citations") is not None:
            raise bad_value(where, f"a text block takes type, text and cache_control, got {sorted(block)}")
        return str(block["text"])
    if kind in _TOOL_BLOCKS:
        raise bad_value(where, f"tool use is not served ({kind} block); send text blocks")
    if kind in ("image", "document"):
        raise bad_value(where, f"{kind}s are not served: sage serves a text-only model; send text blocks")
    if kind in _THINKING_BLOCKS:
        raise bad_value(where, f"extended thinking is not served ({kind} block); send text blocks")
    raise bad_value(where, f'must be a text block {{"type": "text", "text": str}}, got {block!r:.80}')


class _Markers:
    """The ``cache_control`` markers of a conversation, in Anthropic's order (system, messages)."""

    def __init__(self) -> None:
        self.ttls: list[float] = []
        self.last: tuple[int, int] | None = None  # (turn, block) of the last marked block
        self.last_long: tuple[int, int] | None = None  # ... of the last with the longest lifetime

    def add(self, where: str, marker: Any, position: tuple[int, int] | None) -> None:
        ttl = _ttl(where, marker)
        if self.ttls and ttl > self.ttls[-1]:  # Anthropic's rule: longer lifetimes come first
            raise bad_value(
                where, 'a "1h" cache_control must come before any "5m" one (longer lifetimes first)'
            )
        self.ttls.append(ttl)
        if len(self.ttls) > MAX_CACHE_MARKERS:
            raise bad_value(
                where, f"at most {MAX_CACHE_MARKERS} blocks may carry cache_control (top level included)"
            )
        if position is not None:
            self.last = position
            if ttl == self.ttls[0]:  # the longest: lifetimes never grow along the conversation
                self.last_long = position

    def short(self, turns: list[tuple[str, list[str]]]) -> tuple[list[ChatMessage], float] | None:
        """`CacheAsk.short`: the conversation up to the last longest-lived block, and the
        shorter lifetime past it; None when every marker asks one lifetime."""
        if not self.ttls or self.last_long is None or self.ttls[-1] == self.ttls[0]:
            return None
        return conversation_prefix(turns, *self.last_long), self.ttls[-1]


def _turn(where: str, content: Any, turn: int, markers: _Markers) -> list[str]:
    """A message's (or the system prompt's) text blocks, its markers added to `markers`."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list) or not content:
        raise bad_value(where, "must be a string or a non-empty list of text blocks")
    texts = []
    for j, block in enumerate(content):
        texts.append(_block_text(f"{where}[{j}]", block))
        if block.get("cache_control") is not None:
            markers.add(f"{where}[{j}].cache_control", block["cache_control"], (turn, j))
    return texts


def _conversation(body: dict[str, Any], markers: _Markers) -> list[tuple[str, list[str]]]:
    """The system prompt and the messages as (role, text blocks) turns."""
    turns: list[tuple[str, list[str]]] = []
    if body.get("system") is not None:
        turns.append(("system", _turn("system", body["system"], 0, markers)))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_value("messages", "is required: a non-empty list of {role, content} objects")
    for i, message in enumerate(raw):
        if not isinstance(message, Mapping) or set(message) - {"role", "content"}:
            raise bad_value(f"messages[{i}]", "must be an object with role and content")
        if message.get("role") not in ("user", "assistant"):
            raise bad_value(
                f"messages[{i}].role", f'must be "user" or "assistant", got {message.get("role")!r:.40}'
            )
        turns.append(
            (
                str(message["role"]),
                _turn(f"messages[{i}].content", message.get("content"), len(turns), markers),
            )
        )
    if turns[-1][0] == "assistant":
        raise bad_value(
            "messages", "a last assistant message (a prefill) is not served; end with a user message"
        )
    return turns


def _check_unserved(body: dict[str, Any]) -> None:
    """Tools and extended thinking: the values that ask for nothing are taken, others are a 400."""
    tools = body.get("tools")
    if tools is not None and tools != []:
        raise bad_value("tools", "tool use is not served; send no tools")
    choice = body.get("tool_choice")
    if choice is not None and choice != {"type": "none"}:
        raise bad_value("tool_choice", 'tool use is not served; send null or {"type": "none"}')
    thinking = body.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise bad_value("thinking", 'extended thinking is not served; send null or {"type": "disabled"}')
    tier = body.get("service_tier")
    if tier not in (None, "auto", "standard_only"):
        raise bad_value("service_tier", f'must be "auto" or "standard_only", got {tier!r:.40}')


def _session_key(body: dict[str, Any]) -> str | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or set(metadata) - {"user_id"}:
        raise bad_value("metadata", f'must be {{"user_id": str}}, got {metadata!r:.80}')
    return opt_str(dict(metadata), "user_id") or None


def _sampling_kwargs(body: dict[str, Any], require_max_tokens: bool) -> dict[str, Any]:
    max_tokens = opt_int(body, "max_tokens", minimum=1)
    if max_tokens is None and require_max_tokens:
        raise ApiError(400, "invalid_value", "'max_tokens' is required: the most tokens to generate")
    sampling: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    for field in ("temperature", "top_p"):
        value = opt_float(body, field)
        if value is not None:
            sampling[field] = value
    top_k = opt_int(body, "top_k", minimum=0)
    if top_k is not None:
        sampling["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad_value("stop_sequences", f"must be a list of strings, got {stops!r:.80}")
        sampling["stop"] = [s for s in stops if s]
    return sampling


class MessagesRequest:
    """A parsed POST /v1/messages body, in the shape `engine_adapter.serving.submit` takes.

    Args:
        body: The body (its fields already limited to `MESSAGES_FIELDS`).
        served_model: The engine's model; another name is a 404.
        require_max_tokens: False for ``count_tokens``, which generates nothing.
    """

    is_chat = True
    kv_compression = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    def __init__(self, body: dict[str, Any], served_model: str, *, require_max_tokens: bool = True) -> None:
        if body.get("model") is None:
            raise ApiError(400, "invalid_value", "'model' is required")
        self.model = check_model(body, served_model)
        _check_unserved(body)
        markers = _Markers()
        turns = _conversation(body, markers)
        automatic = body.get("cache_control") is not None
        if automatic:  # Anthropic's automatic caching: a marker on the last block, so counted last
            markers.add("cache_control", body["cache_control"], None)
        self.prompt: list[ChatMessage] = [ChatMessage(role, "".join(texts)) for role, texts in turns]
        explicit = bool(markers.ttls) and not automatic
        self.cache_ask = CacheAsk(
            session_key=_session_key(body),
            ttl_s=max(markers.ttls) if markers.ttls else None,
            explicit=explicit,
            prefix=conversation_prefix(turns, *markers.last) if explicit and markers.last else None,
            short=markers.short(turns),
        )
        self.sampling_kwargs = _sampling_kwargs(body, require_max_tokens)
        self.stop_sequences: list[str] = list(self.sampling_kwargs.get("stop", []))
        self.stream = opt_bool(body, "stream", False)
        self.tenant = opt_str(body, "tenant")
        self.priority = opt_int(body, "priority") or 0
        self.cache_salt = opt_str(body, "cache_salt")
        if self.cache_salt == "":
            raise bad_value("cache_salt", "must not be empty; leave it out for no salt")
        self.request_id = f"msg_{uuid.uuid4().hex}"

    def sampling_params(self) -> Any:
        return sampling_params(self.sampling_kwargs)
