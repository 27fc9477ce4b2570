"""LiteLLM's and LangChain's OpenAI adapters, and LiteLLM's Anthropic route, against a real engine process.

(Issue 28, item 11; the Anthropic route: issue 51, item 2.)

The engine (sage-tiny, whose minimal chat template makes its answers well-formed if meaningless)
listens on the loopback behind an API key, as a framework would reach a server; each adapter
is driven as its documentation shows, with the parameters users set most (penalties, seed,
user, n=1, plain-text response format) and streaming with usage. Every request must be taken,
and a streamed answer's usage must come once, at its end.

The adapters are dev dependencies: when one is missing these tests fail (they never skip), so
that CI cannot go green without running them.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow  # an engine process

REPO = Path(__file__).resolve().parent.parent
API_KEY = "sk-sage-frameworks-test"
MODEL = "sage-tiny"


def _adapter(module: str) -> ModuleType:
    """The adapter's module; a missing dev dependency fails the test (never a skip)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{module} is missing ({exc}); install the dev extra: pip install -e '.[dev]'")


@dataclass
class TcpEngine:
    folder: Path
    socket: Path
    env: dict[str, str]
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def sage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sage_cli.app", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def engine() -> Iterator[TcpEngine]:
    folder = Path(tempfile.mkdtemp(prefix="sg-fw-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    # LiteLLM fetches a price list over the network on import unless told to use its own copy.
    env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO), SAGE_API_KEY=API_KEY)
    started = TcpEngine(folder, folder / "e.sock", env, _free_port())
    args = ["llm", "engine", "start", MODEL, "--num-blocks", "128", "--device", "cpu", "--detach"]
    args += ["--socket", str(started.socket), "--host", "127.0.0.1", "--port", str(started.port)]
    result = started.sage(*args)
    assert result.returncode == 0, result.stderr
    yield started
    started.sage("llm", "engine", "stop", "--socket", str(started.socket))
    shutil.rmtree(folder, ignore_errors=True)


# ---- LiteLLM ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return _adapter("litellm")


def test_litellm_completion_takes_the_common_parameters(litellm: ModuleType, engine: TcpEngine) -> None:
    reply = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=engine.base_url,
        api_key=API_KEY,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        seed=7,
        user="litellm-user",
        n=1,
        response_format={"type": "text"},
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_litellm_streams_with_usage_once_at_the_end(litellm: ModuleType, engine: TcpEngine) -> None:
    stream = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=engine.base_url,
        api_key=API_KEY,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    usages = [u for c in chunks if (u := getattr(c, "usage", None)) is not None]
    assert usages and usages[-1].completion_tokens == 6
    assert all(u.completion_tokens == 6 for u in usages)  # one usage, however the adapter relays it


def test_litellm_gets_a_400_naming_an_unserved_value(litellm: ModuleType, engine: TcpEngine) -> None:
    with pytest.raises(litellm.BadRequestError, match="'n'"):
        litellm.completion(
            model=f"openai/{MODEL}",
            api_base=engine.base_url,
            api_key=API_KEY,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=2,
            n=2,
        )


# ---- LiteLLM's Anthropic route: /v1/messages with x-api-key -----------------------------------------


def _anthropic_route(engine: TcpEngine) -> dict[str, object]:
    # LiteLLM appends /v1/messages to the base and sends the key as x-api-key
    return {"model": f"anthropic/{MODEL}", "api_base": f"http://127.0.0.1:{engine.port}", "api_key": API_KEY}


def test_litellm_anthropic_route_answers_with_usage_that_adds_up(
    litellm: ModuleType, engine: TcpEngine
) -> None:
    system = "You are a terse assistant. " * 3
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say something."}]
    # greedy: Anthropic's API has no seed, and a sampled end of turn inside 5 tokens would be "stop"
    reply = litellm.completion(**_anthropic_route(engine), messages=messages, max_tokens=5, temperature=0.0)
    assert reply.choices[0].finish_reason == "length"  # Anthropic's max_tokens, mapped back by LiteLLM
    assert reply.usage.completion_tokens == 5
    again = litellm.completion(**_anthropic_route(engine), messages=messages, max_tokens=5)
    # LiteLLM's prompt_tokens are Anthropic's input + cache read + cache creation: sage's prompt
    assert again.usage.prompt_tokens == reply.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the shared system prompt, read back


def test_litellm_anthropic_route_streams(litellm: ModuleType, engine: TcpEngine) -> None:
    stream = litellm.completion(
        **_anthropic_route(engine),
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    usages = [u for c in chunks if (u := getattr(c, "usage", None)) is not None]
    assert usages and usages[-1].completion_tokens == 6


def test_litellm_anthropic_route_gets_a_400_for_tools(litellm: ModuleType, engine: TcpEngine) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    with pytest.raises(litellm.BadRequestError, match="tool use is not served"):
        litellm.completion(
            **_anthropic_route(engine),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            tools=[tool],
        )


# ---- LangChain --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def langchain_openai() -> ModuleType:
    return _adapter("langchain_openai")


def _chat(langchain_openai: ModuleType, engine: TcpEngine, **kwargs: object) -> object:
    return langchain_openai.ChatOpenAI(
        model=MODEL, base_url=engine.base_url, api_key=API_KEY, max_retries=0, **kwargs
    )


def test_langchain_chat_takes_the_common_parameters(langchain_openai: ModuleType, engine: TcpEngine) -> None:
    chat = _chat(
        langchain_openai,
        engine,
        max_tokens=5,
        temperature=0.7,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        seed=7,
        n=1,
        # (a response_format makes LangChain parse the answer as structured output: not here)
        model_kwargs={"user": "langchain-user"},
    )
    message = chat.invoke("Say something.")  # type: ignore[attr-defined]
    assert message.response_metadata["finish_reason"] == "length"
    assert message.usage_metadata["output_tokens"] == 5


def test_langchain_streams_with_usage_once_at_the_end(
    langchain_openai: ModuleType, engine: TcpEngine
) -> None:
    chat = _chat(langchain_openai, engine, max_tokens=6, stream_usage=True)
    chunks = list(chat.stream("Say something."))  # type: ignore[attr-defined]
    with_usage = [i for i, c in enumerate(chunks) if c.usage_metadata]
    assert len(with_usage) == 1, [c.usage_metadata for c in chunks]
    assert chunks[with_usage[0]].usage_metadata["output_tokens"] == 6
    assert with_usage[0] >= len(chunks) - 2  # the last chunk, or the one before LangChain's closing one
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.usage_metadata["output_tokens"] == 6  # summed over the stream: counted once


def test_langchain_completions_take_the_common_parameters(
    langchain_openai: ModuleType, engine: TcpEngine
) -> None:
    llm = langchain_openai.OpenAI(
        model=MODEL,
        base_url=engine.base_url,
        api_key=API_KEY,
        max_retries=0,
        max_tokens=4,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        seed=3,
    )
    text = llm.invoke("Say something.")
    assert isinstance(text, str)
