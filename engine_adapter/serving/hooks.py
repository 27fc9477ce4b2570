"""What the scheduler asks its owner and tells it: `SchedulerHooks`, handed to `Scheduler(...)` once.

The scheduler decides admission, reservation and preemption itself, but a few of those decisions,
and the news of every request that starts or ends, belong to whoever runs it: the engine's
metrics, its lifetime prediction, and colocation's quotas, deadlines and victims. They reach the
scheduler as one object given at construction, never as attributes set on it afterwards:

    events     on_admitted, on_finished, on_embedding_finished, on_batch_change
    questions  estimate_lifetime, deadline_for, admits_llm, admits_llm_growth, admits_embedding,
               choose_victims

`SchedulerHooks` is a protocol: the engine's implementation is
`engine_adapter.serving.engine_hooks.EngineHooks`, and `NoHooks` (the default) answers each
question as the scheduler would alone and ignores every event. The parts the scheduler drives
rather than asks, adaptive batching (`AdaptiveBatch`) and token-level eviction
(`TokenCacheManager`), are constructor arguments of `Scheduler` beside the hooks.

Every hook runs in the engine loop's thread with the cache manager's lock held (the scheduler
is not thread-safe); a question is asked in the middle of a decision, so it must not change the
scheduler's queues.

Imports: the scheduler's records and the embedding records only.
"""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine_adapter.cache.adaptive_batch import BatchChange
    from engine_adapter.serving.embedding_batch import EmbeddingJob, EmbeddingResult
    from engine_adapter.serving.sequence import Sequence

__all__ = ["NoHooks", "SchedulerHooks"]


class SchedulerHooks(Protocol):
    """The scheduler's owner: told of each request's admission and end, asked a few decisions."""

    def on_admitted(self, seq: Sequence, hit_tokens: int) -> None:
        """`seq` was admitted; `hit_tokens` of its tokens came from the prefix cache."""

    def on_finished(self, seq: Sequence) -> None:
        """`seq` ended (its `finish_reason` is set), before its final output is emitted."""

    def on_embedding_finished(self, job: EmbeddingJob, result: EmbeddingResult) -> None:
        """An embedding request ended with `result`, before its caller is handed it."""

    def on_batch_change(self, change: BatchChange) -> None:
        """Adaptive batching changed the running-batch limit."""

    def estimate_lifetime(self, seq: Sequence) -> float | None:
        """Seconds `seq` has left, given to the policy at admission (None: not predicted)."""

    def deadline_for(self, seq: Sequence) -> float | None:
        """The deadline (the cache's clock) of the blocks `seq` is admitted with."""

    def admits_llm(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether the waiting `seq` may be admitted now, beside the `running` sequences."""

    def admits_llm_growth(self, seq: Sequence, blocks: int, running: list[Sequence]) -> bool:
        """Whether the running `seq` may take `blocks` more pool blocks as it decodes (False:
        a running sequence gives way first, as when the pool is short)."""

    def admits_embedding(self, job: EmbeddingJob, blocks: int) -> bool:
        """Whether a text of `job` may reserve `blocks` more pool blocks as its workspace now."""

    def choose_victims(
        self, running: list[Sequence], exclude: Set[int], blocks: int
    ) -> list[Sequence] | None:
        """Running sequences to preempt so that `blocks` blocks come free, none whose `seq_id`
        is in `exclude` (an empty list: none can give way); None: the eviction policy chooses
        (`CacheManager.select_preemption_victims`)."""


class NoHooks:
    """The scheduler alone: no metrics, no prediction, no quotas; the policy picks victims."""

    def on_admitted(self, seq: Sequence, hit_tokens: int) -> None:
        return None

    def on_finished(self, seq: Sequence) -> None:
        return None

    def on_embedding_finished(self, job: EmbeddingJob, result: EmbeddingResult) -> None:
        return None

    def on_batch_change(self, change: BatchChange) -> None:
        return None

    def estimate_lifetime(self, seq: Sequence) -> float | None:
        return None

    def deadline_for(self, seq: Sequence) -> float | None:
        """The sequence's own deadline (from its SLOs, if it gave any)."""
        return seq.deadline

    def admits_llm(self, seq: Sequence, running: list[Sequence]) -> bool:
        return True

    def admits_llm_growth(self, seq: Sequence, blocks: int, running: list[Sequence]) -> bool:
        return True

    def admits_embedding(self, job: EmbeddingJob, blocks: int) -> bool:
        return True

    def choose_victims(
        self, running: list[Sequence], exclude: Set[int], blocks: int
    ) -> list[Sequence] | None:
        return None
