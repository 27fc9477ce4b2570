"""`ColocationController`: the facade the engine and the simulator call (issue 19).

One object per pool. It holds what it learns (the output-length predictor, the embedding
load forecaster, the embedding throughput) and the current quota; every method is a pure
function of its arguments and that state, and time is always passed in, so the engine (its
monotonic clock) and the simulator (its virtual clock) run the same code.

`system` picks the algorithms: ``"spec"`` runs Algorithms 1-3 as the proposal writes them;
``"sage"`` adds what the issue's prototype showed the spec lacks (admission and EDF ordering of
embedding batches, rejection of requests already past their first-token deadline, quotas that
follow the memory demand with a dead band). `mode` is ``"dynamic"`` (Algorithm 2 each
interval) or ``"static:F"`` (a fixed LLM share F of the pool).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine_adapter.colocation import admission, preemption, quota
from engine_adapter.colocation.predictors import EmbeddingLoadForecaster, OutputLengthPredictor
from engine_adapter.colocation.records import (
    Admission,
    ColocationParams,
    Decision,
    EmbeddingView,
    LLMView,
    MemoryState,
    Quota,
)

__all__ = ["SYSTEMS", "ColocationController", "parse_mode"]

SYSTEMS = ("spec", "sage")

_THROUGHPUT_WEIGHT = 0.2  # EWMA weight of the newest embedding service-time sample


def parse_mode(mode: str) -> float | None:
    """The LLM share of ``"static:F"``, None for ``"dynamic"``.

    Raises:
        ValueError: Anything else, or F outside (0, 1).
    """
    if mode == "dynamic":
        return None
    prefix, _, value = mode.partition(":")
    if prefix == "static":
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if 0.0 < share < 1.0:
            return share
    raise ValueError(f"colocation mode must be 'dynamic' or 'static:F' with F in (0, 1), got {mode!r}")


class ColocationController:
    """Admission, quotas and preemption for LLM requests and embedding batches on one pool.

    Args:
        total_blocks: Blocks of the pool (KV cache and embedding workspaces together).
        block_size: Tokens per KV block.
        params: The constants (`ColocationParams()` for the defaults).
        mode: ``"dynamic"`` or ``"static:F"``.
        system: ``"sage"`` (default) or ``"spec"`` (Algorithms 1-3 as written).
    """

    def __init__(
        self,
        total_blocks: int,
        block_size: int,
        params: ColocationParams | None = None,
        mode: str = "dynamic",
        *,
        system: str = "sage",
    ) -> None:
        if type(total_blocks) is not int or total_blocks < 1:
            raise ValueError(f"total_blocks must be an integer >= 1, got {total_blocks!r}")
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if system not in SYSTEMS:
            raise ValueError(f"system must be one of {', '.join(SYSTEMS)}, got {system!r}")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.params = params if params is not None else ColocationParams()
        self.mode = mode
        self.system = system
        self._static_share = parse_mode(mode)
        self._llm_floor, self._embedding_floor = quota.floors(total_blocks, self.params)
        self.output_predictor = OutputLengthPredictor()
        self.forecaster = EmbeddingLoadForecaster()
        self._seconds_per_token: float | None = None
        share = self._static_share if self._static_share is not None else self.params.default_llm_ratio
        self._quota = self._split(
            round(total_blocks * share)
            if self._static_share is not None
            else round(quota.target_llm_blocks(total_blocks, share, self.params))
        )
        self._last_update_s: float | None = None
        self._share_average: float | None = None
        self._last_direction = 0
        self._share_time_s: float | None = None
        self.last_urgency: tuple[float, float] = (0.0, 0.0)

    # ------------------------------------------------------------------ predictions

    def predicted_output_tokens(self, req: LLMView) -> int:
        """Output tokens the request will produce in all (at least what it has produced + 1)."""
        predicted = self.output_predictor.predict(req.prompt_tokens, req.max_tokens)
        return max(predicted, min(req.generated_tokens + 1, req.max_tokens))

    def predicted_kv_blocks(self, req: LLMView) -> int:
        """KV blocks of the prompt and the predicted output (Algorithm 1, line 3)."""
        return math.ceil((req.prompt_tokens + self.predicted_output_tokens(req)) / self.block_size)

    def deadline_s(self, req: LLMView) -> float:
        """When the whole request is due: arrival + TTFT + TPOT per predicted token after the first."""
        out = self.predicted_output_tokens(req)
        return req.arrival_s + (req.slo.ttft_ms + req.slo.tpot_ms * (out - 1)) / 1000.0

    def estimated_remaining_s(self, req: LLMView) -> float:
        """Time left to finish at the SLO's pace: the first token (within TTFT) and the rest."""
        remaining = max(0, self.predicted_output_tokens(req) - req.generated_tokens)
        return remaining * req.slo.tpot_ms / 1000.0

    def slack_s(self, req: LLMView, now_s: float) -> float:
        """deadline - (now + estimated remaining time); what the `slo` policy takes as a deadline."""
        return self.deadline_s(req) - (now_s + self.estimated_remaining_s(req))

    def embedding_deadline_s(self, req: EmbeddingView) -> float:
        """When the batch is due."""
        return req.arrival_s + req.slo.deadline_ms / 1000.0

    def embedding_slack_s(self, req: EmbeddingView, now_s: float) -> float:
        """deadline - (now + estimated service time), the service time once it is learnt."""
        service = req.tokens * self._seconds_per_token if self._seconds_per_token is not None else 0.0
        return self.embedding_deadline_s(req) - (now_s + service)

    @property
    def embedding_seconds_per_token(self) -> float | None:
        """The learnt embedding service time per token (None before the first observation)."""
        return self._seconds_per_token

    # ------------------------------------------------------------------ Algorithm 1

    def admit_llm(
        self,
        req: LLMView,
        now_s: float,
        memory: MemoryState,
        running: Sequence[LLMView],
        embedding_queue: Sequence[EmbeddingView],
        *,
        choose_victims: Callable[[Sequence[LLMView], int], list[str]] | None = None,
    ) -> Admission:
        """Algorithm 1 for an LLM request (see `engine_adapter.colocation.admission`).

        Args:
            req: The request asking to be admitted (again, after a DEFER).
            now_s: The caller's clock.
            memory: The pool now.
            running: The LLM requests holding KV blocks (the candidates for preemption).
            embedding_queue: The embedding batches admitted and not finished.
            choose_victims: Who a high-priority request preempts: the lower-priority running
                requests and the blocks it needs in, their ids out. None: Algorithm 3
                (`preemption_victims`); the simulator's ablation without Algorithm 3 passes its
                latest-arrival rule, so that no preemption of the run is Algorithm 3's.
        """
        out = self.predicted_output_tokens(req)
        completion = now_s + (req.slo.ttft_ms + req.slo.tpot_ms * max(0, out - 1)) / 1000.0
        horizon = min(completion - now_s, self.params.forecast_horizon_s)
        queue = self.embedding_order(embedding_queue, now_s)
        forecast = admission.embedding_forecast_blocks(
            queue,
            now_s,
            completion,
            seconds_per_token=self._seconds_per_token,
            arrivals_blocks=self.forecaster.forecast_blocks(now_s, horizon),
        )
        lower = [r for r in running if r.priority < req.priority]

        def victims_for(blocks: int) -> list[str]:
            if choose_victims is None:
                chosen = self.preemption_victims(lower, blocks, now_s)
            else:
                chosen = choose_victims(lower, blocks)
            freed = sum(r.blocks for r in lower if r.request_id in set(chosen))
            return chosen if freed >= blocks else []

        return admission.admit_llm(
            req,
            now_s,
            memory,
            params=self.params,
            predicted_kv_blocks=self.predicted_kv_blocks(req),
            embedding_forecast=forecast,
            victims_for=victims_for,
            reject_missed=self.system == "sage",
        )

    def admit_embedding(
        self,
        req: EmbeddingView,
        now_s: float,
        memory: MemoryState,
        embedding_queue: Sequence[EmbeddingView] = (),
    ) -> Admission:
        """Admission of an embedding batch: ``spec`` admits all; ``sage`` checks fit and deadline.

        Args:
            req: The batch on arrival (or when asked again after a DEFER).
            now_s: The caller's clock.
            memory: The pool now.
            embedding_queue: The batches admitted and not finished.
        """
        if self.system == "spec":
            return Admission(Decision.ADMIT, "spec: embeddings are not admission-controlled")
        return admission.admit_embedding(
            req,
            now_s,
            memory,
            max_embedding_blocks=self.total_blocks - self._llm_floor,
            queue=embedding_queue,
            seconds_per_token=self._seconds_per_token,
        )

    def embedding_order(self, queue: Sequence[EmbeddingView], now_s: float) -> list[EmbeddingView]:
        """The order to run queued batches in: ``sage`` earliest deadline first, ``spec`` arrival."""
        if self.system == "sage":
            return sorted(queue, key=lambda e: (self.embedding_deadline_s(e), e.arrival_s, e.request_id))
        return sorted(queue, key=lambda e: (e.arrival_s, e.request_id))

    # ------------------------------------------------------------------ Algorithm 2

    @property
    def quota(self) -> Quota:
        """The current split of the pool."""
        return self._quota

    def _split(self, llm_blocks: int) -> Quota:
        if self._static_share is None:
            llm_blocks = min(max(llm_blocks, self._llm_floor), self.total_blocks - self._embedding_floor)
        else:
            llm_blocks = min(max(llm_blocks, 0), self.total_blocks)
        return Quota(llm_blocks, self.total_blocks - llm_blocks)

    def update_quota(
        self, now_s: float, llm: Sequence[LLMView], embeddings: Sequence[EmbeddingView]
    ) -> Quota:
        """Algorithm 2, at most once per `quota_interval_s`; the current quota in between.

        Args:
            now_s: The caller's clock.
            llm: LLM requests pending or running.
            embeddings: Embedding batches queued or running.
        """
        if self._static_share is not None:
            return self._quota
        if self._last_update_s is not None and now_s - self._last_update_s < self.params.quota_interval_s:
            return self._quota
        self._last_update_s = now_s
        params = self.params
        llm_urgency = quota.urgency((self.slack_s(r, now_s) for r in llm), params)
        embedding_urgency = quota.urgency((self.embedding_slack_s(e, now_s) for e in embeddings), params)
        self.last_urgency = (llm_urgency, embedding_urgency)
        urgent = llm_urgency + embedding_urgency > 0
        urgency_share = (
            llm_urgency / (llm_urgency + embedding_urgency) if urgent else params.default_llm_ratio
        )
        if self.system == "spec":
            share = urgency_share
        else:
            llm_demand = sum(self.predicted_kv_blocks(r) for r in llm)
            embedding_demand = sum(e.blocks for e in embeddings) + self.forecaster.forecast_blocks(
                now_s, params.forecast_horizon_s
            )
            # Urgency is left out: it flips between the classes from one interval to the next
            # (a single critical request makes a class urgent), which swung the quota both ways;
            # sage serves urgency by ordering and pacing (EDF, chunk pacing) instead of memory.
            share = quota.demand_share(llm_demand, embedding_demand, params.default_llm_ratio)
            # A moving average over quota_smoothing_s: bursts average out, a shift in the mix
            # comes through within a few time constants.
            if self._share_average is None or self._share_time_s is None:
                self._share_average = share
            else:
                weight = 1.0 - math.exp(-max(0.0, now_s - self._share_time_s) / params.quota_smoothing_s)
                self._share_average += weight * (share - self._share_average)
            self._share_time_s = now_s
            share = self._share_average
        target = quota.target_llm_blocks(self.total_blocks, share, params)
        current = self._quota.llm_blocks
        if self.system == "sage":
            # Hysteresis: a move inside the dead band is noise, and turning back against the
            # last move takes twice the band.
            band = params.quota_deadband * self.total_blocks
            direction = (target > current) - (target < current)
            if abs(target - current) <= (2 * band if direction == -self._last_direction else band):
                return self._quota
            self._last_direction = direction
        max_change = params.max_change_rate * self.total_blocks
        self._quota = self._split(quota.smooth_adjust(current, target, max_change))
        return self._quota

    # ------------------------------------------------------------------ Algorithm 3

    def preemption_victims(self, active: Sequence[LLMView], blocks_needed: int, now_s: float) -> list[str]:
        """Algorithm 3: running requests to preempt, cheapest first, sparing nearly finished ones."""
        candidates = [
            (
                r.request_id,
                self.slack_s(r, now_s),
                r.priority,
                r.generated_tokens,
                max(0, self.predicted_output_tokens(r) - r.generated_tokens),
                r.blocks,
            )
            for r in active
        ]
        return preemption.select_victims(candidates, blocks_needed, self.params)

    # ------------------------------------------------------------------ learning

    def observe_llm_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """Teach the output-length predictor one finished request."""
        self.output_predictor.observe(prompt_tokens, output_tokens)

    def observe_embedding_arrival(self, now_s: float, blocks: int) -> None:
        """Teach the load forecaster one embedding batch's arrival."""
        self.forecaster.observe(now_s, blocks)

    def observe_embedding_finished(self, tokens: int, service_s: float) -> None:
        """Teach the embedding throughput: a batch of `tokens` took `service_s` from start to end.

        The wall time beside the LLM steps, not the batch's own compute: the admission then
        estimates at the pace embeddings actually get (the compute time alone made it admit
        batches that, run at full pace to catch up, broke the LLM's TPOT under overload).
        """
        if tokens <= 0 or not service_s >= 0:
            return
        sample = service_s / tokens
        previous = self._seconds_per_token
        self._seconds_per_token = (
            sample if previous is None else (1 - _THROUGHPUT_WEIGHT) * previous + _THROUGHPUT_WEIGHT * sample
        )
