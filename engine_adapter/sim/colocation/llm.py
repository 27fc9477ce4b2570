"""The LLM side of a colocation run: admission, preemption and completion of LLM requests.

vLLM-like: waiting requests are admitted first come first served (or by Algorithm 1 with the
controller), each admission allocating the prompt's blocks in the pool (its template's cached
prefix is a hit); a request that cannot get a block is preempted by recompute and goes back to
the head of the queue. Victims: Algorithm 3 (with the controller and `alg3`) or the latest
arrival among the lowest priority, as vLLM does; one rule for every preemption of a run, those
Algorithm 1 makes for a high-priority request included (`victims`). Functions of the run's
state (`state.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.colocation import Decision, LLMView
from engine_adapter.sim.colocation.state import ColocationRun, LLMInFlight

__all__ = ["admit", "finish_llm", "preempt", "release", "schedule_llm", "victims"]

ADMISSION_LOOKAHEAD = 64
"""Waiting LLM requests Algorithm 1 looks at per step."""


def deadline_for(st: ColocationRun, r: LLMInFlight) -> float:
    """The deadline its blocks carry (`EntryMeta.deadline`, what the `slo` policy reads), as the
    engine gives it: now + the controller's slack with a controller, else the time by which the
    request would finish if it met both SLOs (arrival + TTFT + TPOT per further token)."""
    if st.controller is not None:
        return st.now + st.controller.slack_s(st.llm_view(r), st.now)
    q = r.req
    return q.arrival_s + (q.ttft_ms + q.tpot_ms * max(q.max_tokens - 1, 0)) / 1000


def admit(st: ColocationRun, r: LLMInFlight) -> bool:
    """Allocate the prompt's blocks (its cached prefix is a hit); False when they do not fit."""
    q = r.req
    hit_tokens = st.pool.admit(r.sid, q, r.generated, st.llm_cap(), lambda: deadline_for(st, r))
    if hit_tokens is None:
        return False
    r.hit_tokens = hit_tokens
    r.blocks = st.pool.sequence_blocks(r.sid)
    r.need = q.prompt_tokens + r.generated - hit_tokens
    r.computed = 0
    r.state = "running"
    st.result.prompt_tokens += q.prompt_tokens
    st.result.hit_tokens += hit_tokens
    st.running.append(r)
    st.track_peak()
    return True


def release(st: ColocationRun, r: LLMInFlight) -> None:
    """Give a running request's blocks back (its prefix stays cached)."""
    st.pool.release(r.sid)
    r.blocks = 0


def preempt(st: ColocationRun, r: LLMInFlight) -> None:
    """Preempt a running request by recompute: back to the head of the queue."""
    st.pool.preempt(r.sid)
    r.blocks = 0
    st.running.remove(r)
    r.state, r.computed, r.need = "waiting", 0, 0
    r.preemptions += 1
    st.result.preemptions += 1
    st.waiting.insert(0, r)


def victims(st: ColocationRun, candidates: list[LLMInFlight], blocks: int, now: float) -> list[LLMInFlight]:
    """Algorithm 3 (with the controller and alg3) or the latest arrivals first (vLLM)."""
    if st.system.alg3 and st.controller is not None:
        by_id = {r.req.request_id: r for r in candidates}
        ids = st.controller.preemption_victims([st.llm_view(r) for r in candidates], blocks, now)
        return [by_id[i] for i in ids]
    chosen, freed = [], 0
    for r in sorted(candidates, key=lambda r: (r.req.priority, -r.req.arrival_s)):
        if freed >= blocks:
            break
        chosen.append(r)
        freed += st.pool.private_blocks(r.sid)
    return chosen


def finish_llm(st: ColocationRun, r: LLMInFlight, now: float) -> None:
    """A request produced its last token: free its blocks, count its TTFT and TPOT."""
    release(st, r)
    r.state, r.finish_s = "done", now
    q = r.req
    res = st.result
    res.llm_finished += 1
    res.output_tokens += q.output_tokens
    assert r.first_token_s is not None
    ttft = r.first_token_s - q.arrival_s
    tpot = (now - r.first_token_s) / (q.output_tokens - 1) if q.output_tokens > 1 else 0.0
    res.ttft_s.append(ttft)
    res.tpot_s.append(tpot)
    if ttft <= q.ttft_ms / 1000 + 1e-9 and tpot <= q.tpot_ms / 1000 + 1e-9:
        res.llm_met += 1
    if st.controller is not None:
        st.controller.observe_llm_finished(q.prompt_tokens, q.output_tokens)


def schedule_llm(st: ColocationRun, now: float) -> None:
    """Admission at the start of a step: drop what missed its first-token deadline (systems
    with deadline drop), then first come first served, or Algorithm 1 with the controller."""
    if st.system.deadline_drop:
        for r in [r for r in st.waiting if r.first_token_s is None]:
            if now > r.req.arrival_s + r.req.ttft_ms / 1000:
                st.waiting.remove(r)
                st.reject_llm(r, "deadline: first-token deadline passed while queued")
    if not (st.system.alg1 and st.controller is not None):
        while st.waiting and len(st.running) < st.shape.max_running:
            if not admit(st, st.waiting[0]):
                break
            st.waiting.pop(0)
        return
    _schedule_by_algorithm_1(st, now)


def _schedule_by_algorithm_1(st: ColocationRun, now: float) -> None:
    """Algorithm 1 over the head of the queue: admit, admit after preempting, defer or reject."""
    controller = st.controller
    assert controller is not None
    queue_views = [st.emb_view(e) for e in st.queued]

    def choose(lower: Sequence[LLMView], blocks: int) -> list[str]:
        # A high-priority request's victims by the run's one rule (`victims`): Algorithm 3, or
        # latest arrival when it is ablated (else `-no-alg3` still preempted by Algorithm 3 here).
        by_id = {x.req.request_id: x for x in st.running}
        return [v.req.request_id for v in victims(st, [by_id[x.request_id] for x in lower], blocks, now)]

    for r in list(st.waiting[:ADMISSION_LOOKAHEAD]):
        if len(st.running) >= st.shape.max_running:
            break
        if r.preemptions:  # already admitted once: Algorithm 1 does not judge it again
            if not admit(st, r):
                break
            st.waiting.remove(r)
            continue
        running_views = [st.llm_view(x) for x in st.running]
        decision = controller.admit_llm(
            st.llm_view(r), now, st.memory(), running_views, queue_views, choose_victims=choose
        )
        if decision.decision is Decision.REJECT:
            st.waiting.remove(r)
            st.reject_llm(r, f"alg1: {decision.reason}")
            continue
        if decision.decision is Decision.DEFER:
            if not r.deferred:
                r.deferred = True
                st.result.llm_deferred += 1
            continue
        if decision.decision is Decision.ADMIT_WITH_PREEMPTION:
            by_id = {x.req.request_id: x for x in st.running}
            for rid in decision.preempt:
                if rid in by_id:
                    preempt(st, by_id[rid])
        if not admit(st, r):
            break
        st.waiting.remove(r)
