"""One engine iteration of a colocation run: what it computes and how long it takes.

`plan_step` picks the work (prefill chunks within the prefill budget, one decode token per
other running request, each decoding request's next block taken or a victim preempted for it;
under shared compute, whole embedding forwards in turn with the LLM steps or, chunked, an
embedding chunk fused into the step) and times it with the cost models; `apply_step` applies
the progress once the step's time has passed. Functions of the run's state (`state.py`).
"""

from __future__ import annotations

import math

from engine_adapter.sim.colocation.embeddings import EPS_S, finish_embedding
from engine_adapter.sim.colocation.llm import finish_llm, preempt, victims
from engine_adapter.sim.colocation.state import ColocationRun, EmbeddingInFlight, LLMInFlight

__all__ = ["StepPlan", "apply_step", "plan_step"]

TPOT_SHARE = 0.9
"""Chunked embeddings keep each decoding request's mean TPOT within this share of its objective."""


class StepPlan:
    """The work of one step: (request, prefill tokens; 0 for a decode token) and (batch, seconds)."""

    __slots__ = ("embedding", "llm")

    def __init__(self) -> None:
        self.llm: list[tuple[LLMInFlight, int]] = []
        self.embedding: list[tuple[EmbeddingInFlight, float]] = []


def plan_step(st: ColocationRun, now: float, plan: StepPlan) -> float:
    """Plan and time one engine iteration into `plan`; `apply_step` applies its progress."""
    plan.llm, plan.embedding = [], []
    if st.compute == "shared" and not st.chunked and st.emb_running and (st.emb_turn or not st.running):
        # Unchunked: LLM iterations alternate with whole embedding forwards (all running
        # batches in one forward).
        st.emb_turn = False
        plan.embedding = [(e, e.remaining_s) for e in st.emb_running]
        return sum(e.remaining_s for e in st.emb_running)
    st.emb_turn = True
    llm_time, decode_batch = _plan_llm(st, now, plan)
    if st.compute == "split" or not st.emb_running:
        return llm_time
    if st.chunked:
        head = st.emb_running[0]
        give = _chunk_seconds(st, now, plan, llm_time, decode_batch)
        give = min(give, head.remaining_s, st.params.embedding_chunk_tokens * st.ecost.per_token_s)
        plan.embedding = [(head, give)]
        return llm_time + give
    return llm_time


def _plan_llm(st: ColocationRun, now: float, plan: StepPlan) -> tuple[float, int]:
    """The LLM part of the step: its time and its decode batch."""
    budget = st.shape.max_prefill_tokens
    prefill_tokens = prefill_batch = cached = decode_batch = context = 0
    for r in list(st.running):
        if r.state != "running":
            continue
        if r.computed < r.need:
            if budget <= 0:
                continue
            chunk = min(budget, r.need - r.computed)
            budget -= chunk
            prefill_tokens += chunk
            prefill_batch += 1
            cached += r.computed + r.hit_tokens
            plan.llm.append((r, chunk))
        else:
            tokens = r.req.prompt_tokens + r.generated + 1
            if -(-tokens // st.bs) > r.blocks and not _next_block(st, r, tokens, now, plan):
                continue
            decode_batch += 1
            context += r.req.prompt_tokens + r.generated
            plan.llm.append((r, 0))
    llm_time = st.cost.step_time(
        prefill_tokens=prefill_tokens,
        prefill_batch=prefill_batch,
        cached_tokens=cached,
        decode_batch=decode_batch,
        context_tokens=context,
    )
    return llm_time, decode_batch


def _next_block(st: ColocationRun, r: LLMInFlight, tokens: int, now: float, plan: StepPlan) -> bool:
    """The block the next token (the `tokens`-th) needs: taken, or others preempted for it;
    False when the request itself is preempted."""
    pool = st.pool
    if not pool.grow(r.sid, tokens, st.llm_cap()):
        others = [x for x in st.running if x is not r and x.state == "running"]
        for v in victims(st, others, 1, now):
            preempt(st, v)
            plan.llm = [(x, c) for x, c in plan.llm if x is not v]
        if not pool.grow(r.sid, tokens, st.llm_cap()):
            preempt(st, r)
            return False
    r.blocks = pool.sequence_blocks(r.sid)
    st.track_peak()
    return True


def _chunk_seconds(
    st: ColocationRun, now: float, plan: StepPlan, llm_time: float, decode_batch: int
) -> float:
    """Seconds of embedding work to fuse into a step of `llm_time` (chunked, shared compute)."""
    head = st.emb_running[0]
    per_token = st.ecost.per_token_s
    if llm_time <= 0:
        return st.params.embedding_chunk_tokens * per_token
    if not decode_batch:
        return max(0.5 * llm_time, st.params.embedding_chunk_tokens * per_token)
    # The step may grow while every decoding request's mean TPOT stays within TPOT_SHARE of
    # its objective (TPOT holds), and by half at least (embeddings progress).
    headroom = min(
        TPOT_SHARE * r.req.tpot_ms / 1000 * r.generated - (now - (r.first_token_s or now))
        for r, c in plan.llm
        if c == 0
    )
    give = max(0.5 * llm_time, headroom - llm_time)
    # And at least the pace at which every batch still meets its deadline, in EDF order: chunks
    # of `give` beside steps of `llm_time` finish W of work within T when
    # give >= W * llm_time / (T - W), W the work due by then.
    work = 0.0
    for e in [head, *st.queued]:
        work += e.remaining_s if e is head else e.work_s
        left = e.req.arrival_s + e.req.deadline_ms / 1000 - now
        if left > work:
            give = max(give, work * llm_time / (left - work))
        elif left > 0:  # at risk even at full pace: the largest chunk
            give = math.inf
    return give


def apply_step(st: ColocationRun, now: float, plan: StepPlan) -> None:
    """The step's progress at its end: prefill chunks, tokens, finished requests and batches."""
    for r, chunk in plan.llm:
        if r.state != "running":
            continue
        if chunk:
            r.computed += chunk
            if r.computed >= r.need:  # the step that ends a prefill produces a token
                r.generated += 1
                if r.first_token_s is None:
                    r.first_token_s = now
        else:
            r.generated += 1
        if r.computed >= r.need and r.generated >= r.req.output_tokens:
            st.running.remove(r)
            finish_llm(st, r, now)
    for e, work in plan.embedding:
        e.remaining_s -= work
        if e.remaining_s <= EPS_S and e.state == "running":
            finish_embedding(st, e, now)
    plan.llm, plan.embedding = [], []
