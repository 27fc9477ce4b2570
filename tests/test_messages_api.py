"""Anthropic's Messages API (issue 51, item 2) on a real engine, in process, with the official client.

The official ``anthropic`` client talks to the app (its httpx client is Starlette's TestClient):
a message whole and streamed (Anthropic's event sequence, the same text, usage that adds up to
the prompt the OpenAI route counts for the same conversation), stop sequences, ``cache_control``
on blocks and at the top level and ``metadata.user_id`` reaching the engine as the request's
`CacheContract` (the engine's ``submit`` wrapped to record it, still serving), Anthropic's
error shape for what is not served, and the API key as ``x-api-key``. LiteLLM's Anthropic route
against an engine process is in tests/test_openai_frameworks.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from engine_fixtures import SubmitRecorder, app_client, serving
from hypothesis import given
from hypothesis import strategies as st
from lazy_extras import lazy
from starlette.testclient import TestClient

from engine_adapter.cache.contract import CacheContract
from engine_adapter.serving.app import build_app
from engine_adapter.serving.auth import ApiKeyGate
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.messages import anthropic_usage
from engine_adapter.serving.sequence import RequestOutput

anthropic = lazy("anthropic")  # the official client, imported by the first test that uses it

MODEL = "sage-tiny"
HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with serving(num_blocks=1024) as eng:
        yield eng


@pytest.fixture
def recorded(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> SubmitRecorder:
    return SubmitRecorder.installed(engine, monkeypatch)


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


@pytest.fixture(scope="module")
def claude(client: TestClient) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://testserver", api_key="-", http_client=client, max_retries=0)


def _prompt_tokens(client: TestClient, system: str, user: str) -> int:
    """The prompt's tokens as the OpenAI route counts the same conversation."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    return int(r.json()["usage"]["prompt_tokens"])


def _adds_up(usage: Any, prompt_tokens: int) -> None:
    total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert total == prompt_tokens
    assert usage.input_tokens >= 0
    buckets = usage.cache_creation
    assert (
        buckets.ephemeral_5m_input_tokens + buckets.ephemeral_1h_input_tokens
        == usage.cache_creation_input_tokens
    )


# ---- a message, whole and streamed -----------------------------------------------------------------


def test_a_message_whole_and_streamed_gives_the_same_text_and_usage_that_adds_up(
    claude: anthropic.Anthropic, client: TestClient
) -> None:
    system, user = "You are a terse assistant.", "Name a colour."
    whole = claude.messages.create(
        model=MODEL,
        max_tokens=4,
        extra_body={"temperature": 0},
        system=system,
        messages=[{"role": "user", "content": user}],
    )
    assert (whole.type, whole.role, whole.model) == ("message", "assistant", MODEL)
    assert whole.id.startswith("msg_") and whole.stop_reason == "max_tokens"
    assert whole.usage.output_tokens == 4
    prompt_tokens = _prompt_tokens(client, system, user)
    _adds_up(whole.usage, prompt_tokens)

    events = list(
        claude.messages.create(
            model=MODEL,
            max_tokens=4,
            extra_body={"temperature": 0},
            system=[{"type": "text", "text": system}],
            messages=[{"role": "user", "content": [{"type": "text", "text": user}]}],
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    deltas = kinds.count("content_block_delta")
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # fmt: skip (the client drops the ping: test_the_raw_stream_names_each_event)
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert text == whole.content[0].text  # type: ignore[union-attr]
    final = events[-2]
    assert final.type == "message_delta" and final.delta.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 4
    assert (
        final.usage.input_tokens
        + final.usage.cache_read_input_tokens
        + final.usage.cache_creation_input_tokens
        == prompt_tokens
    )  # type: ignore[operator]


def test_the_raw_stream_names_each_event(client: TestClient) -> None:
    """Each event's ``event:`` line names the type its data carries; a ping follows the block's start."""
    body = {"model": MODEL, "max_tokens": 2, "messages": HELLO, "stream": True}
    frames = [f for f in client.post("/v1/messages", json=body).text.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    for frame, name in zip(frames, names, strict=True):
        assert json.loads(frame.split("\n")[1].removeprefix("data: "))["type"] == name


def test_the_clients_stream_helper_accumulates_the_message(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=3, messages=HELLO) as stream:  # type: ignore[arg-type]
        pieces = list(stream.text_stream)
        message = stream.get_final_message()
    assert "".join(pieces) == message.content[0].text  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    counted = claude.messages.count_tokens(model=MODEL, messages=HELLO)  # type: ignore[arg-type]
    u = message.usage
    assert (
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        == counted.input_tokens
    )


def test_a_stop_sequence_ends_the_message_and_is_named(claude: anthropic.Anthropic) -> None:
    free = claude.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0}, messages=HELLO)  # type: ignore[arg-type]
    text = free.content[0].text  # type: ignore[union-attr]
    k = next(i for i in range(1, len(text)) if text[i] not in text[:i] and text[i].strip())
    stopped = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        extra_body={"temperature": 0},
        messages=HELLO,
        stop_sequences=["\x00never", text[k]],  # type: ignore[arg-type]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == text[k]
    assert stopped.content[0].text == text[:k]  # type: ignore[union-attr]
    streamed = list(
        claude.messages.create(
            model=MODEL,
            max_tokens=8,
            extra_body={"temperature": 0},
            messages=HELLO,
            stop_sequences=[text[k]],
            stream=True,  # type: ignore[arg-type]
        )
    )
    delta = streamed[-2]
    assert delta.type == "message_delta" and delta.delta.stop_sequence == text[k]


# ---- cache_control and metadata reach the engine ---------------------------------------------------


def _an_hour_then_five_minutes(
    claude: anthropic.Anthropic, system: str, marked: str, unmarked: str, **fields: Any
) -> Any:
    """A message whose system prompt is marked "1h" and whose user turn is a block marked "5m"
    (the default) and an unmarked one."""
    return claude.messages.create(
        model=MODEL,
        max_tokens=1,
        system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": marked, "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": unmarked},
                ],
            }
        ],
        **fields,
    )


def test_block_markers_write_up_to_the_last_marked_block_under_the_longest_ttl(
    claude: anthropic.Anthropic, recorded: SubmitRecorder, engine: Engine
) -> None:
    system = "You review code. " * 3
    _an_hour_then_five_minutes(claude, system, "File one.", " Question?", metadata={"user_id": "session-9"})
    (contract,) = recorded.contracts
    assert contract is not None and contract.write_tokens is not None
    assert (contract.session_key, contract.ttl_s) == ("session-9", 3_600.0)
    written = engine.tokenizer.decode(recorded.prompts[0][: contract.write_tokens])
    assert written == f"<|system|>{system}\n<|user|>File one."  # sage-tiny's template, to the marked block
    # the "5m" block after the "1h" one: five minutes past the system prompt, an hour up to it
    assert contract.short_ttl is not None and contract.short_ttl[1] == 300.0
    hour = engine.tokenizer.decode(recorded.prompts[0][: contract.short_ttl[0]])
    assert hour.startswith(f"<|system|>{system}") and "File one" not in hour


def test_the_usage_buckets_the_tokens_written_under_each_lifetime(claude: anthropic.Anthropic) -> None:
    system = "A system prompt kept for an hour, long enough for several blocks. "
    question = "And a question kept five minutes."
    usage = _an_hour_then_five_minutes(claude, system, question, " Unmarked.").usage
    creation = usage.cache_creation
    assert creation is not None  # sage-tiny: a token a byte, 4-token blocks
    assert creation.ephemeral_1h_input_tokens >= len(system) - 4
    assert creation.ephemeral_5m_input_tokens >= len(question) - 4
    total = creation.ephemeral_1h_input_tokens + creation.ephemeral_5m_input_tokens
    assert total == usage.cache_creation_input_tokens


def test_top_level_cache_control_writes_the_whole_prompt_and_none_asks_nothing(
    claude: anthropic.Anthropic, recorded: SubmitRecorder
) -> None:
    claude.messages.create(model=MODEL, max_tokens=1, messages=HELLO, cache_control={"type": "ephemeral"})  # type: ignore[arg-type]
    claude.messages.create(model=MODEL, max_tokens=1, messages=HELLO)  # type: ignore[arg-type]
    claude.messages.create(model=MODEL, max_tokens=1, messages=HELLO, metadata={"user_id": "u1"})  # type: ignore[arg-type]
    assert recorded.contracts == [CacheContract(ttl_s=300.0), None, CacheContract(session_key="u1")]


@given(
    st.integers(0, 4000)
    .flatmap(lambda prompt: st.tuples(st.just(prompt), st.integers(0, prompt), st.integers(0, prompt)))
    .filter(lambda t: t[1] + t[2] <= t[0]),
    st.one_of(st.none(), st.sampled_from([60.0, 300.0, 3_599.0, 3_600.0, 86_400.0])),
)
def test_anthropic_usage_adds_up_and_buckets_by_the_granted_lifetime(
    counts: tuple[int, int, int], ttl: float | None
) -> None:
    prompt, read, written = counts
    output = RequestOutput("r", "", [], True, "stop", prompt_tokens=prompt, cached_tokens=read,
                           completion_tokens=3, written_tokens=written, retention_ttl_s=ttl)  # fmt: skip
    usage = anthropic_usage(output)
    assert (
        usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        == prompt
    )
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (read, written)
    one_hour = usage["cache_creation"]["ephemeral_1h_input_tokens"]
    assert one_hour == (written if ttl is not None and ttl >= 3_600 else 0)
    assert usage["cache_creation"]["ephemeral_5m_input_tokens"] == written - one_hour


# ---- what is not served: Anthropic's error shape, naming the field ---------------------------------

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"name": "t", "input_schema": {"type": "object"}}]}, "tool use is not served"),
    ({"tool_choice": {"type": "auto"}}, "tool use is not served"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
            ]
        },
        "images are not served",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}
            ]
        },
        "tool use is not served",
    ),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "extended thinking is not served"),
    ({"max_tokens": None}, "'max_tokens' is required"),
    ({"cache_control": {"type": "ephemeral", "ttl": "10m"}}, "'cache_control.ttl'"),
    ({"cache_control": {"type": "persistent"}}, "'cache_control'"),
    ({"metadata": {"user_id": "u", "org": "o"}}, "'metadata'"),
    ({"messages": [{"role": "assistant", "content": "Prefill"}]}, "prefill"),
    ({"messages": [{"role": "system", "content": "x"}]}, "'messages[0].role'"),
    ({"stop_sequences": "END"}, "'stop_sequences'"),
    ({"top_k": -1}, "'top_k'"),
    ({"frequency_penalty": 1.0}, "'frequency_penalty'"),
    (
        {
            "system": [
                {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
                {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ]
        },
        "longer lifetimes first",
    ),
    (
        {
            "system": [
                {"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(4)
            ],
            "cache_control": {"type": "ephemeral"},
        },
        "at most 4 blocks",
    ),
]


@pytest.mark.parametrize(("fields", "named"), REFUSED, ids=[n for _, n in REFUSED])
def test_what_is_not_served_is_a_400_in_anthropics_shape(
    client: TestClient, fields: dict[str, Any], named: str
) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": HELLO, **fields}
    r = client.post("/v1/messages", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400, r.text
    answer = r.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert named in answer["error"]["message"]


def test_the_client_raises_its_own_errors(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="tool use is not served"):
        claude.messages.create(
            model=MODEL, max_tokens=1, messages=HELLO,  # type: ignore[arg-type]
            tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
        )  # fmt: skip
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        claude.messages.create(model="claude-opus-9", max_tokens=1, messages=HELLO)  # type: ignore[arg-type]


# ---- the API key: x-api-key as Anthropic's clients send it -----------------------------------------


def test_x_api_key_is_honoured_like_the_bearer_token(engine: Engine) -> None:
    gated = TestClient(ApiKeyGate(build_app(engine), "sk-right"), raise_server_exceptions=False)
    right = anthropic.Anthropic(
        base_url="http://testserver", api_key="sk-right", http_client=gated, max_retries=0
    )
    assert right.messages.create(model=MODEL, max_tokens=1, messages=HELLO).stop_reason == "max_tokens"  # type: ignore[arg-type]
    wrong = anthropic.Anthropic(
        base_url="http://testserver", api_key="sk-wrong", http_client=gated, max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError, match="API key"):
        wrong.messages.create(model=MODEL, max_tokens=1, messages=HELLO)  # type: ignore[arg-type]
    assert gated.get("/v1/models", headers={"x-api-key": "sk-right"}).status_code == 200
    assert gated.get("/v1/models", headers={"authorization": "Bearer sk-right"}).status_code == 200
    both_wrong = {"authorization": "Bearer sk-right", "x-api-key": "sk-wrong"}
    assert gated.get("/v1/models", headers=both_wrong).status_code == 401
    assert gated.get("/v1/models").json()["error"]["type"] == "unauthorized"  # the OpenAI routes' shape
