"""The engine's answer to the scheduler: `EngineHooks`, its `SchedulerHooks`.

The engine builds it before the scheduler and hands it over at construction
(`engine_adapter.serving.hooks` says why). It holds:

- the engine's metrics: each admission's prefix hit, each finished request's latencies and
  tokens, each finished embedding request, each change of the batch limit;
- lifetime prediction (``enable_lifetime_prediction``): a sequence's remaining output tokens at
  the time per output token learnt from finished requests, for the predictive policies;
- colocation (`ColocationGates`, when ``colocation`` is on): the quotas, deadlines and victims
  it decides, and the latencies its controller learns from.

Without colocation it answers as `NoHooks` does: every request admitted, the sequence's own
deadline, the policy's victims.

Imports: this package's metrics, colocation gates and records.
"""

from __future__ import annotations

import itertools
from collections.abc import Set

from engine_adapter.cache.adaptive_batch import BatchChange
from engine_adapter.serving.colocation import ColocationGates
from engine_adapter.serving.embedding_batch import EmbeddingJob, EmbeddingResult
from engine_adapter.serving.metrics import EngineMetrics
from engine_adapter.serving.sequence import Sequence

__all__ = ["EngineHooks"]

# Mean time per output token before any request has finished: a first guess for the lifetime.
FIRST_TPOT_ESTIMATE_S = 0.02


class EngineHooks:
    """What the engine's scheduler tells the engine and asks it (a `SchedulerHooks`).

    Args:
        metrics: The engine's Prometheus metrics.
        colocation: Colocation's side of the scheduler; None when ``colocation`` is off.
        lifetime_prediction: Whether admission gives the policy a sequence's predicted lifetime.
    """

    def __init__(
        self,
        metrics: EngineMetrics,
        *,
        colocation: ColocationGates | None = None,
        lifetime_prediction: bool = False,
    ) -> None:
        self.metrics = metrics
        self.colocation = colocation
        self.lifetime_prediction = lifetime_prediction
        # Mean time per output token, learnt from finished requests (a first guess until then).
        self.tpot_estimate_s = FIRST_TPOT_ESTIMATE_S

    # ---- events ------------------------------------------------------------------------------

    def on_admitted(self, seq: Sequence, hit_tokens: int) -> None:
        self.metrics.on_lookup(hit_tokens, seq.num_tokens)

    def on_finished(self, seq: Sequence) -> None:
        if self.colocation is not None and seq.finish_reason in ("stop", "length"):
            self.colocation.controller.observe_llm_finished(len(seq.prompt_ids), len(seq.output_ids))
        times = seq.token_times
        if len(times) > 1:  # an exponential moving average of the time per output token
            tpot = (times[-1] - times[0]) / (len(times) - 1)
            self.tpot_estimate_s = 0.8 * self.tpot_estimate_s + 0.2 * tpot
        ttft = seq.first_token_time - seq.arrival if seq.first_token_time is not None else None
        self.metrics.on_request_finished(
            seq.finish_reason or "error",
            ttft,
            [b - a for a, b in itertools.pairwise(times)],
            prompt_tokens=len(seq.prompt_ids),
            generation_tokens=len(seq.output_ids),
            written_tokens=seq.cache_receipt.written_tokens,
        )

    def on_embedding_finished(self, job: EmbeddingJob, result: EmbeddingResult) -> None:
        self.metrics.on_embedding_finished(result.status, result.latency_s, result.prompt_tokens)
        if self.colocation is not None and result.status == 200:
            self.colocation.controller.observe_embedding_finished(
                result.prompt_tokens, result.latency_s - result.queued_s
            )

    def on_batch_change(self, change: BatchChange) -> None:
        self.metrics.on_batch_change(change)

    # ---- questions ---------------------------------------------------------------------------

    def estimate_lifetime(self, seq: Sequence) -> float | None:
        """Seconds a sequence has left: its remaining output tokens at the learnt time per token
        (None without lifetime prediction)."""
        if not self.lifetime_prediction:
            return None
        remaining = max(seq.sampling.max_tokens - len(seq.output_ids), 0)
        return remaining * self.tpot_estimate_s

    def deadline_for(self, seq: Sequence) -> float | None:
        if self.colocation is None:
            return seq.deadline
        return self.colocation.deadline_for(seq)

    def admits_llm(self, seq: Sequence, running: list[Sequence]) -> bool:
        return self.colocation is None or self.colocation.admits_llm(seq, running)

    def admits_llm_growth(self, seq: Sequence, blocks: int, running: list[Sequence]) -> bool:
        return self.colocation is None or self.colocation.admits_llm_growth(seq, blocks, running)

    def admits_embedding(self, job: EmbeddingJob, blocks: int) -> bool:
        return self.colocation is None or self.colocation.admits_embedding(job, blocks)

    def choose_victims(
        self, running: list[Sequence], exclude: Set[int], blocks: int
    ) -> list[Sequence] | None:
        if self.colocation is None:
            return None
        return self.colocation.choose_victims(running, exclude, blocks)
