"""`run_colocation`: one system on one workload, LLM requests and embedding batches on one pool.

The pool is the engine's cache manager with a registered eviction policy (`pool.py`). The loop
on the virtual clock: queue what has arrived, update the quota (Algorithm 2, each
interval), admit LLM requests (`llm.py`) and start embedding batches (`embeddings.py`), run one
engine iteration (`step.py`), or jump to the next arrival (or, split compute, the next
embedding completion) when nothing runs. Work still unfinished `DRAIN_S` after the last arrival
is rejected, and what can never be placed is rejected with a capacity reason.

Invariants the tests check: the pool is never over-committed (`peak_used_blocks <= total`),
every request ends finished or rejected with a reason, the same seed gives the same result.
"""

from __future__ import annotations

import math

from engine_adapter.colocation import ColocationParams
from engine_adapter.sim.colocation.embeddings import (
    advance_split,
    arrive_embedding,
    next_split_completion,
    start_embeddings,
)
from engine_adapter.sim.colocation.llm import release, schedule_llm
from engine_adapter.sim.colocation.metrics import RunResult
from engine_adapter.sim.colocation.state import ColocationRun
from engine_adapter.sim.colocation.step import StepPlan, apply_step, plan_step
from engine_adapter.sim.colocation.systems import SystemSpec, system_named
from engine_adapter.sim.colocation.workload import ColocationWorkload, EmbeddingCostModel, PoolShape
from engine_adapter.sim.cost_model import CostModel
from sage_eviction.registry import resolve_policy

__all__ = ["DRAIN_S", "drive", "run_colocation"]

DRAIN_S = 120.0
"""After the last arrival, work still unfinished this much later is rejected."""


def run_colocation(
    workload: ColocationWorkload,
    system: SystemSpec | str,
    *,
    compute: str = "shared",
    cost: CostModel | None = None,
    embedding_cost: EmbeddingCostModel | None = None,
    pool: PoolShape | None = None,
    params: ColocationParams | None = None,
    policy: str = "lru",
) -> RunResult:
    """Replay `workload` through `system`, on a pool whose cached blocks `policy` evicts.

    Args:
        workload: The requests (`engine_adapter.sim.colocation.workload.generate`).
        system: A `SystemSpec` or a name in `SYSTEMS`.
        compute: ``"shared"`` (one engine runs both classes) or ``"split"`` (embeddings on
            their own device; only memory is shared).
        cost: LLM step times (`CostModel()` when None).
        embedding_cost: Embedding batch times and workspaces (`EmbeddingCostModel()`).
        pool: The pool's shape (`PoolShape()`).
        params: The controller's constants (`ColocationParams()`).
        policy: The eviction policy of the pool's cache, a registry spec (``"lru"``,
            ``"slo"``, ``"slru:protected_threshold=3"``); online policies only.

    Returns:
        The run's counts and latencies (`metrics` makes its row).

    Raises:
        ValueError: An unknown system name or compute mode.
        PolicyConfigError: An unknown or offline policy, or a bad param (the registry's message;
            a `ValueError`).
    """
    spec = system_named(system)
    if compute not in ("shared", "split"):
        raise ValueError(f"compute must be shared or split, got {compute!r}")
    resolve_policy(policy, online=True)  # the registry's check and message; the pool builds it
    st = ColocationRun(
        workload,
        spec,
        compute=compute,
        cost=cost or CostModel(),
        embedding_cost=embedding_cost or EmbeddingCostModel(),
        pool=pool or PoolShape(),
        params=params or ColocationParams(),
        policy=policy,
    )
    return drive(st)


class _Arrivals:
    """The requests in arrival order, and how many of each kind have arrived."""

    def __init__(self, st: ColocationRun) -> None:
        self.llm = sorted(st.llm, key=lambda r: r.req.arrival_s)
        self.emb = sorted(st.emb, key=lambda e: e.req.arrival_s)
        self.li = self.ei = 0

    def arrive(self, st: ColocationRun, now: float) -> None:
        """Queue the LLM requests and admit (or reject) the batches that have arrived by `now`."""
        while self.li < len(self.llm) and self.llm[self.li].req.arrival_s <= now:
            st.waiting.append(self.llm[self.li])
            self.li += 1
        while self.ei < len(self.emb) and self.emb[self.ei].req.arrival_s <= now:
            arrive_embedding(st, self.emb[self.ei], now)
            self.ei += 1

    def next_s(self) -> float:
        """When the next request of either kind arrives (inf when none will)."""
        return min(
            self.llm[self.li].req.arrival_s if self.li < len(self.llm) else math.inf,
            self.emb[self.ei].req.arrival_s if self.ei < len(self.emb) else math.inf,
        )


def drive(st: ColocationRun) -> RunResult:
    """Run a prepared run (`run_colocation` prepares one) to its end: the loop (module
    docstring), then the drain and the counts; after it the pool holds no sequence and no
    reservation, only cached blocks."""
    arrivals = _Arrivals(st)
    plan = StepPlan()
    now = 0.0
    st.result.llm_total = len(st.llm)
    end = st.last_arrival + DRAIN_S
    while True:
        st.now = now
        arrivals.arrive(st, now)
        _update_quota(st, now)
        schedule_llm(st, now)
        start_embeddings(st, now)
        if now > end:
            break
        duration = plan_step(st, now, plan)
        if duration > 0:
            if st.compute == "split":
                advance_split(st, now, duration)
            now += duration
            st.now = now
            apply_step(st, now, plan)
            continue
        nxt = arrivals.next_s()
        if st.compute == "split":
            nxt = min(nxt, now + next_split_completion(st))
        if nxt == math.inf:
            _reject_what_cannot_be_placed(st)
            break
        target = max(nxt, now + 1e-9)
        if st.compute == "split":
            advance_split(st, now, target - now)
        now = target
    _drain(st, now)
    return st.result


def _update_quota(st: ColocationRun, now: float) -> None:
    """Algorithm 2 (systems with the controller); the quota trace records each change."""
    if st.controller is None:
        return
    res = st.result
    before = st.controller.quota.llm_blocks
    st.controller.update_quota(
        now,
        [st.llm_view(r) for r in st.waiting + st.running],
        [st.emb_view(e) for e in st.queued + st.emb_running],
    )
    if not res.quota_trace or st.controller.quota.llm_blocks != before:
        res.quota_trace.append((now, st.controller.quota.llm_blocks))


def _reject_what_cannot_be_placed(st: ColocationRun) -> None:
    """Nothing runs and nothing will arrive: what waits cannot be placed."""
    for r in list(st.waiting):
        st.waiting.remove(r)
        st.reject_llm(r, "capacity: does not fit the pool")
    for e in list(st.queued):
        st.queued.remove(e)
        st.reject_emb(e, "capacity: does not fit the pool")


def _drain(st: ColocationRun, now: float) -> None:
    """The run ended: what is unfinished is rejected; the makespan and the lost count."""
    for r in st.waiting + st.running:
        if r.state == "running":
            release(st, r)
        st.reject_llm(r, "drain: unfinished when the run ended")
    for e in st.queued + st.emb_running:
        if e.state == "running":
            st.pool.release_reservation(e.owner)
        st.reject_emb(e, "drain: unfinished when the run ended")
    res = st.result
    res.quota_limited += st.pool.cap_decisions
    res.makespan_s = now
    res.lost = sum(1 for r in st.llm if r.state not in ("done", "rejected")) + sum(
        1 for e in st.emb if e.state not in ("done", "rejected")
    )
