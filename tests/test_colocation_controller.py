"""The colocation controller (engine_adapter/colocation): Algorithms 1-3 against hand-worked
cases from the spec's pseudo-code (spec 004, section 3), sage's additions, and properties of
the quotas (floors, the pool's sum, smooth_adjust's bound)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.colocation import (
    LLMSLO,
    ColocationController,
    ColocationParams,
    Decision,
    EmbeddingSLO,
    EmbeddingView,
    LLMView,
    MemoryState,
    Quota,
    parse_mode,
    smooth_adjust,
)
from engine_adapter.colocation.preemption import eviction_cost, select_victims
from engine_adapter.colocation.quota import urgency

PARAMS = ColocationParams()


def llm(
    rid: str = "r",
    *,
    arrival: float = 0.0,
    prompt: int = 160,
    generated: int = 0,
    max_tokens: int = 1000,
    ttft_ms: float = 1000.0,
    tpot_ms: float = 50.0,
    priority: int = 0,
    blocks: int = 0,
) -> LLMView:
    first = None if generated == 0 else arrival + 0.1
    return LLMView(
        rid, arrival, prompt, generated, max_tokens, LLMSLO(ttft_ms, tpot_ms), priority, first, blocks
    )


def emb(
    rid: str = "e",
    *,
    arrival: float = 0.0,
    tokens: int = 512,
    deadline_ms: float = 1000.0,
    blocks: int = 5,
    started: float | None = None,
) -> EmbeddingView:
    return EmbeddingView(rid, arrival, tokens, EmbeddingSLO(deadline_ms), blocks, started)


def memory(llm_blocks: int, embedding_blocks: int, total: int = 100) -> MemoryState:
    return MemoryState(total, llm_blocks, embedding_blocks, total - llm_blocks - embedding_blocks)


def controller(system: str = "spec", total: int = 100, mode: str = "dynamic") -> ColocationController:
    c = ColocationController(total, 16, PARAMS, mode, system=system)
    c.observe_llm_finished(160, 160)  # the predictor now says 160 output tokens for a 160-token prompt
    return c


# ---------------------------------------------------------------- Algorithm 1


def test_algorithm_1_admits_what_fits_with_the_embedding_forecast_and_the_safety_margin() -> None:
    # kv = ceil((160 + 160) / 16) = 20; forecast = 5 (one queued batch); safety = 10% of 100.
    c = controller()
    queue = [emb(blocks=5)]
    ok = c.admit_llm(llm(), 0.0, memory(50, 10), [], queue)
    assert ok.decision is Decision.ADMIT  # 60 + 20 + 5 + 10 = 95 <= 100
    short = c.admit_llm(llm(), 0.0, memory(56, 10), [], queue)
    assert short.decision is Decision.DEFER  # 101 > 100, first-token slack 1.0 s > 0.5 s
    assert "short of 1 blocks" in short.reason
    late = c.admit_llm(llm(arrival=-0.6), 0.0, memory(56, 10), [], queue)
    assert late.decision is Decision.REJECT  # slack 0.4 s <= DEFER_THRESHOLD
    # A batch already running is in the memory in use, not in the forecast.
    running_batch = [emb(blocks=5, started=0.0)]
    assert c.admit_llm(llm(), 0.0, memory(56, 10), [], running_batch).decision is Decision.ADMIT


def test_algorithm_1_counts_the_forecast_arrivals() -> None:
    c = controller()
    base = c.admit_llm(llm(), 0.0, memory(60, 0), [], [])
    assert base.decision is Decision.ADMIT  # 60 + 20 + 0 + 10 = 90
    for i in range(10):  # 10 batches of 10 blocks in 0.9 s: a rate the forecaster projects ahead
        c.observe_embedding_arrival(i * 0.1, 10)
    assert c.admit_llm(llm(arrival=1.0), 1.0, memory(60, 0), [], []).decision is Decision.DEFER


def test_algorithm_1_high_priority_preempts_lower_priority_requests_only() -> None:
    c = controller()
    running = [
        llm("low", generated=10, blocks=8, priority=0),
        llm("peer", generated=10, blocks=30, priority=2),
    ]
    high = llm("new", priority=2)
    decision = c.admit_llm(high, 0.0, memory(70, 0), running, [])
    # 70 + 20 + 10 = 100 fits exactly.
    assert decision.decision is Decision.ADMIT
    decision = c.admit_llm(high, 0.0, memory(75, 0), running, [])
    assert decision.decision is Decision.ADMIT_WITH_PREEMPTION
    assert decision.preempt == ("low",)  # 5 blocks short; the priority-2 peer is never a victim
    decision = c.admit_llm(high, 0.0, memory(90, 0), running, [])
    assert decision.decision is Decision.DEFER  # 20 short, the low-priority one frees only 8


def test_sage_rejects_a_request_past_its_first_token_deadline_where_the_spec_admits() -> None:
    stale = llm(arrival=-2.0)
    assert controller("spec").admit_llm(stale, 0.0, memory(0, 0), [], []).decision is Decision.ADMIT
    sage = controller("sage").admit_llm(stale, 0.0, memory(0, 0), [], [])
    assert sage.decision is Decision.REJECT and "deadline passed" in sage.reason


# ---------------------------------------------------------------- embeddings (sage)


def test_embedding_admission_spec_admits_everything_sage_checks_fit_and_deadline() -> None:
    spec, sage = controller("spec"), controller("sage")
    huge = emb(blocks=95)
    assert spec.admit_embedding(huge, 0.0, memory(0, 0)).decision is Decision.ADMIT
    assert sage.admit_embedding(huge, 0.0, memory(0, 0)).decision is Decision.REJECT  # LLM floor is 10
    sage.observe_embedding_finished(1000, 1.0)  # 1 ms per token
    ahead = [emb("first", tokens=500, deadline_ms=800)]
    late = sage.admit_embedding(emb(tokens=600), 0.0, memory(0, 0), ahead)
    assert late.decision is Decision.REJECT  # (500 + 600) ms > 1000 ms
    assert sage.admit_embedding(emb(tokens=400), 0.0, memory(0, 0), ahead).decision is Decision.ADMIT
    assert sage.admit_embedding(emb(tokens=400), 0.0, memory(50, 48), ahead).decision is Decision.DEFER
    # A batch due later than this one does not run before it (EDF).
    later = [emb("later", tokens=5000, deadline_ms=9000)]
    assert sage.admit_embedding(emb(tokens=400), 0.0, memory(0, 0), later).decision is Decision.ADMIT


def test_embedding_order_is_edf_for_sage_and_fifo_for_the_spec() -> None:
    queue = [emb("a", arrival=0.0, deadline_ms=900), emb("b", arrival=0.1, deadline_ms=100)]
    assert [e.request_id for e in controller("sage").embedding_order(queue, 0.2)] == ["b", "a"]
    assert [e.request_id for e in controller("spec").embedding_order(queue, 0.2)] == ["a", "b"]


# ---------------------------------------------------------------- slack and Algorithm 3


def test_slack_is_the_deadline_minus_now_and_the_remaining_time_at_the_slo_pace() -> None:
    c = ColocationController(100, 16, PARAMS, "dynamic", system="spec")
    c.observe_llm_finished(160, 21)
    r = llm(ttft_ms=1000, tpot_ms=50)
    assert c.deadline_s(r) == pytest.approx(2.0)  # 1.0 + 20 * 0.05
    assert c.slack_s(r, 0.5) == pytest.approx(0.45)  # 2.0 - 0.5 - 21 * 0.05


def test_algorithm_3_evicts_in_ascending_cost_and_spares_nearly_finished_requests() -> None:
    candidates = [
        ("A", 1.0, 0, 0, 100, 10),  # cost 1 / 1.001
        ("B", 0.1, 0, 0, 100, 10),  # cost 1 / 0.101
        ("C", -1.0, 0, 500, 100, 10),  # cost 1 / -0.999 + 0.5 < 0: past its deadline, first
        ("D", 5.0, 2, 0, 5, 50),  # cost 4 / 5.001, but 5 tokens left < 16: protected
    ]
    assert eviction_cost(1.0, 0, 0, PARAMS) == pytest.approx(1 / 1.001)
    assert eviction_cost(-1.0, 0, 500, PARAMS) == pytest.approx(1 / -0.999 + 0.5)
    assert select_victims(candidates, 15, PARAMS) == ["C", "A"]
    assert select_victims(candidates, 10, PARAMS) == ["C"]
    assert select_victims(candidates, 0, PARAMS) == []
    assert select_victims(candidates, 1000, PARAMS) == ["C", "A", "B"]  # frees less, as the spec does


def test_preemption_victims_through_the_controller() -> None:
    c = controller()
    active = [
        llm("young", generated=1, blocks=12),
        llm("old", generated=150, blocks=12),
        llm("hi", priority=2, blocks=12),
    ]
    victims = c.preemption_victims(active, 12, 0.0)
    assert victims == ["young"]  # same slack for all three; "old" has 10 tokens left (protected)


# ---------------------------------------------------------------- Algorithm 2


def test_urgency_as_compute_urgency_writes_it() -> None:
    assert urgency([-2.0, 0.5, 3.0], PARAMS) == pytest.approx(10 * 2 + 1 / 1.5)


def test_algorithm_2_moves_towards_the_urgent_class_by_at_most_max_change_rate() -> None:
    c = controller("spec")
    assert c.quota == Quota(70, 30)  # 10 + 85 * 0.7 = 69.5
    urgent = [llm(arrival=-5.0)]  # far past its deadline
    assert c.update_quota(0.0, urgent, []) == Quota(80, 20)
    assert c.update_quota(0.5, urgent, []) == Quota(80, 20)  # within the interval
    assert c.update_quota(1.0, urgent, []) == Quota(90, 10)
    assert c.update_quota(2.0, urgent, []) == Quota(95, 5)  # the embedding floor
    assert c.update_quota(3.0, [], [emb(arrival=3.0 - 5.0)]) == Quota(85, 15)
    assert c.update_quota(4.0, [], []) == Quota(75, 25)
    assert c.update_quota(5.0, [], []) == Quota(70, 30)  # back to the default share


def test_sage_quota_follows_the_demand_and_holds_still_in_the_dead_band() -> None:
    c = controller("sage")
    batches = [emb(str(i), blocks=10, deadline_ms=60_000) for i in range(8)]  # 80 blocks of embeddings
    quotas = [c.update_quota(float(t), [], batches).llm_blocks for t in range(7)]
    assert quotas == [60, 50, 40, 30, 20, 10, 10]  # target: the LLM floor, 10 blocks a step at most
    # The mix turns to LLM only: the demand share's moving average (time constant 4 s) gets
    # 1 - exp(-1/4) = 22.1 % of the way per second: targets 10 + 85 * 0.221 = 28.8, then 43.4.
    only_llm = [llm(str(i), ttft_ms=60_000, tpot_ms=1000) for i in range(2)]
    assert c.update_quota(7.0, only_llm, []).llm_blocks == 20
    assert c.update_quota(8.0, only_llm, []).llm_blocks == 30
    c2 = controller("sage")
    steady = [llm(str(i), ttft_ms=60_000, tpot_ms=1000) for i in range(2)]  # 40 blocks of demand
    assert (
        c2.update_quota(0.0, steady, [emb(blocks=16, deadline_ms=60_000)]).llm_blocks == 70
    )  # 70.7: in the band


def test_static_mode_holds_its_split() -> None:
    c = ColocationController(100, 16, PARAMS, "static:0.8")
    assert c.quota == Quota(80, 20)
    assert c.update_quota(5.0, [llm(arrival=-10.0)], []) == Quota(80, 20)


@pytest.mark.parametrize("mode", ["", "static", "static:0", "static:1", "static:x", "dyn", "static:nan"])
def test_bad_modes_are_rejected_with_the_value(mode: str) -> None:
    with pytest.raises(ValueError, match="colocation mode"):
        parse_mode(mode)


def test_bad_params_name_the_field() -> None:
    with pytest.raises(ValueError, match="min_llm_quota"):
        ColocationParams(min_llm_quota=0.7, min_embedding_quota=0.5)
    with pytest.raises(ValueError, match="priority_weights"):
        ColocationParams(priority_weights=())
    with pytest.raises(ValueError, match="deadline_ms"):
        EmbeddingSLO(0)


# ---------------------------------------------------------------- properties

slos = st.builds(LLMSLO, st.floats(10, 5000), st.floats(5, 500))
llm_views = st.builds(
    LLMView,
    st.text("abc", min_size=1, max_size=3),
    st.floats(-10, 10),
    st.integers(1, 4000),
    st.integers(0, 100),
    st.integers(100, 2000),
    slos,
    st.integers(0, 3),
    st.none(),
    st.integers(0, 200),
)
emb_views = st.builds(
    EmbeddingView,
    st.text("xyz", min_size=1, max_size=3),
    st.floats(-10, 10),
    st.integers(16, 20000),
    st.builds(EmbeddingSLO, st.floats(10, 5000)),
    st.integers(1, 200),
    st.none() | st.floats(-10, 10),
)
steps = st.lists(
    st.tuples(st.floats(0, 2), st.lists(llm_views, max_size=6), st.lists(emb_views, max_size=6)),
    min_size=1,
    max_size=25,
)


@given(
    total=st.integers(1, 5000),
    system=st.sampled_from(["spec", "sage"]),
    min_llm=st.floats(0, 0.5),
    min_emb=st.floats(0, 0.5),
    rate=st.floats(0.01, 1.0),
    steps=steps,
)
def test_quota_stays_within_its_floors_sums_to_the_pool_and_moves_at_most_the_rate(
    total: int, system: str, min_llm: float, min_emb: float, rate: float, steps: list
) -> None:
    params = ColocationParams(min_llm_quota=min_llm, min_embedding_quota=min_emb, max_change_rate=rate)
    c = ColocationController(total, 16, params, "dynamic", system=system)
    llm_floor, emb_floor = math.ceil(total * min_llm), math.ceil(total * min_emb)
    now, previous = 0.0, c.quota
    for dt, requests, batches in steps:
        now += dt
        for b in batches:
            c.observe_embedding_arrival(now, b.blocks)
        q = c.update_quota(now, requests, batches)
        assert q == c.quota
        assert q.llm_blocks + q.embedding_blocks == total
        assert q.llm_blocks >= min(llm_floor, total)
        assert q.embedding_blocks >= min(emb_floor, total - llm_floor)
        assert abs(q.llm_blocks - previous.llm_blocks) <= math.ceil(rate * total)
        previous = q


@given(current=st.integers(0, 10_000), target=st.floats(-1e5, 1e5), max_change=st.floats(0.5, 1e4))
def test_smooth_adjust_moves_towards_the_target_by_at_most_max_change(
    current: int, target: float, max_change: float
) -> None:
    moved = smooth_adjust(current, target, max_change)
    assert abs(moved - current) <= math.ceil(max_change)
    assert (moved - current) * (target - current) >= 0  # never away from the target


@given(
    active=st.lists(llm_views, max_size=12, unique_by=lambda r: r.request_id),
    needed=st.integers(0, 500),
    now=st.floats(-5, 20),
)
def test_victims_are_distinct_unprotected_active_requests_and_stop_once_enough_is_freed(
    active: list[LLMView], needed: int, now: float
) -> None:
    c = controller("spec")
    victims = c.preemption_victims(active, needed, now)
    by_id = {r.request_id: r for r in active}
    assert len(set(victims)) == len(victims) and set(victims) <= set(by_id)
    for rid in victims:
        r = by_id[rid]
        assert c.predicted_output_tokens(r) - r.generated_tokens >= PARAMS.completion_threshold
    if victims:  # the last victim was needed: before it, less than `needed` was freed
        assert sum(by_id[v].blocks for v in victims[:-1]) < needed


@given(
    req=llm_views,
    used=st.integers(0, 100),
    running=st.lists(llm_views, max_size=5),
    queue=st.lists(emb_views, max_size=5),
    system=st.sampled_from(["spec", "sage"]),
)
def test_every_decision_has_a_reason_and_only_preemption_names_victims(
    req: LLMView, used: int, running: list[LLMView], queue: list[EmbeddingView], system: str
) -> None:
    c = controller(system)
    a = c.admit_llm(req, 0.0, memory(used, 0), running, queue)
    assert a.reason
    assert bool(a.preempt) == (a.decision is Decision.ADMIT_WITH_PREEMPTION)
    assert set(a.preempt) <= {r.request_id for r in running if r.priority < req.priority}


def test_sage_quota_needs_twice_the_dead_band_to_turn_back() -> None:
    c = controller("sage")
    assert c.update_quota(0.0, [], [emb(blocks=10, deadline_ms=60_000)]).llm_blocks == 60  # down from 70
    # 10 s later the demand share is 40 / 50 = 0.8, its average 0.8 * (1 - exp(-10/4)) = 0.734:
    # target 10 + 85 * 0.734 = 72.4, 12.4 blocks up: past the band (8) but not twice it (16).
    mix = [llm(str(i), ttft_ms=60_000, tpot_ms=1000) for i in range(2)]
    assert c.update_quota(10.0, mix, [emb(blocks=10, deadline_ms=60_000)]).llm_blocks == 60
