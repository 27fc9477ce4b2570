"""The state of one colocation run: the requests in flight, the queues, the pool and the quota.

`ColocationRun` is what every part of a run reads and changes (`llm.py`, `embeddings.py`,
`step.py`, `run.py`); it also gives the controller its views (`LLMView`, `EmbeddingView`,
`MemoryState`) and the LLM side its block cap. Imports the controller's records, the pool, the
systems and the workload; never the parts that drive the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.colocation import (
    LLMSLO,
    ColocationController,
    ColocationParams,
    EmbeddingSLO,
    EmbeddingView,
    LLMView,
    MemoryState,
    Quota,
)
from engine_adapter.sim.colocation.metrics import RunResult
from engine_adapter.sim.colocation.pool import ColocationPool
from engine_adapter.sim.colocation.systems import SystemSpec
from engine_adapter.sim.colocation.workload import (
    ColocationWorkload,
    EmbeddingCostModel,
    EmbeddingRequest,
    LLMRequest,
    PoolShape,
)
from engine_adapter.sim.cost_model import CostModel

__all__ = ["ColocationRun", "EmbeddingInFlight", "LLMInFlight"]


@dataclass(slots=True, eq=False)
class LLMInFlight:
    """An LLM request of the run and its progress (its blocks are the pool's, under `sid`)."""

    req: LLMRequest
    slo: LLMSLO
    sid: int  # its sequence id in the pool: its index in the workload
    state: str = "waiting"  # waiting, running, done, rejected
    need: int = 0  # tokens to prefill in the current admission
    computed: int = 0
    generated: int = 0
    blocks: int = 0  # blocks it holds in the pool (the pool's count, kept here for the step loop)
    hit_tokens: int = 0  # prompt tokens the current admission found cached
    first_token_s: float | None = None
    finish_s: float | None = None
    reason: str = ""
    deferred: bool = False
    preemptions: int = 0


@dataclass(slots=True, eq=False)
class EmbeddingInFlight:
    """An embedding batch of the run and its progress (its workspace is a pool reservation)."""

    req: EmbeddingRequest
    slo: EmbeddingSLO
    owner: int  # its reservation's owner in the pool: its index in the workload
    work_s: float
    padded: int
    state: str = "queued"  # queued, running, done, rejected
    remaining_s: float = 0.0
    blocks: int = 0
    started_s: float | None = None
    finish_s: float | None = None
    reason: str = ""


class ColocationRun:
    """One system on one workload (see `engine_adapter.sim.colocation.run`).

    Args:
        workload: The requests.
        system: The system's row.
        compute: ``"shared"`` or ``"split"``.
        cost: LLM step times.
        embedding_cost: Embedding batch times and workspaces.
        pool: The pool's shape.
        params: The controller's constants.
        policy: The pool's eviction policy (a registry spec).
    """

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
        policy: str,
    ) -> None:
        self.system = system
        self.compute = compute
        self.cost = cost
        self.ecost = embedding_cost
        self.shape = pool
        self.params = params
        self.now = 0.0  # the virtual clock (the pool's cache reads it too)
        self.total = pool.total_blocks
        self.bs = pool.block_size
        self.chunked = system.chunked and compute == "shared"
        self.pool = ColocationPool(pool, policy, self._clock)
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
        self.llm = [LLMInFlight(r, LLMSLO(r.ttft_ms, r.tpot_ms), i) for i, r in enumerate(workload.llm)]
        self.emb = [
            EmbeddingInFlight(
                e,
                EmbeddingSLO(e.deadline_ms),
                i,
                embedding_cost.batch_time(e.tokens, e.square_tokens),
                e.texts * e.max_text_tokens,
            )
            for i, e in enumerate(workload.embeddings)
        ]
        self.waiting: list[LLMInFlight] = []
        self.running: list[LLMInFlight] = []
        self.queued: list[EmbeddingInFlight] = []
        self.emb_running: list[EmbeddingInFlight] = []
        self.result = RunResult(system.name, total_blocks=self.total)
        self.emb_turn = False
        self.last_arrival = max(
            [r.arrival_s for r in workload.llm] + [e.arrival_s for e in workload.embeddings] + [0.0]
        )

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ memory

    @property
    def quota(self) -> Quota:
        """The quota now: the controller's, or the system's fixed partition."""
        return self.controller.quota if self.controller is not None else self._static

    def llm_cap(self) -> int:
        """Blocks the LLM side may hold: its quota, or (borrowing) all that embeddings neither
        hold nor wait for within their quota."""
        quota = self.quota
        if not self.system.borrow:
            return quota.llm_blocks
        emb_used = self.pool.embedding_used
        waiting = sum(self.blocks_for(e) for e in self.queued)
        reserve = min(max(0, quota.embedding_blocks - emb_used), waiting)
        return max(quota.llm_blocks, self.total - emb_used - reserve)

    def blocks_for(self, e: EmbeddingInFlight) -> int:
        """Workspace blocks of a batch (of one chunk, when embeddings run chunked)."""
        padded = e.padded
        if self.chunked:
            padded = min(padded, self.params.embedding_chunk_tokens)
        return self.ecost.workspace_blocks(padded)

    def memory(self) -> MemoryState:
        """The pool as the controller sees it."""
        return self.pool.memory()

    def track_peak(self) -> None:
        """Record the pool's use now in the peak (never above the pool: the tests check it)."""
        self.result.peak_used_blocks = max(self.result.peak_used_blocks, self.pool.used)

    # ------------------------------------------------------------------ views

    def llm_view(self, r: LLMInFlight) -> LLMView:
        """The controller's view of an LLM request."""
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
            r.blocks,
        )

    def emb_view(self, e: EmbeddingInFlight) -> EmbeddingView:
        """The controller's view of an embedding batch."""
        q = e.req
        return EmbeddingView(q.request_id, q.arrival_s, q.tokens, e.slo, e.blocks, e.started_s)

    # ------------------------------------------------------------------ outcomes

    def reject_llm(self, r: LLMInFlight, reason: str) -> None:
        """End an LLM request unserved, counting its reason."""
        r.state, r.reason = "rejected", reason
        self.result.llm_rejected += 1
        self._count_reason(reason)

    def reject_emb(self, e: EmbeddingInFlight, reason: str) -> None:
        """End an embedding batch unserved, counting its reason."""
        e.state, e.reason = "rejected", reason
        self.result.embedding_rejected += 1
        self._count_reason(reason)

    def _count_reason(self, reason: str) -> None:
        key = reason.split(":")[0]
        self.result.reasons[key] = self.result.reasons.get(key, 0) + 1
