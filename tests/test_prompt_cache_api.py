"""OpenAI's prompt-cache fields (issue 51, item 1) on a real engine, in process, with the official client.

``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options`` and the
``prompt_cache_breakpoint`` of a content part are taken on both OpenAI routes and reach the
engine as the request's `CacheContract` (the engine's own ``submit`` is wrapped to record what it
was handed, and still serves the request); a breakpoint's offset is where the marked text ends in
the templated prompt, checked on sage-tiny's template for any conversation (hypothesis) and on
SmolLM2's real template and tokenizer; an unknown value is a 400 naming the field; the usage
reports read and written tokens that add up to the prompt, whole or streamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_fixtures import SubmitRecorder, app_client, serving
from hypothesis import given, settings
from hypothesis import strategies as st
from lazy_extras import lazy
from model_fixtures import (  # noqa: F401 (fixtures: tests ask for them by name)
    needs_smollm2,
    one_thread_fixture,
    smollm2_fixture,
)
from starlette.testclient import TestClient

from engine_adapter.cache.contract import CacheContract
from engine_adapter.model.chat_template import ChatMessage, render_chat
from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.serving.completion_requests import usage
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.handles import RequestHandle
from engine_adapter.serving.prompt_cache import cache_contract, openai_cache_ask, parse_duration
from engine_adapter.serving.sequence import RequestOutput

openai = lazy("openai")  # the official client, imported by the first test that uses it

CHAT = [{"role": "user", "content": "Say something."}]


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
def oai(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=client, max_retries=0)


# ---- the fields reach the engine as the request's contract ------------------------------------------


def test_the_official_client_fields_reach_the_engine(oai: openai.OpenAI, recorded: SubmitRecorder) -> None:
    reply = oai.chat.completions.create(
        model="sage-tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=2,
        prompt_cache_key="agent-7",
        prompt_cache_retention="24h",
    )
    assert reply.choices[0].finish_reason == "length"
    assert recorded.contracts == [CacheContract(session_key="agent-7", ttl_s=86_400.0, write_tokens=None)]


def test_in_memory_retention_asks_no_lifetime_and_no_field_asks_nothing(
    oai: openai.OpenAI, recorded: SubmitRecorder
) -> None:
    oai.chat.completions.create(
        model="sage-tiny",
        messages=CHAT,
        max_tokens=1,
        prompt_cache_retention="in_memory",  # type: ignore[arg-type]
    )
    oai.chat.completions.create(model="sage-tiny", messages=CHAT, max_tokens=1)  # type: ignore[arg-type]
    assert recorded.contracts == [None, None]


def test_completions_take_the_fields_and_explicit_mode_writes_nothing_without_a_breakpoint(
    oai: openai.OpenAI, recorded: SubmitRecorder
) -> None:
    oai.completions.create(
        model="sage-tiny",
        prompt="Once upon a time",
        max_tokens=1,
        extra_body={"prompt_cache_key": "k", "prompt_cache_options": {"mode": "explicit", "ttl": "1h"}},
    )
    oai.completions.create(
        model="sage-tiny", prompt="Once upon", max_tokens=1, extra_body={"prompt_cache_options": {}}
    )
    assert recorded.contracts == [
        CacheContract(session_key="k", ttl_s=3_600.0, write_tokens=0),
        CacheContract(ttl_s=1_800.0),  # OpenAI's default ttl, 30m, in implicit mode: the whole prompt
    ]


def test_the_longer_of_retention_and_options_ttl_is_asked(
    oai: openai.OpenAI, recorded: SubmitRecorder
) -> None:
    oai.chat.completions.create(
        model="sage-tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=1,
        prompt_cache_retention="24h",
        prompt_cache_options={"ttl": "30m"},
    )
    oai.chat.completions.create(
        model="sage-tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"prompt_cache_retention": "in_memory", "prompt_cache_options": {"ttl": "2h"}},
    )
    assert [c.ttl_s if c else None for c in recorded.contracts] == [86_400.0, 7_200.0]


def test_an_explicit_breakpoint_writes_up_to_the_end_of_its_part(
    oai: openai.OpenAI, recorded: SubmitRecorder, engine: Engine
) -> None:
    system = "You are a careful assistant. " * 4
    messages = [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": system, "prompt_cache_breakpoint": {"mode": "explicit"}},
                {"type": "text", "text": "Unmarked tail."},
            ],
        },
        {"role": "user", "content": "Hello"},
    ]
    oai.chat.completions.create(
        model="sage-tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=1,
        prompt_cache_options={"mode": "explicit"},
    )
    (contract,) = recorded.contracts
    assert contract is not None and contract.write_tokens is not None
    written = engine.tokenizer.decode(recorded.prompts[0][: contract.write_tokens])
    # sage-tiny's template renders "<|system|>" + content: the write ends where the marked text does
    assert written == "<|system|>" + system


# ---- a breakpoint's offset, for any conversation --------------------------------------------------

_TEXT = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=0, max_size=12)
_MESSAGE = st.tuples(
    st.sampled_from(["system", "user", "assistant"]), st.lists(_TEXT, min_size=1, max_size=3)
)


@settings(max_examples=40, deadline=None)
@given(turns=st.lists(_MESSAGE, min_size=1, max_size=4), data=st.data())
def test_a_breakpoint_writes_exactly_the_marked_prefix_on_sage_tiny(
    engine: Engine, turns: list[tuple[str, list[str]]], data: st.DataObject
) -> None:
    """The written tokens decode to the templated conversation up to the end of the marked part,
    and past it only to the turn's end ("\\n") when the part ends its message."""
    at = data.draw(st.integers(0, len(turns) - 1))
    part = data.draw(st.integers(0, len(turns[at][1]) - 1))
    raw = [{"role": role, "content": [{"type": "text", "text": t} for t in parts]} for role, parts in turns]
    raw[at]["content"][part]["prompt_cache_breakpoint"] = {"mode": "explicit"}
    ask = openai_cache_ask({"messages": raw, "prompt_cache_options": {"mode": "explicit"}})
    messages = [ChatMessage(role, "".join(parts)) for role, parts in turns]
    prompt = engine.chat_prompt(messages)
    contract = cache_contract(ask, prompt, lambda p: engine.chat_prompt(p, add_generation_prompt=False))
    assert contract is not None and contract.write_tokens is not None
    before = "".join(f"<|{role}|>{''.join(parts)}\n" for role, parts in turns[:at])
    marked = before + f"<|{turns[at][0]}|>" + "".join(turns[at][1][: part + 1])
    written = engine.tokenizer.decode(prompt[: contract.write_tokens])
    assert written.startswith(marked)
    rest = "".join(turns[at][1][part + 1 :]) + "\n"
    # past the marked text, only the turn's end that the prefix's rendering has too: its "\n"
    # when the prompt goes on with one (the part ends its message, or the next part starts so)
    assert written[len(marked) :] == ("\n" if rest.startswith("\n") else "")


@pytest.mark.slow  # loads SmolLM2
@needs_smollm2
def test_a_breakpoint_on_smollm2s_template_and_tokenizer(smollm2: tuple[Any, Tokenizer, Any]) -> None:
    """On a real BPE tokenizer and ChatML template: a marked system prompt writes exactly its
    turn; a part marked inside a message writes no token past the marked text."""
    tokenizer = smollm2[1]
    template = tokenizer.chat_template
    assert template is not None

    def render(messages: list[ChatMessage], generation: bool = True) -> list[int]:
        text = render_chat(template, messages, add_generation_prompt=generation)
        return list(tokenizer.encode(text, add_special_tokens=False))

    system = "You are a terse assistant who answers in one word."
    parts = ["Here is a file:\n", "def f(x):\n    return x + 1\n", " What does it do?"]
    raw = [
        {
            "role": "system",
            "content": [{"type": "text", "text": system, "prompt_cache_breakpoint": {"mode": "explicit"}}],
        },
        {"role": "user", "content": [{"type": "text", "text": t} for t in parts]},
    ]
    messages = [ChatMessage("system", system), ChatMessage("user", "".join(parts))]
    prompt = render(messages)
    ask = openai_cache_ask({"messages": raw, "prompt_cache_options": {"mode": "explicit"}})
    contract = cache_contract(ask, prompt, lambda p: render(p, generation=False))
    assert contract is not None
    assert contract.write_tokens == len(render([ChatMessage("system", system)], generation=False))

    del raw[0]["content"][0]["prompt_cache_breakpoint"]
    raw[1]["content"][1]["prompt_cache_breakpoint"] = {"mode": "explicit"}
    ask = openai_cache_ask({"messages": raw, "prompt_cache_options": {"mode": "explicit"}})
    contract = cache_contract(ask, prompt, lambda p: render(p, generation=False))
    assert contract is not None and contract.write_tokens is not None
    marked = render_chat(template, messages[:1], add_generation_prompt=False) + "<|im_start|>user\n"
    marked_ids = tokenizer.encode(marked + parts[0] + parts[1], add_special_tokens=False)
    written = contract.write_tokens
    # the marked text's tokens, up to the last one (which the unmarked text may merge with)
    assert prompt[:written] == marked_ids[:written] and written >= len(marked_ids) - 1


# ---- unknown values are a 400 naming the field ------------------------------------------------------

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"prompt_cache_retention": "1d"}, "'prompt_cache_retention'"),
    ({"prompt_cache_retention": 24}, "'prompt_cache_retention'"),
    ({"prompt_cache_key": ""}, "'prompt_cache_key'"),
    ({"prompt_cache_key": 7}, "'prompt_cache_key'"),
    ({"prompt_cache_options": "explicit"}, "'prompt_cache_options'"),
    ({"prompt_cache_options": {"mode": "sometimes"}}, "'prompt_cache_options.mode'"),
    ({"prompt_cache_options": {"ttl": "forever"}}, "'prompt_cache_options.ttl'"),
    ({"prompt_cache_options": {"ttl": "0m"}}, "'prompt_cache_options.ttl'"),
    ({"prompt_cache_options": {"ttl": "9" * 400 + "h"}}, "'prompt_cache_options.ttl'"),
    ({"prompt_cache_options": {"ttl": 30}}, "'prompt_cache_options.ttl'"),
    ({"prompt_cache_options": {"mode": "explicit", "pin": True}}, "'prompt_cache_options'"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("fields", "named"), REFUSED, ids=[n for _, n in REFUSED])
def test_unknown_values_are_a_400_naming_the_field(
    client: TestClient, path: str, fields: dict[str, Any], named: str
) -> None:
    base: dict[str, Any] = {"messages": CHAT} if "chat" in path else {"prompt": "Hi"}
    r = client.post(path, json={**base, "max_tokens": 1, **fields})
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


def test_a_breakpoint_of_another_mode_is_a_400_naming_the_part(oai: openai.OpenAI) -> None:
    part = {"type": "text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "implicit"}}
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\]\.prompt_cache_breakpoint"):
        oai.chat.completions.create(
            model="sage-tiny",
            messages=[{"role": "user", "content": [part]}],
            max_tokens=1,  # type: ignore[list-item]
        )


@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.sampled_from(["ms", "s", "m", "h", "d"])), min_size=1, max_size=3
    )
)
def test_durations_add_their_units(pieces: list[tuple[int, str]]) -> None:
    seconds = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    text = "".join(f"{n}{unit}" for n, unit in pieces)
    assert parse_duration("ttl", text) == pytest.approx(sum(n * seconds[u] for n, u in pieces))


# ---- usage: read, written and uncached add up to the prompt -----------------------------------------


def test_usage_reports_read_and_written_tokens(oai: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "A shared system prompt. " * 3}, *CHAT]
    first = oai.chat.completions.create(
        model="sage-tiny", messages=messages, max_tokens=1, prompt_cache_key="u"
    )  # type: ignore[arg-type]
    again = oai.chat.completions.create(
        model="sage-tiny", messages=messages, max_tokens=1, prompt_cache_key="u"
    )  # type: ignore[arg-type]
    for reply in (first, again):
        details = reply.usage.prompt_tokens_details  # type: ignore[union-attr]
        assert details is not None and details.cache_write_tokens is not None
        assert details.cached_tokens is not None
        assert details.cached_tokens + details.cache_write_tokens <= reply.usage.prompt_tokens  # type: ignore[union-attr]
        assert details.model_extra is not None and "cache_ttl_s" in details.model_extra
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]


def test_a_streamed_usage_carries_the_cache_counts(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="sage-tiny",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
        prompt_cache_key="s",
    )
    (final,) = [c.usage for c in stream if c.usage is not None]
    assert final.prompt_tokens_details is not None
    assert final.prompt_tokens_details.cache_write_tokens is not None


_COUNTS = st.integers(1, 4000).flatmap(
    lambda prompt: st.tuples(
        st.just(prompt),
        st.integers(0, prompt),
        st.integers(0, prompt),
        st.one_of(st.none(), st.sampled_from([60.0, 300.0, 3600.0, 86400.0])),
    ).filter(lambda t: t[1] + t[2] <= t[0])
)


@given(_COUNTS)
def test_the_final_output_keeps_the_cache_counts_and_they_add_up(
    counts: tuple[int, int, int, float | None],
) -> None:
    """The handle's final output carries the written tokens and the lifetime granted (the last
    delta's), and the usage built from them adds up: written + read + uncached = prompt."""
    prompt, read, written, ttl = counts
    handle = RequestHandle("r", lambda _: None)
    common = {"prompt_tokens": prompt, "cached_tokens": read}
    handle._put(RequestOutput("r", "a", [1], False, **common))
    last = RequestOutput("r", "b", [2], True, "stop", written_tokens=written, retention_ttl_s=ttl, **common)
    handle._put(last)
    final = handle.result(timeout=1)
    assert (final.text, final.token_ids) == ("ab", [1, 2])
    assert (final.written_tokens, final.retention_ttl_s) == (written, ttl)
    details = usage(final)["prompt_tokens_details"]
    assert (details["cached_tokens"], details["cache_write_tokens"], details["cache_ttl_s"]) == (
        read,
        written,
        ttl,
    )
