"""The colocation simulator: LLM requests and embedding batches on one block pool (issue 19).

One run replays a `ColocationWorkload` through one *system* on a virtual clock:

- The LLM engine is vLLM-like: continuous batching, chunked prefill (`PoolShape.max_prefill_tokens`
  per step), KV blocks allocated as prompts are admitted and outputs grow, recompute
  preemption when a block cannot be had. Step times come from `CostModel`. A prompt's shared
  prefix (one of 16 system-prompt templates) stays cached in the pool after its requests finish
  and is evicted least recently used when memory is needed: that is the KV hit rate.
- Embedding batches reserve their activation workspace in the same pool while they run
  (`EmbeddingCostModel`). Compute is `shared` (one engine alternates LLM steps and embedding
  forwards, or, chunked, fuses embedding chunks into the LLM steps) or `split` (the batches run
  on their own device; only memory is shared).

A system (`SystemSpec`, `SYSTEMS`) is a partition of the pool (none, static, dynamic), whether the
`ColocationController` runs Algorithms 1 and 3, whether work that can no longer meet its SLO
is dropped, and how embedding batches are ordered and run. `run_colocation` returns a
`RunResult` with the per-class metrics (`metrics`) and the quota trace.

Invariants the tests check: the pool is never over-committed (`peak_used_blocks <= total`),
every request ends finished or rejected with a reason, the same seed gives the same result.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

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
)
from engine_adapter.sim.colocation_workload import (
    ColocationWorkload,
    EmbeddingCostModel,
    EmbeddingRequest,
    LLMRequest,
    PoolShape,
)
from engine_adapter.sim.cost_model import CostModel

__all__ = ["DEFAULT_SYSTEMS", "SYSTEMS", "RunResult", "SystemSpec", "run_colocation"]

_DRAIN_S = 120.0  # after the last arrival, work still unfinished this much later is rejected
_EPS_S = 1e-9  # work left below this is done (float rounding of the virtual clock)
_ADMISSION_LOOKAHEAD = 64  # waiting LLM requests Algorithm 1 looks at per step
_TPOT_SHARE = 0.9  # chunked embeddings keep each decoding request's mean TPOT within this share


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """One colocation system of the comparison.

    Attributes:
        name: Its row name.
        partition: ``"none"`` (one shared pool, no quotas), ``"static:F"`` (LLM share F) or
            ``"dynamic"`` (Algorithm 2).
        controller: ``"spec"``, ``"sage"`` or None (a baseline without the controller).
        alg1: Algorithm 1 admits LLM requests (else first come, first served).
        alg3: Algorithm 3 picks preemption victims (else the latest arrival, as vLLM does).
        deadline_drop: Queued work that can no longer meet its SLO is dropped with a reason.
        edf: Embedding batches run one at a time, earliest deadline first (else all that fit
            run together, first come first served).
        chunked: Under shared compute, embedding work runs in chunks fused into LLM steps.
        embedding_admission: The controller admits embedding batches (fit and deadline).
        borrow: The LLM side may hold blocks of the embedding quota that no embedding batch
            uses or waits for; a batch that needs them back preempts (work-conserving quotas).
    """

    name: str
    partition: str
    controller: str | None = None
    alg1: bool = False
    alg3: bool = False
    deadline_drop: bool = False
    edf: bool = False
    chunked: bool = False
    embedding_admission: bool = False
    borrow: bool = False


def _systems() -> dict[str, SystemSpec]:
    rows = [
        SystemSpec("static-50/50", "static:0.5"),
        SystemSpec("static-80/20", "static:0.8"),
        SystemSpec("shared-lru", "none"),
        SystemSpec("static-50/50+adm", "static:0.5", deadline_drop=True),
        SystemSpec("static-80/20+adm", "static:0.8", deadline_drop=True),
        SystemSpec("shared-lru+adm", "none", deadline_drop=True),
        SystemSpec("spec", "dynamic", "spec", alg1=True, alg3=True),
        SystemSpec("spec-no-alg1", "dynamic", "spec", alg1=False, alg3=True),
        SystemSpec("spec-no-alg2", "static:0.7", "spec", alg1=True, alg3=True),
        SystemSpec("spec-no-alg3", "dynamic", "spec", alg1=True, alg3=False),
    ]
    sage = {"deadline_drop": True, "edf": True, "chunked": True, "embedding_admission": True, "borrow": True}
    rows += [
        SystemSpec("sage", "dynamic", "sage", alg1=True, alg3=True, **sage),
        SystemSpec("sage-no-alg1", "dynamic", "sage", alg1=False, alg3=True, **sage),
        SystemSpec("sage-no-alg2", "static:0.7", "sage", alg1=True, alg3=True, **sage),
        SystemSpec("sage-no-alg3", "dynamic", "sage", alg1=True, alg3=False, **sage),
    ]
    return {row.name: row for row in rows}


SYSTEMS: dict[str, SystemSpec] = _systems()
DEFAULT_SYSTEMS = tuple(SYSTEMS)


@dataclass(slots=True)
class _LLM:
    req: LLMRequest
    slo: LLMSLO
    state: str = "waiting"  # waiting, running, done, rejected
    need: int = 0  # tokens to prefill in the current admission
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    pinned: bool = False
    hit: bool = False
    first_token_s: float | None = None
    finish_s: float | None = None
    reason: str = ""
    deferred: bool = False
    preemptions: int = 0


@dataclass(slots=True)
class _Emb:
    req: EmbeddingRequest
    slo: EmbeddingSLO
    work_s: float
    padded: int
    state: str = "queued"  # queued, running, done, rejected
    remaining_s: float = 0.0
    blocks: int = 0
    started_s: float | None = None
    finish_s: float | None = None
    reason: str = ""


@dataclass(slots=True)
class RunResult:
    """One system on one workload: the counts and latencies the metrics are computed from."""

    system: str
    llm_total: int = 0
    llm_met: int = 0
    llm_finished: int = 0
    llm_rejected: int = 0
    llm_deferred: int = 0
    embedding_total: int = 0
    embedding_met: int = 0
    embedding_finished: int = 0
    embedding_rejected: int = 0
    preemptions: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    embedding_latency_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    embedding_tokens: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    makespan_s: float = 0.0
    peak_used_blocks: int = 0
    total_blocks: int = 0
    quota_trace: list[tuple[float, int]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    lost: int = 0  # requests that ended neither finished nor rejected (must stay 0)


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def metrics(result: RunResult, alpha: float = 0.5, beta: float = 0.5, gamma: float = 0.0) -> dict[str, float]:
    """The row of one run: latencies (ms), attainment per class, the spec's objective, throughput.

    Attainment counts every arrived request (a rejected one missed its SLO). The objective is
    ``alpha * LLM attainment + beta * embedding attainment + gamma * completion ratio`` (the
    spec's throughput term, normalised to the offered requests so that the three are
    commensurable). `combined` is the equal-weight attainment the issue's targets use.
    """
    llm_att = result.llm_met / result.llm_total if result.llm_total else 1.0
    emb_att = result.embedding_met / result.embedding_total if result.embedding_total else 1.0
    total = result.llm_total + result.embedding_total
    finished = result.llm_finished + result.embedding_finished
    completion = finished / total if total else 1.0
    span = max(result.makespan_s, 1e-9)
    return {
        "llm_ttft_p99_ms": 1000 * _p99(result.ttft_s),
        "llm_tpot_p99_ms": 1000 * _p99(result.tpot_s),
        "embedding_p99_ms": 1000 * _p99(result.embedding_latency_s),
        "llm_attainment": llm_att,
        "embedding_attainment": emb_att,
        "combined_attainment": (llm_att + emb_att) / 2,
        "objective": alpha * llm_att + beta * emb_att + gamma * completion,
        "throughput_rps": finished / span,
        "output_tokens_per_s": result.output_tokens / span,
        "kv_hit_rate": result.hit_tokens / result.prompt_tokens if result.prompt_tokens else 0.0,
        "rejected": float(result.llm_rejected + result.embedding_rejected),
        "deferred": float(result.llm_deferred),
        "preemptions": float(result.preemptions),
    }


class _Run:
    """The state of one run (see the module docstring); `run` drives it to the end."""

    def __init__(
        self,
        workload: ColocationWorkload,
        system: SystemSpec,
        *,
        compute: str,
        cost: CostModel,
        embedding_cost: EmbeddingCostModel,
        pool: PoolShape,
        params: ColocationParams,
    ) -> None:
        self.system = system
        self.compute = compute
        self.cost = cost
        self.ecost = embedding_cost
        self.pool = pool
        self.params = params
        self.total = pool.total_blocks
        self.bs = pool.block_size
        self.chunked = system.chunked and compute == "shared"
        self.controller: ColocationController | None = None
        if system.controller is not None:
            self.controller = ColocationController(
                self.total, self.bs, params, system.partition, system=system.controller
            )
        if system.partition == "none":
            self._static = Quota(self.total, self.total)
        elif system.partition.startswith("static:") and self.controller is None:
            llm = round(self.total * float(system.partition.split(":")[1]))
            self._static = Quota(llm, self.total - llm)
        self.llm = [_LLM(r, LLMSLO(r.ttft_ms, r.tpot_ms)) for r in workload.llm]
        self.emb = [
            _Emb(
                e,
                EmbeddingSLO(e.deadline_ms),
                embedding_cost.batch_time(e.tokens, e.square_tokens),
                e.texts * e.max_text_tokens,
            )
            for e in workload.embeddings
        ]
        self.waiting: list[_LLM] = []
        self.running: list[_LLM] = []
        self.queued: list[_Emb] = []
        self.emb_running: list[_Emb] = []
        self.llm_own = 0
        self.emb_used = 0
        self.template_blocks = math.ceil(workload.llm[0].prefix_tokens / self.bs) if workload.llm else 0
        self.templates: OrderedDict[int, int] = OrderedDict()  # resident template -> pins, LRU order
        self.result = RunResult(system.name, total_blocks=self.total)
        self.emb_turn = False
        self.last_arrival = max(
            [r.arrival_s for r in workload.llm] + [e.arrival_s for e in workload.embeddings] + [0.0]
        )

    # ------------------------------------------------------------------ memory

    @property
    def quota(self) -> Quota:
        return self.controller.quota if self.controller is not None else self._static

    def _resident(self) -> int:
        return len(self.templates) * self.template_blocks

    def _pinned(self) -> int:
        return sum(1 for pins in self.templates.values() if pins) * self.template_blocks

    def _free(self) -> int:
        return self.total - self.llm_own - self._resident() - self.emb_used

    def _evict_cached(self, blocks: int) -> bool:
        """Free `blocks` physical blocks by evicting unpinned cached prefixes, LRU first."""
        while self._free() < blocks:
            victim = next((t for t, pins in self.templates.items() if pins == 0), None)
            if victim is None:
                return False
            del self.templates[victim]
        return True

    def _llm_cap(self) -> int:
        """Blocks the LLM side may hold: its quota, or (borrowing) all that embeddings neither
        hold nor wait for within their quota."""
        quota = self.quota
        if not self.system.borrow:
            return quota.llm_blocks
        waiting = sum(self._blocks_for(e) for e in self.queued)
        reserve = min(max(0, quota.embedding_blocks - self.emb_used), waiting)
        return max(quota.llm_blocks, self.total - self.emb_used - reserve)

    def _llm_fits(self, blocks: int) -> bool:
        """Take `blocks` for the LLM side if its quota and the pool allow (evicting cached prefixes)."""
        cap = self._llm_cap()
        if self.llm_own + self._pinned() + blocks > cap:
            return False
        if self.llm_own + self._resident() + blocks > cap:
            # Cached prefixes beyond the quota give way first.
            while self.templates and self.llm_own + self._resident() + blocks > cap:
                victim = next((t for t, pins in self.templates.items() if pins == 0), None)
                if victim is None:
                    break
                del self.templates[victim]
        return self._evict_cached(blocks)

    def _memory(self) -> MemoryState:
        used_llm = self.llm_own + self._resident()
        return MemoryState(self.total, used_llm, self.emb_used, self.total - used_llm - self.emb_used)

    def _track_peak(self) -> None:
        used = self.llm_own + self._resident() + self.emb_used
        self.result.peak_used_blocks = max(self.result.peak_used_blocks, used)

    # ------------------------------------------------------------------ views

    def _llm_view(self, r: _LLM) -> LLMView:
        q = r.req
        return LLMView(
            q.request_id,
            q.arrival_s,
            q.prompt_tokens,
            r.generated,
            q.max_tokens,
            r.slo,
            q.priority,
            r.first_token_s,
            r.blocks + (self.template_blocks if r.pinned else 0),
        )

    def _emb_view(self, e: _Emb) -> EmbeddingView:
        q = e.req
        return EmbeddingView(q.request_id, q.arrival_s, q.tokens, e.slo, e.blocks, e.started_s)

    # ------------------------------------------------------------------ LLM lifecycle

    def _reject_llm(self, r: _LLM, reason: str) -> None:
        r.state, r.reason = "rejected", reason
        self.result.llm_rejected += 1
        key = reason.split(":")[0]
        self.result.reasons[key] = self.result.reasons.get(key, 0) + 1

    def _admit(self, r: _LLM) -> bool:
        """Allocate the prompt's blocks (and its prefix, when not cached); False when they do not fit."""
        q = r.req
        hit = q.template in self.templates
        if hit:  # pinned first, so that making room never evicts the prefix it is about to use
            self.templates[q.template] += 1
        own_tokens = q.prompt_tokens - q.prefix_tokens + r.generated
        own_blocks = math.ceil((own_tokens + 1) / self.bs)  # room for the token the prefill produces
        if not self._llm_fits(own_blocks + (0 if hit else self.template_blocks)):
            if hit:
                self.templates[q.template] -= 1
            return False
        if not hit:
            self.templates[q.template] = 1
        self.templates.move_to_end(q.template)
        r.pinned, r.hit = True, hit
        r.blocks = own_blocks
        self.llm_own += r.blocks
        r.need = own_tokens if hit else q.prompt_tokens + r.generated
        r.computed = 0
        r.state = "running"
        self.result.prompt_tokens += q.prompt_tokens
        self.result.hit_tokens += q.prefix_tokens if hit else 0
        self.running.append(r)
        self._track_peak()
        return True

    def _release(self, r: _LLM) -> None:
        self.llm_own -= r.blocks
        r.blocks = 0
        if r.pinned:
            self.templates[r.req.template] -= 1
            r.pinned = False

    def _preempt(self, r: _LLM) -> None:
        self._release(r)
        self.running.remove(r)
        r.state, r.computed, r.need = "waiting", 0, 0
        r.preemptions += 1
        self.result.preemptions += 1
        self.waiting.insert(0, r)

    def _victims(self, candidates: list[_LLM], blocks: int, now: float) -> list[_LLM]:
        """Algorithm 3 (with the controller and alg3) or the latest arrivals first (vLLM)."""
        if self.system.alg3 and self.controller is not None:
            by_id = {r.req.request_id: r for r in candidates}
            ids = self.controller.preemption_victims([self._llm_view(r) for r in candidates], blocks, now)
            return [by_id[i] for i in ids]
        chosen, freed = [], 0
        for r in sorted(candidates, key=lambda r: (r.req.priority, -r.req.arrival_s)):
            if freed >= blocks:
                break
            chosen.append(r)
            freed += r.blocks
        return chosen

    def _finish_llm(self, r: _LLM, now: float) -> None:
        self._release(r)
        r.state, r.finish_s = "done", now
        q = r.req
        res = self.result
        res.llm_finished += 1
        res.output_tokens += q.output_tokens
        assert r.first_token_s is not None
        ttft = r.first_token_s - q.arrival_s
        tpot = (now - r.first_token_s) / (q.output_tokens - 1) if q.output_tokens > 1 else 0.0
        res.ttft_s.append(ttft)
        res.tpot_s.append(tpot)
        if ttft <= q.ttft_ms / 1000 + 1e-9 and tpot <= q.tpot_ms / 1000 + 1e-9:
            res.llm_met += 1
        if self.controller is not None:
            self.controller.observe_llm_finished(q.prompt_tokens, q.output_tokens)

    def _schedule_llm(self, now: float) -> None:
        if self.system.deadline_drop:
            for r in [r for r in self.waiting if r.first_token_s is None]:
                if now > r.req.arrival_s + r.req.ttft_ms / 1000:
                    self.waiting.remove(r)
                    self._reject_llm(r, "deadline: first-token deadline passed while queued")
        if not (self.system.alg1 and self.controller is not None):
            while self.waiting and len(self.running) < self.pool.max_running:
                if not self._admit(self.waiting[0]):
                    break
                self.waiting.pop(0)
            return
        controller = self.controller
        queue_views = [self._emb_view(e) for e in self.queued]
        for r in list(self.waiting[:_ADMISSION_LOOKAHEAD]):
            if len(self.running) >= self.pool.max_running:
                break
            if r.preemptions:  # already admitted once: Algorithm 1 does not judge it again
                if not self._admit(r):
                    break
                self.waiting.remove(r)
                continue
            running_views = [self._llm_view(x) for x in self.running]
            decision = controller.admit_llm(
                self._llm_view(r), now, self._memory(), running_views, queue_views
            )
            if decision.decision is Decision.REJECT:
                self.waiting.remove(r)
                self._reject_llm(r, f"alg1: {decision.reason}")
                continue
            if decision.decision is Decision.DEFER:
                if not r.deferred:
                    r.deferred = True
                    self.result.llm_deferred += 1
                continue
            if decision.decision is Decision.ADMIT_WITH_PREEMPTION:
                by_id = {x.req.request_id: x for x in self.running}
                for rid in decision.preempt:
                    if rid in by_id:
                        self._preempt(by_id[rid])
            if not self._admit(r):
                break
            self.waiting.remove(r)

    # ------------------------------------------------------------------ embeddings

    def _reject_emb(self, e: _Emb, reason: str) -> None:
        e.state, e.reason = "rejected", reason
        self.result.embedding_rejected += 1
        key = reason.split(":")[0]
        self.result.reasons[key] = self.result.reasons.get(key, 0) + 1

    def _arrive_emb(self, e: _Emb, now: float) -> None:
        self.result.embedding_total += 1
        if self.controller is not None:
            self.controller.observe_embedding_arrival(now, self._blocks_for(e))
        if self.system.embedding_admission and self.controller is not None:
            view = EmbeddingView(
                e.req.request_id, e.req.arrival_s, e.req.tokens, e.slo, self._blocks_for(e), None
            )
            queue = [self._emb_view(x) for x in self.queued + self.emb_running]
            decision = self.controller.admit_embedding(view, now, self._memory(), queue)
            if decision.decision is Decision.REJECT:
                self._reject_emb(e, f"embedding admission: {decision.reason}")
                return
        self.queued.append(e)

    def _blocks_for(self, e: _Emb) -> int:
        padded = e.padded
        if self.chunked:
            padded = min(padded, self.params.embedding_chunk_tokens)
        return self.ecost.workspace_blocks(padded)

    def _start_embeddings(self, now: float) -> None:
        if self.system.deadline_drop:
            for e in list(self.queued):
                if now + e.work_s > e.req.arrival_s + e.req.deadline_ms / 1000:
                    self.queued.remove(e)
                    self._reject_emb(e, "deadline: cannot finish before its deadline")
        if self.controller is not None:
            order = {
                v.request_id: i
                for i, v in enumerate(
                    self.controller.embedding_order([self._emb_view(e) for e in self.queued], now)
                )
            }
            self.queued.sort(key=lambda e: order[e.req.request_id])
        while self.queued:
            if self.system.edf and self.emb_running:
                return  # one batch at a time, in deadline order
            e = self.queued[0]
            blocks = self._blocks_for(e)
            within = self.emb_used + blocks <= self.quota.embedding_blocks or not self.emb_running
            if not within:
                return
            if not self._evict_cached(blocks):
                if self.controller is None or self.system.partition.startswith("static"):
                    return
                # Dynamic quota: the LLM side gives back what it holds beyond its quota.
                over = self.llm_own + self._pinned() - self.quota.llm_blocks
                short = blocks - self._free()
                if over <= 0:
                    return
                for victim in self._victims(list(self.running), min(over, short), now):
                    self._preempt(victim)
                if not self._evict_cached(blocks):
                    return
            self.queued.pop(0)
            e.state, e.started_s, e.blocks, e.remaining_s = "running", now, blocks, e.work_s
            self.emb_used += blocks
            self.emb_running.append(e)
            self._track_peak()

    def _finish_emb(self, e: _Emb, now: float) -> None:
        self.emb_used -= e.blocks
        self.emb_running.remove(e)
        e.state, e.finish_s, e.blocks = "done", now, 0
        res = self.result
        res.embedding_finished += 1
        res.embedding_tokens += e.req.tokens
        latency = now - e.req.arrival_s
        res.embedding_latency_s.append(latency)
        if latency <= e.req.deadline_ms / 1000 + 1e-9:
            res.embedding_met += 1
        if self.controller is not None and e.started_s is not None:
            self.controller.observe_embedding_finished(e.req.tokens, now - e.started_s)

    def _advance_split(self, start: float, dt: float) -> None:
        """The embedding device over [start, start + dt]: one EDF batch, or all running shared equally."""
        t = start
        while self.emb_running:
            active = self.emb_running[:1] if self.system.edf else list(self.emb_running)
            n = len(active)
            least = min(e.remaining_s for e in active)
            if least * n <= dt + _EPS_S:
                t += least * n
                dt -= least * n
                for e in active:
                    e.remaining_s -= least
                for e in [e for e in active if e.remaining_s <= _EPS_S]:
                    self._finish_emb(e, t)
            else:
                for e in active:
                    e.remaining_s -= dt / n
                break

    def _next_split_completion(self) -> float:
        if not self.emb_running:
            return math.inf
        active = self.emb_running[:1] if self.system.edf else self.emb_running
        return min(e.remaining_s for e in active) * len(active)

    # ------------------------------------------------------------------ the loop

    def run(self) -> RunResult:
        llm_arrivals = sorted(self.llm, key=lambda r: r.req.arrival_s)
        emb_arrivals = sorted(self.emb, key=lambda e: e.req.arrival_s)
        li = ei = 0
        now = 0.0
        res = self.result
        res.llm_total = len(self.llm)
        end = self.last_arrival + _DRAIN_S
        while True:
            while li < len(llm_arrivals) and llm_arrivals[li].req.arrival_s <= now:
                self.waiting.append(llm_arrivals[li])
                li += 1
            while ei < len(emb_arrivals) and emb_arrivals[ei].req.arrival_s <= now:
                self._arrive_emb(emb_arrivals[ei], now)
                ei += 1
            if self.controller is not None:
                before = self.controller.quota.llm_blocks
                self.controller.update_quota(
                    now,
                    [self._llm_view(r) for r in self.waiting + self.running],
                    [self._emb_view(e) for e in self.queued + self.emb_running],
                )
                if not res.quota_trace or self.controller.quota.llm_blocks != before:
                    res.quota_trace.append((now, self.controller.quota.llm_blocks))
            self._schedule_llm(now)
            self._start_embeddings(now)
            if now > end:
                break
            duration = self._step(now)
            if duration <= 0:
                upcoming = [
                    llm_arrivals[li].req.arrival_s if li < len(llm_arrivals) else math.inf,
                    emb_arrivals[ei].req.arrival_s if ei < len(emb_arrivals) else math.inf,
                ]
                if self.compute == "split":
                    upcoming.append(now + self._next_split_completion())
                nxt = min(upcoming)
                if nxt == math.inf:
                    if self.waiting or self.queued:
                        # Nothing runs and nothing will arrive: what waits cannot be placed.
                        for r in list(self.waiting):
                            self.waiting.remove(r)
                            self._reject_llm(r, "capacity: does not fit the pool")
                        for e in list(self.queued):
                            self.queued.remove(e)
                            self._reject_emb(e, "capacity: does not fit the pool")
                    break
                target = max(nxt, now + 1e-9)
                if self.compute == "split":
                    self._advance_split(now, target - now)
                now = target
                continue
            if self.compute == "split":
                self._advance_split(now, duration)
            now += duration
            self._after_step(now)
        for r in self.waiting + self.running:
            self._release(r) if r.state == "running" else None
            self._reject_llm(r, "drain: unfinished when the run ended")
        for e in self.queued + self.emb_running:
            self._reject_emb(e, "drain: unfinished when the run ended")
        res.makespan_s = now
        res.lost = sum(1 for r in self.llm if r.state not in ("done", "rejected")) + sum(
            1 for e in self.emb if e.state not in ("done", "rejected")
        )
        return res

    def _step(self, now: float) -> float:
        """Plan and time one engine iteration; the token progress is applied by `_after_step`."""
        self._plan: list[tuple[_LLM, int]] = []
        self._emb_plan: list[tuple[_Emb, float]] = []
        if (
            self.compute == "shared"
            and not self.chunked
            and self.emb_running
            and (self.emb_turn or not self.running)
        ):
            # Unchunked: LLM iterations alternate with whole embedding forwards (all running
            # batches in one forward).
            self.emb_turn = False
            self._emb_plan = [(e, e.remaining_s) for e in self.emb_running]
            return sum(e.remaining_s for e in self.emb_running)
        self.emb_turn = True
        budget = self.pool.max_prefill_tokens
        prefill_tokens = prefill_batch = cached = decode_batch = context = 0
        for r in list(self.running):
            if r.state != "running":
                continue
            if r.computed < r.need:
                if budget <= 0:
                    continue
                chunk = min(budget, r.need - r.computed)
                budget -= chunk
                prefill_tokens += chunk
                prefill_batch += 1
                cached += r.computed + (r.req.prefix_tokens if r.hit else 0)
                self._plan.append((r, chunk))
            else:
                # The next token may need a new block.
                tokens = r.req.prompt_tokens - r.req.prefix_tokens + r.generated + 1
                if math.ceil(tokens / self.bs) > r.blocks:
                    if not self._llm_fits(1):
                        others = [x for x in self.running if x is not r and x.state == "running"]
                        victims = self._victims(others, 1, now)
                        for v in victims:
                            self._preempt(v)
                            self._plan = [(x, c) for x, c in self._plan if x is not v]
                        if not self._llm_fits(1):
                            self._preempt(r)
                            continue
                    r.blocks += 1
                    self.llm_own += 1
                    self._track_peak()
                decode_batch += 1
                context += r.req.prompt_tokens + r.generated
                self._plan.append((r, 0))
        llm_time = self.cost.step_time(
            prefill_tokens=prefill_tokens,
            prefill_batch=prefill_batch,
            cached_tokens=cached,
            decode_batch=decode_batch,
            context_tokens=context,
        )
        if self.compute == "split" or not self.emb_running:
            return llm_time
        if self.chunked:
            head = self.emb_running[0]
            per_token = self.ecost.per_token_s
            if llm_time <= 0:
                give = self.params.embedding_chunk_tokens * per_token
            else:
                # The step may grow while every decoding request's mean TPOT stays within
                # TPOT_SHARE of its objective (TPOT holds), and by half at least (embeddings progress).
                give = 0.5 * llm_time
                if decode_batch:
                    headroom = min(
                        _TPOT_SHARE * r.req.tpot_ms / 1000 * r.generated - (now - (r.first_token_s or now))
                        for r, c in self._plan
                        if c == 0
                    )
                    give = max(give, headroom - llm_time)
                    # And at least the pace at which every batch still meets its deadline, in
                    # EDF order: chunks of `give` beside steps of `llm_time` finish W of work
                    # within T when give >= W * llm_time / (T - W), W the work due by then.
                    work = 0.0
                    for e in [head, *self.queued]:
                        work += e.remaining_s if e is head else e.work_s
                        left = e.req.arrival_s + e.req.deadline_ms / 1000 - now
                        if left > work:
                            give = max(give, work * llm_time / (left - work))
                        elif left > 0:  # at risk even at full pace: the largest chunk
                            give = math.inf
                else:
                    give = max(give, self.params.embedding_chunk_tokens * per_token)
            give = min(give, head.remaining_s, self.params.embedding_chunk_tokens * per_token)
            self._emb_plan = [(head, give)]
            return llm_time + give
        return llm_time

    def _after_step(self, now: float) -> None:
        for r, chunk in self._plan:
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
                self.running.remove(r)
                self._finish_llm(r, now)
        for e, work in self._emb_plan:
            e.remaining_s -= work
            if e.remaining_s <= _EPS_S and e.state == "running":
                self._finish_emb(e, now)
        self._plan, self._emb_plan = [], []


def run_colocation(
    workload: ColocationWorkload,
    system: SystemSpec | str,
    *,
    compute: str = "shared",
    cost: CostModel | None = None,
    embedding_cost: EmbeddingCostModel | None = None,
    pool: PoolShape | None = None,
    params: ColocationParams | None = None,
) -> RunResult:
    """Replay `workload` through `system` (a `SystemSpec` or a name in `SYSTEMS`).

    Raises:
        ValueError: An unknown system name or compute mode.
    """
    if isinstance(system, str):
        if system not in SYSTEMS:
            raise ValueError(f"unknown colocation system {system!r}; systems: {', '.join(SYSTEMS)}")
        system = SYSTEMS[system]
    if compute not in ("shared", "split"):
        raise ValueError(f"compute must be shared or split, got {compute!r}")
    return _Run(
        workload,
        system,
        compute=compute,
        cost=cost or CostModel(),
        embedding_cost=embedding_cost or EmbeddingCostModel(),
        pool=pool or PoolShape(),
        params=params or ColocationParams(),
    ).run()
