"""The engine side of LLM + embedding colocation (spec 004, issue 19): `ColocationController`
(engine_adapter.colocation) wired into the engine loop.

With ``colocation`` off (the default) nothing here runs and the engine behaves as it did
before. With ``dynamic`` or ``static:F``:

- admission (Algorithm 1, and sage's admission of embedding batches) on arrival: ADMIT queues
  the request; ADMIT_WITH_PREEMPTION preempts the named lower-priority requests first; DEFER
  holds it out of the scheduler and asks again each loop until its slack runs out, then admits
  or rejects it; REJECT answers 429 with the controller's reason;
- quotas (Algorithm 2) recomputed each ``quota_interval_s``: an embedding text reserves its
  workspace only within the embedding quota; the LLM class is charged every block its running
  sequences hold (the pool's referenced blocks, not the reservations: `llm_blocks_held`), so a
  new sequence is admitted, and a running one grows by a decode block, only within the LLM
  quota; past it a running sequence gives way (preempted by recompute). A dynamic quota lets
  each class always run one request, so that neither starves while the quota moves;
- static partitions (``static:F``) are hard: no request of a class is ever let past its part,
  the first one included, and a request that could never fit its part is refused on arrival
  (a 400 from `engine_adapter.serving.intake`);
- deadlines from real slack: a sequence's blocks get ``now + slack_s`` as `EntryMeta.deadline`,
  so the ``slo`` eviction policy ranks them by their request's SLO; preemption picks its victims
  with Algorithm 3 (`preemption_victims`), the policy's choice only when it protects them all.

Two parts, built in the order the engine needs them:

- `ColocationGates`, the scheduler's side: the quotas, deadlines and victims the scheduler asks
  for through its hooks (`EngineHooks` delegates to it). It needs the controller and the cache
  manager only, so it exists before the scheduler and is handed to it at construction.
- `EngineColocation`, the engine loop's side: admission on arrival, the deferred requests, the
  quotas' recomputation, shedding, and the stats. It reads the scheduler's queues (it never
  changes them; the engine does).

Time is the scheduler's monotonic clock for the controller, the cache's clock for deadlines.

Imports: the colocation controller, the cache manager, and this package's records.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.colocation import (
    LLMSLO,
    Admission,
    ColocationController,
    Decision,
    EmbeddingSLO,
    EmbeddingView,
    LLMView,
    MemoryState,
    Quota,
    parse_mode,
)
from engine_adapter.serving.embedding_batch import EmbeddingJob
from engine_adapter.serving.scheduler import Scheduler
from engine_adapter.serving.sequence import Sequence

__all__ = ["ColocationGates", "Deferred", "EngineColocation", "embedding_view", "llm_view", "memory_state"]


@dataclass(eq=False, slots=True)
class Deferred:
    """A request that admission deferred: asked again each loop until `until`."""

    item: Sequence | EmbeddingJob
    until: float


# ---- the controller's views of the engine's requests and pool ---------------------------------


def llm_view(seq: Sequence) -> LLMView:
    """A sequence as the controller sees it."""
    slo = LLMSLO(ttft_ms=seq.slo_ttft_ms or 1.0, tpot_ms=seq.slo_tpot_ms or 1.0)
    return LLMView(
        request_id=seq.request_id,
        arrival_s=seq.arrival,
        prompt_tokens=len(seq.prompt_ids),
        generated_tokens=len(seq.output_ids),
        max_tokens=seq.sampling.max_tokens,
        slo=slo,
        priority=seq.priority,
        first_token_s=seq.first_token_time,
        blocks=len(seq.block_table),
    )


def embedding_view(job: EmbeddingJob, block_size: int) -> EmbeddingView:
    """An embedding request as the controller sees it."""
    return EmbeddingView(
        request_id=job.request_id,
        arrival_s=job.arrival,
        tokens=job.num_tokens,
        slo=EmbeddingSLO(deadline_ms=max((job.deadline - job.arrival) * 1e3, 1e-3)),
        blocks=job.blocks(block_size),
        started_s=job.started,
    )


def memory_state(cache: CacheManager) -> MemoryState:
    """The pool as the controller sees it: reservations are the embeddings' use; free and
    reclaimable (cached, unreferenced) blocks are free; the rest is the LLM's."""
    reserved = cache.num_reserved_blocks
    free = cache.num_available_blocks
    return MemoryState(
        total_blocks=cache.num_blocks,
        used_llm_blocks=max(cache.num_blocks - free - reserved, 0),
        used_embedding_blocks=reserved,
        free_blocks=free,
    )


# ---- the scheduler's side: quotas, deadlines, victims -----------------------------------------


class ColocationGates:
    """What colocation decides inside the scheduler's step: quotas (Algorithm 2), deadlines
    from real slack, and preemption victims (Algorithm 3).

    Args:
        controller: The colocation controller over the engine's pool.
        cache: The engine's cache manager.
        clock: The scheduler's monotonic clock.
        slo_preemption: Whether Algorithm 3 picks preemption victims (False: the policy does).
    """

    def __init__(
        self,
        controller: ColocationController,
        cache: CacheManager,
        clock: Callable[[], float],
        *,
        slo_preemption: bool = True,
    ) -> None:
        self.controller = controller
        self.cache = cache
        self.clock = clock
        self.block_size = cache.block_size
        self.slo_preemption = slo_preemption

    @property
    def partition(self) -> Quota | None:
        """The static partition (``static:F``), hard for both classes; None with a dynamic quota."""
        return self.controller.quota if parse_mode(self.controller.mode) is not None else None

    def llm_blocks_held(self) -> int:
        """What the LLM class is charged now: every pool block in use but the embeddings'
        reservations (the running sequences' blocks, a shared prefix once, and pinned blocks)."""
        return memory_state(self.cache).used_llm_blocks

    def admits_embedding(self, job: EmbeddingJob, blocks: int) -> bool:
        """Whether `blocks` more reserved blocks stay within the embedding quota (with a dynamic
        quota one text may always run; a static partition is hard)."""
        reserved = self.cache.num_reserved_blocks
        if reserved == 0 and self.partition is None:
            return True
        return reserved + blocks <= self.controller.quota.embedding_blocks

    def admits_llm(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether `seq`'s blocks (all of them: a cached prefix is charged once it is locked)
        fit the LLM quota beside what the class holds (with a dynamic quota one sequence may
        always run; a static partition is hard)."""
        if not running and self.partition is None:
            return True
        need = math.ceil(seq.num_tokens / self.block_size)
        return self.llm_blocks_held() + need <= self.controller.quota.llm_blocks

    def admits_llm_growth(self, seq: Sequence, blocks: int, running: list[Sequence]) -> bool:
        """Whether running `seq` may take `blocks` more blocks (decode growth) within the LLM
        quota (with a dynamic quota a sequence running alone may always grow)."""
        if len(running) <= 1 and self.partition is None:
            return True
        return self.llm_blocks_held() + blocks <= self.controller.quota.llm_blocks

    def deadline_for(self, seq: Sequence) -> float:
        """The cache-clock deadline of `seq`'s blocks: now + its slack (deadline minus the time
        it still needs at its SLO's pace)."""
        now = self.clock()
        return self.cache.clock() + self.controller.slack_s(llm_view(seq), now)

    def choose_victims(
        self, running: list[Sequence], exclude: Set[int], blocks: int
    ) -> list[Sequence] | None:
        """Algorithm 3 over the running requests not in `exclude`; the eviction policy's choice
        when it protects every candidate (all nearly finished), so that a short pool still
        makes progress. None without ``slo_preemption``: the scheduler asks the policy."""
        if not self.slo_preemption:
            return None
        candidates = [s for s in running if s.seq_id not in exclude]
        if not candidates:
            return []
        by_id = {s.request_id: s for s in candidates}
        ids = self.controller.preemption_victims([llm_view(s) for s in candidates], blocks, self.clock())
        chosen = [by_id[i] for i in ids if i in by_id]
        if chosen:
            return chosen
        skip = {s.seq_id for s in running} - {s.seq_id for s in candidates}
        fallback = self.cache.select_preemption_victims(blocks, exclude=skip)
        by_seq = {s.seq_id: s for s in candidates}
        return [by_seq[i] for i in fallback if i in by_seq]


# ---- the engine loop's side: admission, deferral, quotas, stats -------------------------------


class EngineColocation:
    """Admission, the deferred requests, the quotas' recomputation and the stats, over the
    scheduler's queues.

    Args:
        gates: The scheduler's side (its controller is this side's too).
        scheduler: The engine's scheduler, whose queues the controller sees.
        admission: False: every request is admitted on arrival and nothing is shed.
    """

    def __init__(self, gates: ColocationGates, scheduler: Scheduler, *, admission: bool = True) -> None:
        self.gates = gates
        self.controller = gates.controller
        self.scheduler = scheduler
        self.block_size = gates.block_size
        self.admission = admission
        self.deferred: list[Deferred] = []
        self.decisions: dict[str, int] = {}

    @property
    def slo_preemption(self) -> bool:
        return self.gates.slo_preemption

    def memory(self) -> MemoryState:
        return memory_state(self.scheduler.cache)

    def _running_views(self) -> list[LLMView]:
        return [llm_view(s) for s in self.scheduler.running]

    def _embedding_views(self) -> list[EmbeddingView]:
        return [embedding_view(j, self.block_size) for j in self.scheduler.embeddings.queue]

    # ---- admission (Algorithm 1) -----------------------------------------------------------

    def count(self, kind: str, admission: Admission) -> None:
        """Count a decision in the stats (on arrival, and the final one of a deferred request)."""
        key = f"{kind}:{admission.decision.value}"
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def admit_llm(self, seq: Sequence, now: float, *, count: bool = True) -> Admission:
        """Algorithm 1 for `seq` now (`count`: in the stats' decisions)."""
        admission = (
            self.controller.admit_llm(
                llm_view(seq), now, self.memory(), self._running_views(), self._embedding_views()
            )
            if self.admission
            else Admission(Decision.ADMIT, "admission control off")
        )
        if count:
            self.count("llm", admission)
        return admission

    def admit_embedding(self, job: EmbeddingJob, now: float, *, count: bool = True) -> Admission:
        """sage's embedding admission for `job` now (`spec` admits every batch)."""
        admission = (
            self.controller.admit_embedding(
                embedding_view(job, self.block_size), now, self.memory(), self._embedding_views()
            )
            if self.admission
            else Admission(Decision.ADMIT, "admission control off")
        )
        if count:
            self.count("embedding", admission)
        return admission

    def defer_until(self, item: Sequence | EmbeddingJob, now: float) -> float:
        """How long a deferred request may wait: its slack (first-token deadline for an LLM
        request, its deadline less the learnt service time for an embedding batch)."""
        if isinstance(item, EmbeddingJob):
            view = embedding_view(item, self.block_size)
            return now + max(self.controller.embedding_slack_s(view, now), 0.0)
        assert item.slo_ttft_ms is not None
        return max(item.arrival + item.slo_ttft_ms / 1e3, now)

    def missed(self, now: float) -> list[tuple[Sequence | EmbeddingJob, str]]:
        """(sage only) Queued work that can no longer meet its SLO, with the reason: LLM
        requests still waiting for their first admission past their first-token deadline, and
        embedding batches not started past their deadline. The spec sheds no admitted work
        (issue 19's prototype: dropping it is most of what a baseline gains from admission)."""
        if self.controller.system != "sage" or not self.admission:
            return []
        out: list[tuple[Sequence | EmbeddingJob, str]] = []
        for seq in self.scheduler.waiting:
            if seq.num_preemptions or seq.first_token_time is not None or seq.slo_ttft_ms is None:
                continue
            late = now - (seq.arrival + seq.slo_ttft_ms / 1e3)
            if late > 0:
                out.append((seq, f"first-token deadline passed {late:.3f}s ago while queued"))
        for job in self.scheduler.embeddings.queue:
            if job.started is None and now > job.deadline:
                out.append((job, f"deadline passed {now - job.deadline:.3f}s ago while queued"))
        return out

    # ---- quotas (Algorithm 2) ----------------------------------------------------------------

    def update_quota(self, now: float) -> Quota:
        llm = [llm_view(s) for s in (*self.scheduler.running, *self.scheduler.waiting)]
        llm += [llm_view(d.item) for d in self.deferred if isinstance(d.item, Sequence)]
        embeddings = self._embedding_views()
        embeddings += [
            embedding_view(d.item, self.block_size) for d in self.deferred if isinstance(d.item, EmbeddingJob)
        ]
        return self.controller.update_quota(now, llm, embeddings)

    # ---- what the stats show -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ``colocation`` object of ``GET /v1/eviction/stats``."""
        quota = self.controller.quota
        memory = self.memory()
        llm_urgency, embedding_urgency = self.controller.last_urgency
        return {
            "mode": self.controller.mode,
            "system": self.controller.system,
            "admission": self.admission,
            "slo_preemption": self.slo_preemption,
            "quota": {"llm_blocks": quota.llm_blocks, "embedding_blocks": quota.embedding_blocks},
            "used": {
                "llm_blocks": memory.used_llm_blocks,
                "embedding_blocks": memory.used_embedding_blocks,
                "free_blocks": memory.free_blocks,
            },
            "urgency": {"llm": llm_urgency, "embedding": embedding_urgency},
            "decisions": dict(sorted(self.decisions.items())),
            "deferred": len(self.deferred),
            "embedding_queue": len(self.scheduler.embeddings.queue),
            "params": dataclasses.asdict(self.controller.params),
        }
