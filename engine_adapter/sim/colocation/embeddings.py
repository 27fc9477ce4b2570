"""The embedding side of a colocation run: arrival (and sage's admission), start, completion.

A batch reserves its activation workspace in the pool while it runs (`ColocationPool.reserve`),
within the embedding quota (one batch may always run); with a dynamic quota, a batch that finds
the pool short preempts LLM requests holding more than the LLM quota. Under split compute the
batches run on their own device (`advance_split`). Functions of the run's state (`state.py`).
"""

from __future__ import annotations

import math

from engine_adapter.colocation import Decision, EmbeddingView
from engine_adapter.sim.colocation.llm import preempt, victims
from engine_adapter.sim.colocation.state import ColocationRun, EmbeddingInFlight

__all__ = ["EPS_S", "advance_split", "arrive_embedding", "finish_embedding", "next_split_completion"]

EPS_S = 1e-9
"""Work left below this is done (float rounding of the virtual clock)."""


def arrive_embedding(st: ColocationRun, e: EmbeddingInFlight, now: float) -> None:
    """A batch arrives: the controller learns its load; sage's admission may reject it."""
    st.result.embedding_total += 1
    if st.controller is not None:
        st.controller.observe_embedding_arrival(now, st.blocks_for(e))
    if st.system.embedding_admission and st.controller is not None:
        view = EmbeddingView(e.req.request_id, e.req.arrival_s, e.req.tokens, e.slo, st.blocks_for(e), None)
        queue = [st.emb_view(x) for x in st.queued + st.emb_running]
        decision = st.controller.admit_embedding(view, now, st.memory(), queue)
        if decision.decision is Decision.REJECT:
            st.reject_emb(e, f"embedding admission: {decision.reason}")
            return
    st.queued.append(e)


def start_embeddings(st: ColocationRun, now: float) -> None:
    """Start queued batches (in the controller's order) while they fit their quota and the pool."""
    if st.system.deadline_drop:
        for e in list(st.queued):
            if now + e.work_s > e.req.arrival_s + e.req.deadline_ms / 1000:
                st.queued.remove(e)
                st.reject_emb(e, "deadline: cannot finish before its deadline")
    if st.controller is not None:
        ordered = st.controller.embedding_order([st.emb_view(e) for e in st.queued], now)
        order = {v.request_id: i for i, v in enumerate(ordered)}
        st.queued.sort(key=lambda e: order[e.req.request_id])
    while st.queued:
        if st.system.edf and st.emb_running:
            return  # one batch at a time, in deadline order
        e = st.queued[0]
        blocks = st.blocks_for(e)
        within = st.pool.embedding_used + blocks <= st.quota.embedding_blocks or not st.emb_running
        if not within:
            if blocks <= st.pool.available:  # the pool holds it: the quota decided
                st.result.quota_limited += 1
            return
        if not _reserve(st, e, blocks, now):
            return
        st.queued.pop(0)
        e.state, e.started_s, e.blocks, e.remaining_s = "running", now, blocks, e.work_s
        st.emb_running.append(e)
        st.track_peak()


def _reserve(st: ColocationRun, e: EmbeddingInFlight, blocks: int, now: float) -> bool:
    """Reserve a batch's workspace; with a dynamic quota, the LLM side first gives back what it
    holds beyond its quota when the pool is short."""
    pool = st.pool
    if pool.reserve(e.owner, blocks):
        return True
    if st.controller is None or st.system.partition.startswith("static"):
        return False
    over = pool.llm_held - st.quota.llm_blocks
    short = blocks - pool.available
    if over <= 0:
        return False
    st.result.quota_limited += 1
    for victim in victims(st, list(st.running), min(over, short), now):
        preempt(st, victim)
    return pool.reserve(e.owner, blocks)


def finish_embedding(st: ColocationRun, e: EmbeddingInFlight, now: float) -> None:
    """A batch is done: release its workspace, count its latency."""
    st.pool.release_reservation(e.owner)
    st.emb_running.remove(e)
    e.state, e.finish_s, e.blocks = "done", now, 0
    res = st.result
    res.embedding_finished += 1
    res.embedding_tokens += e.req.tokens
    latency = now - e.req.arrival_s
    res.embedding_latency_s.append(latency)
    if latency <= e.req.deadline_ms / 1000 + 1e-9:
        res.embedding_met += 1
    if st.controller is not None and e.started_s is not None:
        st.controller.observe_embedding_finished(e.req.tokens, now - e.started_s)


def advance_split(st: ColocationRun, start: float, dt: float) -> None:
    """The embedding device over [start, start + dt]: one EDF batch, or all running shared equally."""
    t = start
    while st.emb_running:
        active = st.emb_running[:1] if st.system.edf else list(st.emb_running)
        n = len(active)
        least = min(e.remaining_s for e in active)
        if least * n <= dt + EPS_S:
            t += least * n
            dt -= least * n
            for e in active:
                e.remaining_s -= least
            for e in [e for e in active if e.remaining_s <= EPS_S]:
                finish_embedding(st, e, t)
        else:
            for e in active:
                e.remaining_s -= dt / n
            break


def next_split_completion(st: ColocationRun) -> float:
    """Seconds until the embedding device completes a batch (inf when none runs)."""
    if not st.emb_running:
        return math.inf
    active = st.emb_running[:1] if st.system.edf else st.emb_running
    return min(e.remaining_s for e in active) * len(active)
