"""The providers' prompt-cache fields, read into what the cache acts on, and the usage they report.

OpenAI's ``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options`` and its
``prompt_cache_breakpoint`` on content parts, and Anthropic's ``cache_control`` (on blocks and at
the top level) and ``metadata.user_id``, come down to a `CacheAsk`: a session key, a minimum
lifetime, and whether only the prompt up to the last marked part is written. The server reads
it from the body before the prompt is tokenised; once the prompt's token ids are known,
`cache_contract` turns it into the `CacheContract` the engine carries to the cache. The offset
of a breakpoint is found by rendering the conversation up to and including the marked part with
the chat template (no generation prompt) and taking the length of the prefix its tokens share
with the whole prompt's: exact wherever the template renders a conversation's prefix as a prefix
of its text, and never past the marked text where it does not (docs/concepts/prompt-caching.md).

Both APIs report the same three counts, which add up to the prompt: tokens read from the cache,
tokens this request wrote to it, and the rest (`cache_counts`).

Imports: the shared request handling, the chat message record and the contract; never the engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.contract import CacheContract
from engine_adapter.model.chat_template import ChatMessage
from engine_adapter.serving.requests import bad_value, opt_str

__all__ = [
    "OPENAI_CACHE_FIELDS",
    "CacheAsk",
    "CacheCounts",
    "cache_contract",
    "cache_counts",
    "conversation_prefix",
    "openai_cache_ask",
    "parse_duration",
    "shared_prefix_length",
]

# The top-level fields of OpenAI's chat and completions APIs that ask things of the prompt cache.
OPENAI_CACHE_FIELDS = frozenset({"prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"})
# prompt_cache_retention: "in_memory" is today's behaviour (no minimum lifetime); "24h" keeps the
# prefix a day, on a lower tier once the device needs the room (issue 51).
RETENTION_TTL_S: dict[str, float | None] = {"in_memory": None, "24h": 86_400.0}
# prompt_cache_options.ttl's default, as OpenAI documents it.
DEFAULT_OPTIONS_TTL = "30m"
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATIONS = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


@dataclass(frozen=True, slots=True)
class CacheAsk:
    """What a request asked of the prompt cache, before its prompt is tokenised.

    Attributes:
        session_key: The client's session (OpenAI's ``prompt_cache_key``, Anthropic's
            ``metadata.user_id``); never an isolation key.
        ttl_s: The minimum lifetime asked, in seconds; None: none.
        explicit: Only the prompt up to the last marked part is written (OpenAI's explicit mode,
            Anthropic's block-level ``cache_control``); with no marked part, nothing is.
        prefix: The conversation up to and including the last marked part (None: none marked).
        short: ``(conversation, ttl_s)``: past the conversation up to and including the last
            part marked with the longest lifetime, a shorter lifetime (Anthropic's ``"5m"``
            markers after ``"1h"`` ones); None: one lifetime.
    """

    session_key: str | None = None
    ttl_s: float | None = None
    explicit: bool = False
    prefix: list[ChatMessage] | None = None
    short: tuple[list[ChatMessage], float] | None = None

    @property
    def asked(self) -> bool:
        return self.session_key is not None or self.ttl_s is not None or self.explicit


def parse_duration(field: str, value: Any) -> float:
    """A duration string (``"30m"``, ``"1h"``, ``"24h"``, ``"1h30m"``, ``"90s"``) in seconds.

    Raises:
        ApiError: A 400 naming `field`: not such a string, or not positive.
    """
    if not isinstance(value, str) or not _DURATIONS.fullmatch(value):
        raise bad_value(field, f'must be a duration such as "5m", "30m", "1h" or "24h", got {value!r:.40}')
    seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(value))
    if not 0 < seconds < math.inf:  # "0m", or more digits than a float holds
        raise bad_value(field, f"must be a positive, finite duration, got {value!r:.40}")
    return seconds


def _options_ttl(options: Any) -> tuple[bool, float]:
    """``prompt_cache_options``: (explicit mode, minimum lifetime in seconds)."""
    if not isinstance(options, Mapping) or set(options) - {"mode", "ttl"}:
        raise bad_value("prompt_cache_options", f'must be {{"mode": ..., "ttl": ...}}, got {options!r:.80}')
    mode = options.get("mode")
    if mode not in (None, "implicit", "explicit"):
        raise bad_value("prompt_cache_options.mode", f'must be "implicit" or "explicit", got {mode!r:.40}')
    ttl = options.get("ttl")
    return mode == "explicit", parse_duration(
        "prompt_cache_options.ttl", DEFAULT_OPTIONS_TTL if ttl is None else ttl
    )


def openai_cache_ask(body: dict[str, Any]) -> CacheAsk:
    """The prompt-cache fields of an OpenAI chat or completions body (its messages already checked).

    ``prompt_cache_retention`` and ``prompt_cache_options.ttl`` are independent asks (OpenAI's
    words); both are minimum lifetimes here, and the longer one is kept. A breakpoint counts only
    in explicit mode (in implicit mode the whole prompt is written anyway); a completion has no
    parts to mark, so in explicit mode it writes nothing.
    """
    session_key = opt_str(body, "prompt_cache_key")
    if session_key == "":
        raise bad_value("prompt_cache_key", "must not be empty; leave it out for no session")
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in RETENTION_TTL_S:
        raise bad_value("prompt_cache_retention", f'must be "in_memory" or "24h", got {retention!r:.40}')
    ttls = [RETENTION_TTL_S[retention]] if retention is not None else []
    explicit = False
    if body.get("prompt_cache_options") is not None:
        explicit, options_ttl = _options_ttl(body["prompt_cache_options"])
        ttls.append(options_ttl)
    known = [t for t in ttls if t is not None]
    prefix = _breakpoint_prefix(body.get("messages"))  # checked even in implicit mode
    return CacheAsk(
        session_key=session_key,
        ttl_s=max(known) if known else None,
        explicit=explicit,
        prefix=prefix if explicit else None,
    )


def _breakpoint_prefix(messages: Any) -> list[ChatMessage] | None:
    """The conversation up to the last part marked with ``prompt_cache_breakpoint`` (None: none)."""
    if not isinstance(messages, list):  # a completion's body
        return None
    turns: list[tuple[str, list[str]]] = []
    last: tuple[int, int] | None = None
    for i, message in enumerate(messages):
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"text": content or ""}]
        for j, part in enumerate(parts):
            mark = part.get("prompt_cache_breakpoint")
            if mark is None:
                continue
            if mark != {"mode": "explicit"}:
                field = f"messages[{i}].content[{j}].prompt_cache_breakpoint"
                raise bad_value(field, f'must be {{"mode": "explicit"}}, got {mark!r:.60}')
            last = (i, j)
        turns.append((str(message["role"]), [str(p["text"]) for p in parts]))
    return None if last is None else conversation_prefix(turns, *last)


def conversation_prefix(
    turns: Sequence[tuple[str, Sequence[str]]], message: int, part: int, joiner: str = ""
) -> list[ChatMessage]:
    """The conversation up to and including part `part` of message `message`.

    Args:
        turns: Each message's role and its text parts, which the message's content joins.
        message: The index of the message holding the marked part.
        part: The marked part's index in it.
        joiner: What a message's parts are joined with (as the whole conversation joins them).
    """
    head = [ChatMessage(role, joiner.join(parts)) for role, parts in turns[:message]]
    role, parts = turns[message]
    return [*head, ChatMessage(role, joiner.join(parts[: part + 1]))]


def shared_prefix_length(ids: Sequence[int], prefix_ids: Sequence[int]) -> int:
    """How many leading tokens `ids` and `prefix_ids` share."""
    n = min(len(ids), len(prefix_ids))
    for i in range(n):
        if ids[i] != prefix_ids[i]:
            return i
    return n


def cache_contract(
    ask: CacheAsk | None,
    prompt_ids: Sequence[int] | None,
    render_prefix: Callable[[list[ChatMessage]], list[int]],
) -> CacheContract | None:
    """The `CacheContract` of a request whose prompt is `prompt_ids` (None: nothing asked).

    In explicit mode the request writes its prompt's first tokens up to the last marked part:
    the tokens it shares with the rendering of the conversation up to that part
    (`render_prefix`, the chat template with no generation prompt); with no marked part, none.
    """
    if ask is None or not ask.asked:
        return None
    write_tokens: int | None = None
    if ask.explicit:
        write_tokens = 0
        if ask.prefix is not None and prompt_ids is not None:
            write_tokens = shared_prefix_length(prompt_ids, render_prefix(ask.prefix))
    short_ttl = None
    if ask.short is not None and prompt_ids is not None:  # the tokens up to the last longer mark
        short_ttl = (shared_prefix_length(prompt_ids, render_prefix(ask.short[0])), ask.short[1])
    return CacheContract(ask.session_key, ask.ttl_s, write_tokens, short_ttl)


@dataclass(frozen=True, slots=True)
class CacheCounts:
    """A request's prompt tokens by what the cache did with them: they add up to the prompt."""

    read: int  # served from the cache
    written: int  # written to the cache by this request
    uncached: int  # computed and not written
    ttl_s: float | None  # the minimum lifetime granted to what it wrote (None: none)
    written_short: int = 0  # of `written`, tokens retained for the shorter lifetime (`short_ttl`)


def cache_counts(output: Any) -> CacheCounts:
    """Read, written and uncached prompt tokens of a `RequestOutput`."""
    prompt = int(output.prompt_tokens)
    read = int(output.cached_tokens)
    written = int(getattr(output, "written_tokens", 0) or 0)
    ttl = getattr(output, "retention_ttl_s", None)
    short = int(getattr(output, "written_short_tokens", 0) or 0)
    return CacheCounts(read, written, prompt - read - written, None if ttl is None else float(ttl), short)
