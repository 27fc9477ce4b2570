"""`sage_cli.sse`, the one reader of event streams, and its two callers: the control client's
`stream_completion` (the engine benchmark) and the vLLM benchmark's streamed completion
(httpx's `MockTransport`: the bodies are what the servers send)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sage_cli.client import ControlClient, EngineError, EngineProtocolError
from sage_cli.sse import (
    ServerSentEvent,
    StreamDecodeError,
    StreamErrorEvent,
    json_chunks,
    read_events,
)


def sse(*chunks: Any, done: bool = True) -> str:
    """A body as the engine and vLLM send it: ``data: <json>`` and a blank line per chunk."""
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return body + ("data: [DONE]\n\n" if done else "")


def test_events_follow_the_spec() -> None:
    lines = [": keep-alive", "data: a", "", "event: error", "data:b", "data: c", "", "id: 3", "retry: 10", ""]
    assert list(read_events(lines)) == [
        ServerSentEvent("message", "a"),
        ServerSentEvent("error", "b\nc"),  # no space after the colon; two data lines joined
    ]
    # an event left open at the end of the body still counts; blank lines alone are no events
    assert list(read_events(["", "", "data: x"])) == [ServerSentEvent("message", "x")]
    assert list(read_events(["data:  two spaces", ""])) == [ServerSentEvent("message", " two spaces")]


def test_json_chunks_stop_at_done() -> None:
    lines = [*sse({"a": 1}, {"b": 2}).splitlines(), 'data: {"after": true}', ""]
    assert list(json_chunks(lines)) == [{"a": 1}, {"b": 2}]
    assert list(json_chunks(sse({"a": 1}, done=False).splitlines())) == [{"a": 1}]


@pytest.mark.parametrize("data", ["{oops", "[1, 2]", "3"])
def test_json_chunks_refuse_what_is_no_json_object(data: str) -> None:
    with pytest.raises(StreamDecodeError, match="not"):
        list(json_chunks([f"data: {data}", ""]))


def test_json_chunks_raise_the_error_event() -> None:
    lines = sse({"a": 1}, {"error": {"type": "engine_error", "message": "boom"}}).splitlines()
    chunks = json_chunks(lines)
    assert next(chunks) == {"a": 1}
    with pytest.raises(StreamErrorEvent, match="boom") as caught:
        next(chunks)
    assert caught.value.error_type == "engine_error"
    # an "error" that is not an object is no error event
    assert list(json_chunks(sse({"error": "text"}).splitlines())) == [{"error": "text"}]


def _client(body: str) -> ControlClient:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    return ControlClient("/tmp/unused.sock", transport=httpx.MockTransport(handler))


def test_the_control_client_streams_through_the_reader() -> None:
    chunks = [{"choices": [{"text": "a", "finish_reason": None}]}, {"choices": [], "usage": {"x": 1}}]
    assert list(_client(sse(*chunks)).stream_completion({"prompt": "p"})) == chunks
    failed = _client(sse({"error": {"type": "engine_error", "message": "the engine failed"}}))
    with pytest.raises(EngineError, match="the engine failed") as caught:
        list(failed.stream_completion({}))
    assert (caught.value.status_code, caught.value.error_type) == (500, "engine_error")
    with pytest.raises(EngineProtocolError, match="completion stream: not JSON"):
        list(_client("data: {oops\n\n").stream_completion({}))


def _vllm(body: str) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    return httpx.Client(base_url="http://vllm", transport=httpx.MockTransport(handler))


def test_the_vllm_benchmark_counts_its_tokens_from_usage() -> None:
    from sage_cli.benchmark.remote import stream_http_completion

    usage = {"prompt_tokens": 7, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}
    chunks = [
        {"choices": [{"text": "a"}]},
        {"choices": [{"text": ""}]},  # no text: no token time
        {"choices": [{"text": "b"}]},
        {"choices": [], "usage": usage},
    ]
    run = stream_http_completion(_vllm(sse(*chunks)), {})
    assert run.ok and run.error is None
    assert (run.prompt_tokens, run.completion_tokens, run.cached_tokens) == (7, 5, 4)
    assert run.ttft_s is not None and run.text == "ab"
    assert len(run.tpot_s) == 1  # one TPOT per request: (last - first) / (tokens - 1)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (sse({"error": {"type": "internal", "message": "out of blocks"}}), "StreamErrorEvent: out of blocks"),
        ("data: {oops\n\n", "StreamDecodeError: not JSON"),
    ],
)
def test_the_vllm_benchmark_counts_a_broken_stream_as_a_failed_request(body: str, error: str) -> None:
    from sage_cli.benchmark.remote import stream_http_completion

    run = stream_http_completion(_vllm(body), {})
    assert not run.ok
    assert run.error is not None and run.error.startswith(error)
