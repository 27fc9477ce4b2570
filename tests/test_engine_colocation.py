"""Colocation in the engine (issue 19): engine_adapter.colocation's controller wired into the loop.

sage-tiny in process: admission on arrival (REJECT is a 429 with its reason, DEFER waits up to
the request's slack), quotas visible in the stats and ``/metrics`` and enforced on embedding
reservations, blocks that carry their request's real deadline, Algorithm 3 choosing preemption
victims with outputs unchanged, and with colocation off the stats exactly as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import app_client, running_engine
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.app import build_app
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.errors import AdmissionRejected

BLOCK_SIZE = 8
NUM_BLOCKS = 48


def _config(root: Path, **overrides: Any) -> EngineConfig:
    values: dict[str, Any] = {
        "num_blocks": NUM_BLOCKS,
        "block_size": BLOCK_SIZE,
        "device": "cpu",
        "socket": str(root / "t.sock"),
        "log_dir": str(root / "logs"),
        "colocation": "dynamic",
        "eviction_policy": "slo",
    }
    values.update(overrides)
    return EngineConfig(**values)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(_config, "sage-col-") as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


def _metric(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_quotas_show_in_the_stats_and_the_metrics(client: TestClient) -> None:
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": ["a", "b"]}).status_code == 200
    stats = client.get("/v1/eviction/stats").json()
    colocation = stats["colocation"]
    quota = colocation["quota"]
    assert colocation["mode"] == "dynamic" and colocation["system"] == "sage"
    assert quota["llm_blocks"] + quota["embedding_blocks"] == NUM_BLOCKS
    assert colocation["decisions"]["llm:admit"] >= 1 and colocation["decisions"]["embedding:admit"] >= 1
    assert stats["reserved_blocks"] == 0
    metrics = client.get("/metrics").text
    assert _metric(metrics, "sage:quota_blocks", {"class": "llm"}) == quota["llm_blocks"]
    assert _metric(metrics, "sage:quota_blocks", {"class": "embedding"}) == quota["embedding_blocks"]


def test_a_rejected_embedding_batch_is_a_429_with_the_reason(client: TestClient) -> None:
    # 47 blocks of workspace: more than embeddings may ever hold beside the LLM's floor.
    r = client.post("/v1/embeddings", json={"input": ["x" * 370]})
    assert r.status_code == 429, r.text
    assert r.json()["error"]["type"] == "slo_rejected"
    assert "embeddings may hold at most" in r.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": "fine"}).status_code == 200


@pytest.mark.slow  # it waits out a second of slack by design
def test_a_deferred_request_waits_up_to_its_slack_then_is_rejected(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path))
    eng.start()
    try:
        client = TestClient(build_app(eng), raise_server_exceptions=False)
        # 100 + 256 predicted tokens fill the pool past its safety margin: never fits, deferred while its
        # first-token slack exceeds the defer threshold (0.5 s), then rejected.
        body = {"prompt": "y" * 100, "max_tokens": 280, "slo_ttft_ms": 1500}
        t0 = time.monotonic()
        r = client.post("/v1/completions", json=body)
        waited = time.monotonic() - t0
        assert r.status_code == 429, r.text
        assert 0.9 <= waited <= 1.6  # deferred for 1.5 s of TTFT less the 0.5 s defer threshold
        decisions = eng.colocation_stats()["decisions"]  # type: ignore[index]
        assert decisions == {"llm:defer": 1, "llm:reject": 1}
        with pytest.raises(AdmissionRejected, match="defer threshold"):
            eng.submit("z" * 100, SamplingParams(max_tokens=280), slo_ttft_ms=100)
        stream = client.post("/v1/completions", json={**body, "slo_ttft_ms": 200, "stream": True})
        assert stream.status_code == 429  # rejected on arrival: before the stream starts
    finally:
        eng.shutdown(drain=False, timeout=10)


def test_embedding_reservations_stay_within_the_embedding_quota(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, colocation="static:0.85", embedding_chunk_tokens=64))  # stepped by hand
    assert eng.colocation is not None
    quota = eng.colocation.controller.quota
    assert quota.embedding_blocks == NUM_BLOCKS - round(0.85 * NUM_BLOCKS) == 7
    handle = eng.submit_embedding(["w" * 40] * 4)  # 6 blocks each (41 tokens): two at once would be 12 > 7
    reserve = eng.cache.reserve_blocks
    peaks: list[int] = []

    def reserve_and_note(owner: int, n: int) -> list[int] | None:
        ids = reserve(owner, n)
        peaks.append(eng.cache.num_reserved_blocks)
        return ids

    eng.cache.reserve_blocks = reserve_and_note  # type: ignore[method-assign]
    eng._drain_inbox()
    steps = 0
    while eng.scheduler.has_work():
        eng.scheduler.step()
        steps += 1
        eng.cache.check_invariants()
    # without the quota a 64-token step would start the next 40-token text beside the first
    assert peaks == [6, 6, 6, 6] and steps == 4
    assert handle.result(timeout=1).error is None


def test_blocks_carry_the_requests_real_deadline(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    deadlines: list[float | None] = []
    on_admitted = engine.hooks.on_admitted

    def seen(seq: Any, hit: int) -> None:  # what the cache holds for it, the moment it is admitted
        deadlines.append(engine.cache.sequence(seq.seq_id).request.deadline)
        on_admitted(seq, hit)

    with monkeypatch.context() as patch:
        patch.setattr(engine.hooks, "on_admitted", seen)
        now = engine.cache.clock()
        engine.submit("slack", SamplingParams(max_tokens=4), slo_ttft_ms=800, slo_tpot_ms=50).result(
            timeout=60
        )
    # deadline = now + slack; slack = TTFT + TPOT * (predicted - 1) - remaining time at TPOT pace
    assert deadlines and deadlines[0] is not None
    assert now + 0.5 < deadlines[0] < now + 0.9


@pytest.mark.slow  # two engines, 400 greedy tokens
def test_algorithm_3_preempts_and_greedy_outputs_are_unchanged(tmp_path: Path) -> None:
    prompts = [f"{i} the pool is short and sequences must give way" for i in range(5)]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)

    def run(**overrides: Any) -> tuple[list[list[int]], int]:
        eng = Engine(_config(tmp_path / str(len(overrides)), **{"num_blocks": 24, **overrides}))
        eng.start()
        try:
            # generous SLOs: admission admits everything; the pool is what runs short
            handles = [eng.submit(p, greedy, slo_ttft_ms=60_000, slo_tpot_ms=5_000) for p in prompts]
            outputs = [h.result(timeout=120).token_ids for h in handles]
            with eng.cache.lock:
                eng.cache.check_invariants()
            return outputs, eng.scheduler.total_preemptions
        finally:
            eng.shutdown(drain=False, timeout=10)

    reference, _ = run(num_blocks=256, colocation="off")
    # completion_threshold=0: no request is protected as nearly finished, so Algorithm 3's
    # choice (never the policy's fallback) is what preempts
    outputs, preemptions = run(colocation="static:0.95", colocation_params={"completion_threshold": 0})
    assert preemptions > 0
    assert outputs == reference


def test_with_colocation_off_the_stats_are_as_before(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, colocation="off"))
    eng.start()
    try:
        client = TestClient(build_app(eng), raise_server_exceptions=False)
        assert "colocation" not in client.get("/v1/eviction/stats").json()
        assert _metric(client.get("/metrics").text, "sage:quota_blocks", {"class": "llm"}) is None
        # no hook of colocation's: the policy picks victims, and nothing gates embeddings
        assert eng.hooks.choose_victims(eng.scheduler.running, set(), 1) is None
        assert eng.hooks.colocation is None
    finally:
        eng.shutdown(drain=False, timeout=10)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"colocation": "static:1.2"}, "static:F"),
        ({"colocation": "sometimes"}, "off, dynamic"),
        ({"colocation_params": "bogus=1"}, "unknown colocation param"),
        ({"colocation_params": "safety_ratio=2"}, "safety_ratio"),
        ({"colocation_params": "system=other"}, "sage or spec"),
        ({"colocation_params": "admission=maybe"}, "admission"),
    ],
)
def test_bad_colocation_settings_are_config_errors(
    tmp_path: Path, values: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        _config(tmp_path, **values)


def test_a_deferred_request_whose_client_leaves_is_aborted_at_once(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path))
    eng.start()
    try:
        handle = eng.submit("y" * 100, SamplingParams(max_tokens=280), slo_ttft_ms=30_000)  # deferred
        deadline = time.monotonic() + 5
        while not (eng.colocation is not None and eng.colocation.deferred) and time.monotonic() < deadline:
            time.sleep(0.01)
        handle.abort()
        output = handle.result(timeout=5)  # long before its 30 s of slack
        assert output.finish_reason == "abort"
        assert eng.colocation is not None and not eng.colocation.deferred
    finally:
        eng.shutdown(drain=False, timeout=10)


def test_eviction_stats_shows_the_quotas(client: TestClient) -> None:
    from sage_cli.eviction.render import render_stats

    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    text = render_stats(client.get("/v1/eviction/stats").json())
    lines = text.splitlines()
    start = lines.index("Colocation:")
    assert lines[start + 1] == "  Mode: dynamic (sage)"
    assert lines[start + 2].startswith("  LLM Quota: ") and lines[start + 3].startswith("  Embedding Quota: ")
    assert "llm:admit=" in text


@pytest.mark.parametrize("system", ["sage", "spec"])
def test_sage_sheds_queued_work_past_its_deadline_and_the_spec_does_not(tmp_path: Path, system: str) -> None:
    eng = Engine(_config(tmp_path, colocation_params={"system": system}))  # stepped by hand
    llm = eng.submit("late", SamplingParams(max_tokens=2), slo_ttft_ms=5)
    emb = eng.submit_embedding(["late too"], slo_deadline_ms=5)
    eng._drain_inbox()  # both admitted on arrival: they fit
    assert len(eng.scheduler.waiting) == 1 and len(eng.scheduler.embeddings.queue) == 1
    time.sleep(0.02)  # their deadlines pass while they queue
    eng._colocation_tick()
    if system == "spec":
        assert len(eng.scheduler.waiting) == 1 and len(eng.scheduler.embeddings.queue) == 1
        return
    assert not eng.scheduler.waiting and not eng.scheduler.embeddings.queue
    output = llm.result(timeout=1)
    assert output.finish_reason == "rejected" and "first-token deadline passed" in (output.error or "")
    result = emb.result(timeout=1)
    assert result.status == 429 and "deadline passed" in (result.error or "")
    stats = eng.colocation_stats()
    assert (
        stats is not None
        and stats["decisions"]["llm:dropped"] == stats["decisions"]["embedding:dropped"] == 1
    )


def test_a_plain_partition_admits_everything_and_leaves_preemption_to_the_policy(tmp_path: Path) -> None:
    switches = {"admission": "false", "slo_preemption": "false"}  # strings, as flags give them
    eng = Engine(_config(tmp_path, colocation="static:0.5", colocation_params=switches))
    eng.start()
    try:
        # the policy picks victims, and the embedding quota gates reservations
        assert eng.hooks.choose_victims(eng.scheduler.running, set(), 1) is None
        assert eng.hooks.colocation is not None
        # 47 blocks of workspace: sage's admission rejects it (test above); a partition takes it
        assert eng.submit_embedding(["x" * 370]).result(timeout=60).error is None
        stats = eng.colocation_stats()
        assert stats is not None and stats["admission"] is False
        assert stats["quota"] == {"llm_blocks": 24, "embedding_blocks": 24}
    finally:
        eng.shutdown(drain=False, timeout=10)
