"""Embeddings in the engine (issue 19): pooling, chunking beside LLM steps, the pool reservation,
``POST /v1/embeddings`` and the SLO extension fields, on sage-tiny in process.

The real model's client-level tests (the `openai` client, paraphrases) are in
test_openai_client.py; the reservation's cache invariants are in test_cache_state_machine.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import app_client, running_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from engine_adapter.model.decoder import ForwardBatch
from engine_adapter.model.loader import load_model
from engine_adapter.model.pooling import MeanPool, decode_base64, encode_base64
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.errors import RequestError

BLOCK_SIZE = 8
LONG = "Embedding batches share the pool with the KV cache of the language model. " * 3


def _config(root: Path, **overrides: Any) -> EngineConfig:
    values: dict[str, Any] = {
        "num_blocks": 48,
        "block_size": BLOCK_SIZE,
        "device": "cpu",
        "socket": str(root / "t.sock"),
        "log_dir": str(root / "logs"),
        "embedding_chunk_tokens": 16,
    }
    values.update(overrides)
    return EngineConfig(**values)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(_config, "sage-emb-") as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


def _cos(a: list[float], b: list[float]) -> float:
    return float(torch.tensor(a) @ torch.tensor(b))


# ---- pooling ------------------------------------------------------------------------------------


def _oracle(decoder: Any, ids: list[int]) -> torch.Tensor:
    """Mean of the final-normed hidden states of one whole forward, captured by a hook on the
    last layer (an independent path: no `pool_hidden`, no chunks), L2-normalised."""
    captured: list[torch.Tensor] = []
    hook = decoder.layers[-1].register_forward_hook(lambda _m, _i, out: captured.append(out))
    pool = decoder.make_pool(num_blocks=16, block_size=BLOCK_SIZE)
    table = pool.allocator.allocate(-(-len(ids) // BLOCK_SIZE))
    try:
        decoder(ForwardBatch([ids], [0], [table]), pool)
    finally:
        hook.remove()
    with torch.inference_mode():
        mean = decoder.norm(captured[0]).float().mean(0)
    return mean / mean.norm()


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    decoder, tokenizer, _ = load_model("sage-tiny", device="cpu")
    return decoder, tokenizer


def test_chunked_mean_pooling_equals_the_whole_forward_oracle(tiny: tuple[Any, Any]) -> None:
    decoder, tokenizer = tiny
    ids = tokenizer.encode(LONG)[:40]
    expected = _oracle(decoder, ids)
    for chunk in (7, 16, 40):
        pool = decoder.make_pool(num_blocks=16, block_size=BLOCK_SIZE)
        table = pool.allocator.allocate(-(-len(ids) // BLOCK_SIZE))
        mean = MeanPool()
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            out = decoder(ForwardBatch([part], [start], [table], pool_hidden=[True]), pool)
            assert out.hidden_sums is not None
            mean.add(out.hidden_sums[0], len(part))
        vector = torch.tensor(mean.vector())
        assert math.isclose(float(vector.norm()), 1.0, abs_tol=1e-5)
        assert torch.allclose(vector, expected, atol=1e-4), chunk


def test_pooled_rows_leave_the_other_rows_logits_alone(tiny: tuple[Any, Any]) -> None:
    decoder, tokenizer = tiny
    a, b = tokenizer.encode("first sequence"), tokenizer.encode("second one, pooled")
    pool = decoder.make_pool(num_blocks=16, block_size=BLOCK_SIZE)
    ta, tb = pool.allocator.allocate(2), pool.allocator.allocate(3)
    plain = decoder(ForwardBatch([a, b], [0, 0], [ta, tb]), pool)
    pooled = decoder(ForwardBatch([a, b], [0, 0], [ta, tb], pool_hidden=[False, True]), pool)
    assert torch.equal(plain.logits, pooled.logits)
    assert pooled.hidden_sums is not None and not pooled.hidden_sums[0].any()


@settings(max_examples=50)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=64))
def test_base64_round_trips_float32(values: list[float]) -> None:
    assert decode_base64(encode_base64(values)) == values


# ---- the engine ---------------------------------------------------------------------------------


def test_a_list_keeps_its_order_and_each_vector_equals_its_own_request(engine: Engine) -> None:
    texts = ["alpha beta gamma", LONG, "a third, shorter text"]
    together = engine.submit_embedding(list(texts)).result(timeout=60)
    assert together.error is None and len(together.vectors) == 3
    for text, vector in zip(texts, together.vectors, strict=True):
        alone = engine.submit_embedding([text]).result(timeout=60).vectors[0]
        assert _cos(alone, vector) == pytest.approx(1.0, abs=1e-5)
    assert _cos(together.vectors[0], together.vectors[2]) < 0.9999
    assert together.prompt_tokens == sum(len(engine.tokenizer.encode(t)) for t in texts)


def test_embedding_traffic_leaves_greedy_completions_unchanged(engine: Engine) -> None:
    prompts = ["Once upon a time", "The cache evicts", "Blocks of sixteen tokens"]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = [engine.submit(p, greedy).result(timeout=60).token_ids for p in prompts]
    engine.reset_prefix_cache()
    embeddings = [engine.submit_embedding([LONG, f"text {i}"]) for i in range(4)]
    mixed = [engine.submit(p, greedy) for p in prompts]
    assert [h.result(timeout=60).token_ids for h in mixed] == alone
    assert all(h.result(timeout=60).error is None for h in embeddings)
    with engine.cache.lock:
        engine.cache.check_invariants()
        assert engine.cache.num_reserved_blocks == 0


def test_a_reservation_is_taken_per_chunked_text_and_released_after_it(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, num_blocks=24, embedding_chunk_tokens=8))  # not started: we step it
    ids = eng.tokenizer.encode(LONG[:120])
    handle = eng.submit_embedding([ids])
    eng._drain_inbox()
    steps, reserved = 0, []
    while eng.scheduler.has_work():
        eng.scheduler.step()
        steps += 1
        reserved.append(eng.eviction_stats().reserved_blocks)
        eng.cache.check_invariants()
    assert steps == -(-len(ids) // 8)  # one chunk of 8 tokens per step
    assert reserved[:-1] == [-(-len(ids) // BLOCK_SIZE)] * (steps - 1) and reserved[-1] == 0
    assert handle.result(timeout=1).error is None


def test_a_reservation_evicts_cached_blocks_when_the_pool_is_short(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, num_blocks=16))
    eng.start()
    try:
        for i in range(3):  # fill the prefix cache: 3 x 5 full blocks stay cached
            eng.submit(f"{i} " + LONG[:40], SamplingParams(max_tokens=2)).result(timeout=60)
        free = eng.eviction_stats().free_blocks
        ids = eng.tokenizer.encode(LONG[:100])
        assert -(-len(ids) // BLOCK_SIZE) > free
        assert eng.submit_embedding([ids]).result(timeout=60).error is None
        stats = eng.eviction_stats()
        assert stats.evictions_by_reason.get("reserve", 0) > 0
        with eng.cache.lock:
            eng.cache.check_invariants()
    finally:
        eng.shutdown(drain=False, timeout=10)


def test_inputs_that_cannot_be_served_are_request_errors(engine: Engine) -> None:
    with pytest.raises(RequestError, match="tokens; at most"):
        engine.submit_embedding([list(range(10)) * 100])  # 1000 tokens > 48 blocks of 8
    with pytest.raises(RequestError, match="vocabulary"):
        engine.submit_embedding([[10**9]])
    with pytest.raises(RequestError, match="empty"):
        engine.submit_embedding([])


# ---- POST /v1/embeddings ------------------------------------------------------------------------


def test_the_endpoint_answers_in_openai_format(client: TestClient, engine: Engine) -> None:
    r = client.post("/v1/embeddings", json={"input": ["one", "two"], "user": "u"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == engine.config.model
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    width = engine.model_config.hidden_size
    assert all(len(d["embedding"]) == width for d in body["data"])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    b64 = client.post("/v1/embeddings", json={"input": ["one", "two"], "encoding_format": "base64"}).json()
    for plain, packed in zip(body["data"], b64["data"], strict=True):
        assert decode_base64(packed["embedding"]) == pytest.approx(plain["embedding"], abs=1e-6)
    ids = client.post("/v1/embeddings", json={"input": engine.tokenizer.encode("one")}).json()
    assert ids["data"][0]["embedding"] == pytest.approx(body["data"][0]["embedding"], abs=1e-6)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": []}, "empty list"),
        ({"input": ""}, "empty string"),
        ({"input": ["ok", ""]}, "input 1 is an empty string"),
        ({"input": 42}, "must be a string"),
        ({"input": [{"text": "x"}]}, "input 0 must be"),
        ({}, "'input' is required"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "encoding_format": ""}, "encoding_format"),  # found by the OpenAPI fuzz
        ({"input": "x", "dimensions": 8}, "dimensions"),
        ({"input": "x", "slo_deadline_ms": -1}, "slo_deadline_ms"),
        ({"input": "x", "slo_deadline_ms": "soon"}, "slo_deadline_ms"),
        ({"input": "x", "bogus": 1}, "unknown field"),
        ({"input": [list(range(10)) * 100]}, "at most"),
    ],
)
def test_bad_input_is_a_400_with_json_and_harms_no_other_request(
    client: TestClient, body: dict[str, Any], needle: str
) -> None:
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": "still served"}).status_code == 200


def test_another_model_is_a_404(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "model_not_found"


# ---- SLO fields ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["slo_ttft_ms", "slo_tpot_ms"])
@pytest.mark.parametrize("value", [0, -5, "fast", 1e12, True])
def test_bad_slo_values_are_400s(client: TestClient, field: str, value: Any) -> None:
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, field: value})
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    assert client.post("/v1/chat/completions", json=chat).status_code in (400,)


def test_a_completion_with_an_slo_gives_its_blocks_that_deadline(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[float | None] = []
    on_admitted = engine.hooks.on_admitted

    def spy(seq: Any, hit: int) -> None:  # what the cache holds for it, the moment it is admitted
        seen.append(engine.cache.sequence(seq.seq_id).request.deadline)
        on_admitted(seq, hit)

    with monkeypatch.context() as patch:
        patch.setattr(engine.hooks, "on_admitted", spy)
        before = engine.cache.clock()
        engine.submit("hi", SamplingParams(max_tokens=3), slo_ttft_ms=500, slo_tpot_ms=100).result(timeout=60)
        engine.submit("hi there", SamplingParams(max_tokens=3)).result(timeout=60)
    assert seen[0] is not None and before + 0.7 - 0.01 <= seen[0] <= engine.cache.clock() + 0.7
    assert seen[1] is None  # no SLO given, colocation off: no deadline, as before SLOs existed


def test_tenant_slo_defaults_come_from_the_config(tmp_path: Path) -> None:
    config = _config(tmp_path, tenant_slos="gold:ttft_ms=100,tpot_ms=10;bronze:deadline_ms=9000")
    assert config.slos_for("gold") == {"ttft_ms": 100.0, "tpot_ms": 10.0, "deadline_ms": 2000.0}
    assert config.slos_for("bronze")["deadline_ms"] == 9000.0
    assert (
        config.slos_for(None)
        == config.slos_for("unknown")
        == {
            "ttft_ms": 2000.0,
            "tpot_ms": 200.0,
            "deadline_ms": 2000.0,
        }
    )
    assert EngineConfig.from_json(config.to_json()).tenant_slos == config.tenant_slos
    for bad in ("gold:ttft=1", "gold:ttft_ms=-1", "nocolon"):
        with pytest.raises(ConfigError, match="tenant_slos"):
            _config(tmp_path, tenant_slos=bad)


def test_embedding_chunks_beside_decodes_are_sized_to_the_tpot_headroom(tmp_path: Path) -> None:
    from engine_adapter.serving.embedding_scheduler import EMBEDDING_TPOT_HEADROOM, MIN_EMBEDDING_CHUNK

    eng = Engine(_config(tmp_path, embedding_chunk_tokens=64))
    scheduler = eng.scheduler.embeddings
    assert scheduler.budget(decoding=False) == 64  # nothing to protect
    assert scheduler.budget(decoding=True) == 0  # no decode-only baseline yet: probe
    scheduler.learn_step_cost(0.010, decoding=True, embedding_tokens=0)
    assert scheduler.budget(decoding=True) == MIN_EMBEDDING_CHUNK  # cost unknown yet
    scheduler.learn_step_cost(0.010 + 32 * 2e-4, decoding=True, embedding_tokens=32)
    assert scheduler.embedding_token_s == pytest.approx(2e-4)
    fit = EMBEDDING_TPOT_HEADROOM * 0.010 / 2e-4  # 20 tokens add 40 % to a 10 ms decode step
    assert abs(scheduler.budget(decoding=True) - fit) <= 1
    for _ in range(40):  # the baseline is measured again every 32 decode steps
        budgets = scheduler.budget(decoding=True)
    assert budgets == 0


def test_embeddings_and_decodes_share_steps_until_both_finish(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, embedding_chunk_tokens=32))  # not started: we step it
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    llm = eng.submit("decode while embedding", greedy)
    emb = eng.submit_embedding([LONG[:150]])
    eng._drain_inbox()
    mixed = 0
    while eng.scheduler.has_work():
        stats = eng.scheduler.step()
        mixed += stats.embedding_tokens > 0 and stats.decode_tokens > 0
    assert mixed > 0  # some steps carried both
    assert llm.result(timeout=1).finish_reason == "length" and emb.result(timeout=1).error is None
