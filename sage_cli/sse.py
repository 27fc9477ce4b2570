"""One reader of ``text/event-stream`` bodies (server-sent events), for every stream the CLI reads.

The engine's ``POST /v1/completions`` with ``"stream": true`` (`sage_cli.client`) and a vLLM
OpenAI server (``sage llm benchmark --engine-kind vllm``) both answer with events whose data is
one JSON object, then ``data: [DONE]``. `read_events` splits the lines of such a body into
events as the WHATWG spec does: ``data:`` fields (the one space after the colon dropped, several
lines of one event joined by newlines), a blank line ending an event, comments and other fields
skipped. `json_chunks` decodes each event's JSON object up to ``[DONE]``.

Errors, which each caller translates at its own boundary (the control client into its
`EngineError` tree, the vLLM benchmark into a failed request)::

    StreamError               a stream the caller cannot use
    ├── StreamDecodeError     an event's data is not a JSON object
    └── StreamErrorEvent      the server reported an error: ``data: {"error": {"type", "message"}}``

Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DONE",
    "ServerSentEvent",
    "StreamDecodeError",
    "StreamError",
    "StreamErrorEvent",
    "json_chunks",
    "read_events",
]

DONE = "[DONE]"


class StreamError(Exception):
    """Base of the errors of a stream of JSON events."""


class StreamDecodeError(StreamError):
    """An event's data is not a JSON object; the message quotes its start."""


class StreamErrorEvent(StreamError):
    """The server reported an error inside the stream (after its 200 answer had begun).

    Attributes:
        error_type: The event's ``error.type``, e.g. ``"engine_error"``.
        message: The event's ``error.message``; ``str(exc)`` is this message.
    """

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One event: its type (``message`` unless an ``event:`` field names another) and its data."""

    event: str
    data: str


def read_events(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """The events of a body given as its lines (without their line endings).

    An event is dispatched at the blank line that ends it; one left open at the end of the body
    still counts (a server that closes without the last blank line loses nothing).
    """
    event = ""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield ServerSentEvent(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):  # a comment (a keep-alive)
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        yield ServerSentEvent(event or "message", "\n".join(data))


def json_chunks(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Each event's JSON object, until ``data: [DONE]`` or the end of the body.

    Raises:
        StreamDecodeError: An event whose data is not a JSON object.
        StreamErrorEvent: An error event, ``{"error": {"type": ..., "message": ...}}``.
    """
    for event in read_events(lines):
        if event.data == DONE:
            return
        try:
            chunk: Any = json.loads(event.data)
        except json.JSONDecodeError:
            raise StreamDecodeError(f"not JSON: {event.data[:120]!r}") from None
        if not isinstance(chunk, dict):
            raise StreamDecodeError(f"not a JSON object: {event.data[:120]!r}")
        error = chunk.get("error")
        if isinstance(error, dict):
            raise StreamErrorEvent(str(error.get("type")), str(error.get("message")))
        yield chunk
