"""OpenAI's request parameters (issue 28, item 11) on a real engine, in process.

What OpenAI's clients and frameworks send by default is taken: applied where sage implements it
(the frequency and presence penalties, against a direct computation; the seed; the user as the
tenant), taken where sage serves the value asked (``n: 1``, ``logprobs: false``,
``response_format: {"type": "text"}``, an empty ``logit_bias``); any other value is a 400 whose
JSON body names the parameter. A stream carries its usage once, in a last chunk, and only when
``stream_options.include_usage`` asks.

The official client, LiteLLM and LangChain against an engine process are in
tests/test_openai_client.py and tests/test_openai_frameworks.py.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import app_client, running_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from engine_adapter.model.decoder import Decoder, ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.penalties import apply_penalties
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine

CHAT = [{"role": "user", "content": "Say something."}]


def _config(root: Path) -> EngineConfig:
    return EngineConfig(
        num_blocks=64, block_size=16, device="cpu", socket=str(root / "t.sock"), log_dir=str(root / "logs")
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(_config, "sage-oai-") as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


def _path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _body(endpoint: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"messages": CHAT} if endpoint == "chat" else {"prompt": "Say something."}
    return {**base, "max_tokens": 4, **fields}


# ---- what clients send by default is taken --------------------------------------------------------

# Each as OpenAI's clients, LiteLLM and LangChain put them in a body (None is "not set").
TAKEN: list[dict[str, Any]] = [
    {"frequency_penalty": 0.0, "presence_penalty": 0.0},
    {"frequency_penalty": 1.5, "presence_penalty": -0.5},
    {"frequency_penalty": None, "presence_penalty": None},
    {"seed": 7},
    {"user": "alice"},
    {"n": 1},
    {"n": None},
    {"logprobs": None},
    {"logit_bias": {}},
    {"logit_bias": None},
    {"stream": False},
    {"stream": True, "stream_options": {"include_usage": True}},
    {"stream": True, "stream_options": {"include_usage": False, "include_obfuscation": False}},
    {"temperature": 0.7, "top_p": 0.9, "seed": 3},
]
CHAT_ONLY: list[dict[str, Any]] = [
    {"logprobs": False},
    {"top_logprobs": None},
    {"top_logprobs": 0},
    {"response_format": {"type": "text"}},
    {"response_format": None},
    {"max_completion_tokens": 3},
]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("fields", TAKEN, ids=lambda f: json.dumps(f, sort_keys=True))
def test_what_clients_send_by_default_is_taken(
    client: TestClient, endpoint: str, fields: dict[str, Any]
) -> None:
    r = client.post(_path(endpoint), json=_body(endpoint, **fields))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("fields", CHAT_ONLY, ids=lambda f: json.dumps(f, sort_keys=True))
def test_what_chat_clients_send_by_default_is_taken(client: TestClient, fields: dict[str, Any]) -> None:
    r = client.post("/v1/chat/completions", json=_body("chat", **fields))
    assert r.status_code == 200, r.text


# ---- what sage does not serve is a 400 naming the parameter ----------------------------------------

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("both", {"n": 2}, "'n'"),
    ("both", {"n": 0}, "'n'"),
    ("both", {"frequency_penalty": 2.5}, "frequency_penalty"),
    ("both", {"presence_penalty": -3}, "presence_penalty"),
    ("both", {"frequency_penalty": "high"}, "frequency_penalty"),
    ("both", {"presence_penalty": True}, "presence_penalty"),
    ("both", {"logit_bias": {"65": 10}}, "logit_bias"),
    ("both", {"logit_bias": [1]}, "logit_bias"),
    ("both", {"seed": 1.5}, "seed"),
    ("both", {"user": 5}, "user"),
    ("both", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("both", {"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ("both", {"stream": True, "stream_options": {"include_obfuscation": 1}}, "include_obfuscation"),
    ("both", {"stream": True, "stream_options": {"chunk_size": 3}}, "stream_options"),
    ("completions", {"logprobs": 2}, "logprobs"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"top_logprobs": 3}, "top_logprobs"),
    ("chat", {"top_logprobs": False}, "top_logprobs"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ("chat", {"response_format": "text"}, "response_format"),
    ("chat", {"response_format": {"type": "text", "strict": True}}, "response_format"),
    # found by the OpenAPI fuzz: the newer name went unchecked beside max_tokens
    ("chat", {"max_tokens": 2, "max_completion_tokens": 0}, "max_completion_tokens"),
]


@pytest.mark.parametrize(
    ("endpoint", "fields", "named"),
    [(e, f, n) for where, f, n in REFUSED for e in (["completions", "chat"] if where == "both" else [where])],
    ids=lambda v: json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v),
)
def test_an_unserved_value_is_a_400_naming_the_parameter(
    client: TestClient, endpoint: str, fields: dict[str, Any], named: str
) -> None:
    r = client.post(_path(endpoint), json=_body(endpoint, **fields))
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["type"] == "invalid_value" and named in error["message"], error


@pytest.mark.parametrize("field", ["response_format", "top_logprobs", "max_completion_tokens"])
def test_chat_only_fields_are_unknown_to_completions(client: TestClient, field: str) -> None:
    r = client.post("/v1/completions", json=_body("completions", **{field: None}))
    assert r.status_code == 400 and r.json()["error"]["type"] == "unknown_field", r.text


# ---- streamed usage: once, at the end, only when asked ---------------------------------------------


def _events(r: Any) -> list[dict[str, Any]]:
    lines = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_stream_has_no_usage_unless_asked(client: TestClient, endpoint: str) -> None:
    r = client.post(_path(endpoint), json=_body(endpoint, stream=True, max_tokens=6))
    chunks = _events(r)
    assert chunks and all("usage" not in c for c in chunks), chunks
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_stream_asked_for_usage_gives_it_once_in_a_last_chunk(client: TestClient, endpoint: str) -> None:
    whole = client.post(_path(endpoint), json=_body(endpoint, max_tokens=6)).json()
    body = _body(endpoint, stream=True, max_tokens=6, stream_options={"include_usage": True})
    chunks = _events(client.post(_path(endpoint), json=body))
    with_usage = [c for c in chunks if c.get("usage") is not None]
    assert with_usage == [chunks[-1]], chunks  # once, last
    assert chunks[-1]["choices"] == []
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])  # OpenAI: null before the last
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 6
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


# ---- applied: the seed, the user, the penalties ------------------------------------------------------


def test_the_seed_is_applied(client: TestClient) -> None:
    def text(seed: int) -> str:
        body = _body("completions", max_tokens=12, temperature=1.0, seed=seed)
        answer: str = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        return answer

    assert text(11) == text(11)
    assert len({text(s) for s in range(4)}) > 1


def test_the_user_is_the_tenant(client: TestClient, engine: Engine) -> None:
    body = _body("completions", user="tenant-of-the-user", max_tokens=2)
    assert client.post("/v1/completions", json=body).status_code == 200
    assert "tenant-of-the-user" in engine.cache.tenant_hit_rates()


def _penalised(logits: list[float], output_ids: list[int], frequency: float, presence: float) -> list[float]:
    """OpenAI's definition, token by token, in plain Python: the oracle."""
    counts = Counter(output_ids)
    return [
        x - counts[j] * frequency - (1.0 if counts[j] > 0 else 0.0) * presence for j, x in enumerate(logits)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(-20, 20, width=32), min_size=7, max_size=7),
            st.lists(st.integers(0, 6), max_size=12),
            st.sampled_from([0.0, 0.5, -1.25, 2.0, -2.0]),
            st.sampled_from([0.0, 1.0, -0.75, 2.0]),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_penalties_equal_openais_definition(rows: list[tuple[list[float], list[int], float, float]]) -> None:
    logits = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    params = [SamplingParams(frequency_penalty=f, presence_penalty=p) for _, _, f, p in rows]
    out = apply_penalties(logits, params, [r[1] for r in rows])
    expected = torch.tensor([_penalised(*r) for r in rows], dtype=torch.float32)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)
    if not any(p.penalized and r[1] for p, r in zip(params, rows, strict=True)):
        assert out is logits  # nothing to penalise: no copy


def _reference_greedy(
    decoder: Decoder, prompt: list[int], steps: int, frequency: float, presence: float
) -> list[int]:
    """Greedy decoding straight on the decoder, each step's logits penalised by the oracle."""
    pool: PagedKVPool = decoder.make_pool(num_blocks=16, block_size=16)
    table = pool.allocator.allocate(16)
    logits = decoder(ForwardBatch([prompt], [0], [table]), pool).logits[0]
    out: list[int] = []
    for _ in range(steps):
        row = _penalised(logits.tolist(), out, frequency, presence)
        token = max(range(len(row)), key=row.__getitem__)
        out.append(token)
        logits = decoder(ForwardBatch([[token]], [len(prompt) + len(out) - 1], [table]), pool).logits[0]
    return out


@pytest.mark.slow  # 20 greedy steps, twice per case, and the oracle's own
@pytest.mark.parametrize(("frequency", "presence"), [(1.5, 0.0), (0.0, 2.0), (0.8, 0.6), (-0.5, 0.0)])
def test_the_engine_decodes_as_the_penalised_oracle(
    engine: Engine, frequency: float, presence: float
) -> None:
    """Greedy with penalties through the scheduler (batched, paged) equals a direct loop that
    penalises each step's logits by OpenAI's definition, and differs from greedy without."""
    prompts = ["aaaa aaaa aaaa", "The cat and the cat and the"]
    sampling = SamplingParams(
        max_tokens=20, ignore_eos=True, frequency_penalty=frequency, presence_penalty=presence
    )
    handles = [engine.submit(p, sampling) for p in prompts]  # in one batch
    outputs = [h.result(timeout=60).token_ids for h in handles]
    plain = [
        engine.submit(p, SamplingParams(max_tokens=20, ignore_eos=True)).result(timeout=60).token_ids
        for p in prompts
    ]
    for prompt, got in zip(prompts, outputs, strict=True):
        ids = engine.tokenizer.encode(prompt)
        assert got == _reference_greedy(engine.decoder, ids, 20, frequency, presence)
    assert outputs != plain  # the penalties changed what was decoded
