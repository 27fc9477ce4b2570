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
from engine_adapter.model.tokenizer import ByteTokenizer, IncrementalDetokenizer
from engine_adapter.serving.app import build_app
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.embedding_batch import EmbeddingJob, EmbeddingText
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.errors import AdmissionRejected, RequestError
from engine_adapter.serving.sequence import Sequence

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
    eng = Engine(_config(tmp_path, colocation="static:0.05", colocation_params=switches))
    eng.start()
    try:
        # the policy picks victims, and the embedding quota gates reservations
        assert eng.hooks.choose_victims(eng.scheduler.running, set(), 1) is None
        assert eng.hooks.colocation is not None
        # 44 blocks of workspace: sage's admission rejects it (at most 48 less the LLM's floor
        # of 5); a partition whose embedding part holds 46 takes it
        assert eng.submit_embedding(["x" * 350]).result(timeout=60).error is None
        stats = eng.colocation_stats()
        assert stats is not None and stats["admission"] is False
        assert stats["quota"] == {"llm_blocks": 2, "embedding_blocks": 46}
    finally:
        eng.shutdown(drain=False, timeout=10)


# ---- the LLM quota is charged for every block, decode growth included (issue 28, item 2) -------


def _charged_run(
    tmp_path: Path, mode: str, prompts: list[str], max_tokens: int
) -> tuple[list[list[int]], int, list[tuple[int, int, int]]]:
    """`prompts` stepped by hand on a 48-block pool under `mode` (admission control off: only
    the quota gates); the outputs, the preemptions and, after each step, (LLM blocks held,
    LLM quota, running sequences)."""
    config = _config(tmp_path, colocation=mode, colocation_params={"admission": "false"})
    eng = Engine(config)
    gates = eng.hooks.colocation
    assert gates is not None
    greedy = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    handles = [eng.submit(p, greedy) for p in prompts]
    eng._drain_inbox()
    trace: list[tuple[int, int, int]] = []
    while eng.scheduler.has_work():
        eng.scheduler.step()
        eng.cache.check_invariants()
        trace.append((gates.llm_blocks_held(), gates.controller.quota.llm_blocks, len(eng.scheduler.running)))
    return [h.result(timeout=1).token_ids for h in handles], eng.scheduler.total_preemptions, trace


def _quota(tmp_path: Path, mode: str) -> int:
    gates = Engine(_config(tmp_path / "q", colocation=mode)).hooks.colocation
    assert gates is not None
    return gates.controller.quota.llm_blocks


@pytest.mark.slow  # two engines stepped by hand, a few hundred greedy tokens
@pytest.mark.parametrize("mode", ["static:0.5", "dynamic"])
@pytest.mark.parametrize("scenario", ["prompts", "decode growth"])
def test_the_llm_class_never_holds_more_than_its_quota(tmp_path: Path, mode: str, scenario: str) -> None:
    quota = _quota(tmp_path, mode)  # 24 blocks static, 33 dynamic (its starting quota)
    half = quota // 2 + 1  # two sequences of this many blocks each are over the quota
    if scenario == "prompts":  # each prompt alone fits; two together do not
        prompts = [f"{i}" + "p" * (BLOCK_SIZE * half - 2) for i in range(2)]
        max_tokens = 2
    else:  # admitted by their prompts (6 blocks each), over the quota as they decode
        prompts = [f"{i}" + "g" * 39 for i in range(2)]
        max_tokens = BLOCK_SIZE * half - 41
    outputs, preemptions, trace = _charged_run(tmp_path / "run", mode, prompts, max_tokens)
    # A dynamic quota lets a sequence running alone grow past it; a static partition never.
    over = [t for t in trace if t[0] > t[1] and (mode.startswith("static") or t[2] > 1)]
    assert not over, f"the LLM class held more than its quota (held, quota, running): {over[:3]}"
    assert max(t[0] for t in trace) > quota // 2  # the quota, not the pool, was what bound
    if scenario == "decode growth":
        assert preemptions > 0  # a sequence gave way when growth reached the quota
    reference = Engine(_config(tmp_path / "ref", colocation="off", num_blocks=256))
    reference.start()
    try:
        greedy = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        expected = [h.result(timeout=120).token_ids for h in [reference.submit(p, greedy) for p in prompts]]
    finally:
        reference.shutdown(drain=False, timeout=10)
    assert outputs == expected  # preempted by recompute: the same greedy tokens


# ---- static partitions are hard (issue 28, item 5) ------------------------------------------------


def test_a_static_partition_is_hard_at_its_boundary(tmp_path: Path) -> None:
    eng = Engine(_config(tmp_path, colocation="static:0.5", colocation_params={"admission": "false"}))
    gates = eng.hooks.colocation
    assert gates is not None and gates.partition == gates.controller.quota
    assert (gates.partition.llm_blocks, gates.partition.embedding_blocks) == (24, 24)
    eng.start()
    try:
        part_tokens = 24 * BLOCK_SIZE  # the byte tokenizer adds a bos
        # embeddings: a text of exactly the embedding part is served, one token more never
        assert eng.submit_embedding(["x" * (part_tokens - 1)]).result(timeout=60).error is None
        with pytest.raises(RequestError, match=r"needs 25 blocks; the embedding part .* holds 24"):
            eng.submit_embedding(["x" * part_tokens])
        # completions: prompt plus max_tokens of exactly the LLM part is served, one more never
        fits = eng.submit("y" * 99, SamplingParams(max_tokens=part_tokens - 100, ignore_eos=True))
        assert fits.result(timeout=120).finish_reason == "length"
        with pytest.raises(RequestError, match=r"needs 25 blocks; the LLM part .* holds 24"):
            eng.submit("y" * 99, SamplingParams(max_tokens=part_tokens - 99))
        # over HTTP: a 400 naming the partition, and the engine serves on
        client = TestClient(build_app(eng), raise_server_exceptions=False)
        r = client.post("/v1/embeddings", json={"input": "x" * part_tokens})
        assert r.status_code == 400 and "static partition (static:0.5)" in r.json()["error"]["message"], (
            r.text
        )
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        eng.shutdown(drain=False, timeout=10)


def _job() -> EmbeddingJob:
    return EmbeddingJob("emb-gate", [EmbeddingText(ids=[1, 2, 3])], 0.0, 1.0, lambda _result: None)


def _sequence(num_tokens: int) -> Sequence:
    ids = [65] * num_tokens
    return Sequence(
        seq_id=1,
        request_id="cmpl-gate",
        prompt_ids=ids,
        sampling=SamplingParams(max_tokens=1),
        detokenizer=IncrementalDetokenizer(ByteTokenizer(), ids),
        emit=lambda _output: None,
    )


def test_the_gates_let_no_first_request_past_a_static_partition(tmp_path: Path) -> None:
    """With nothing running and nothing reserved, a static partition still refuses one block more
    than its part (a dynamic quota lets the first of each class through, so neither starves)."""
    for mode, hard in (("static:0.5", True), ("dynamic", False)):
        eng = Engine(_config(tmp_path / mode.replace(":", "-"), colocation=mode))
        gates = eng.hooks.colocation
        assert gates is not None
        quota = gates.controller.quota
        assert gates.admits_embedding(_job(), quota.embedding_blocks) is True
        assert gates.admits_embedding(_job(), quota.embedding_blocks + 1) is not hard
        big = _sequence(BLOCK_SIZE * (quota.llm_blocks + 1))
        assert gates.admits_llm(_sequence(BLOCK_SIZE * quota.llm_blocks), []) is True
        assert gates.admits_llm(big, []) is not hard
        assert gates.admits_llm_growth(big, quota.llm_blocks + 1, [big]) is not hard
