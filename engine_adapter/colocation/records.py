"""The typed records that cross the colocation boundary (controller <-> engine or simulator).

Times are seconds on the caller's clock (the engine's monotonic clock or the simulator's
virtual one) except the SLOs, which are in milliseconds as the API fields are. Memory is in
KV-pool blocks: an embedding batch's activation workspace is reserved in the same blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum

__all__ = [
    "Admission",
    "ColocationParams",
    "Decision",
    "EmbeddingSLO",
    "EmbeddingView",
    "LLMSLO",
    "LLMView",
    "MemoryState",
    "Quota",
]


@dataclass(frozen=True, slots=True)
class LLMSLO:
    """An LLM request's service-level objective.

    Attributes:
        ttft_ms: Time to first token, from arrival.
        tpot_ms: Time per output token after the first (the mean over the request).
    """

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class EmbeddingSLO:
    """An embedding request's objective: the whole batch answered within `deadline_ms` of arrival."""

    deadline_ms: float

    def __post_init__(self) -> None:
        value = self.deadline_ms
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"deadline_ms must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class ColocationParams:
    """The spec's constants (section 3, Algorithms 1-3), snake_case, with sage's extensions.

    The spec gives a value only for SAFETY_RATIO ("e.g., 10%"); the others are chosen here and
    the prototype of issue 19 found results move by at most 1.5 points across them.

    Attributes:
        safety_ratio: Algorithm 1's safety margin, a fraction of the pool.
        defer_threshold: Algorithm 1 defers (rather than rejects) a request whose first-token
            deadline is more than this many seconds away.
        min_llm_quota: Algorithm 2's floor of the LLM quota, a fraction of the pool.
        min_embedding_quota: Floor of the embedding quota, a fraction of the pool.
        default_llm_ratio: The LLM share when no request is urgent (also the starting quota).
        max_change_rate: `smooth_adjust`'s bound: the LLM quota moves by at most this fraction
            of the pool per interval.
        violation_weight: Urgency per second of negative slack (compute_urgency).
        critical_weight: Urgency numerator of a request with slack below `critical_threshold`.
        critical_threshold: Slack (seconds) below which a request is critical.
        recompute_weight: Algorithm 3's eviction cost per generated token.
        priority_weights: Algorithm 3's PRIORITY_WEIGHTS, indexed by priority (0 = lowest);
            a priority beyond the tuple takes the last weight. The last index is HIGH for
            Algorithm 1's preemption branch.
        completion_threshold: Algorithm 3 protects a request with fewer estimated remaining
            tokens than this.
        eps: Algorithm 3's epsilon added to the slack (seconds).
        quota_interval_s: Algorithm 2 runs once per this many seconds.
        forecast_horizon_s: (sage) how far ahead the embedding-load forecaster projects the
            recent arrival rate into Algorithm 1's reservation.
        quota_deadband: (sage) Algorithm 2 leaves the quota alone while its target is within
            this fraction of the pool of the current quota (no oscillation under steady load).
        quota_smoothing_s: (sage) time constant of the moving average of the demand share that
            Algorithm 2 follows (a burst does not swing the quota, a shift in the mix does).
        embedding_chunk_tokens: (sage, shared compute) an embedding batch runs in chunks of at
            most this many tokens between decode steps, so a batch never stalls TPOT.
    """

    safety_ratio: float = 0.10
    defer_threshold: float = 0.5
    min_llm_quota: float = 0.10
    min_embedding_quota: float = 0.05
    default_llm_ratio: float = 0.7
    max_change_rate: float = 0.10
    violation_weight: float = 10.0
    critical_weight: float = 1.0
    critical_threshold: float = 1.0
    recompute_weight: float = 1e-3
    priority_weights: tuple[float, ...] = (1.0, 2.0, 4.0)
    completion_threshold: int = 16
    eps: float = 1e-3
    quota_interval_s: float = 1.0
    forecast_horizon_s: float = 0.5
    quota_deadband: float = 0.08
    quota_smoothing_s: float = 4.0
    embedding_chunk_tokens: int = 2048

    def __post_init__(self) -> None:
        fractions = (
            "safety_ratio",
            "min_llm_quota",
            "min_embedding_quota",
            "default_llm_ratio",
            "max_change_rate",
            "quota_deadband",
        )
        for name in fractions:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be a fraction in [0, 1], got {value!r}")
        if self.min_llm_quota + self.min_embedding_quota > 1.0:
            raise ValueError(
                f"min_llm_quota + min_embedding_quota must be <= 1, got "
                f"{self.min_llm_quota} + {self.min_embedding_quota}"
            )
        if self.max_change_rate <= 0:
            raise ValueError(f"max_change_rate must be > 0, got {self.max_change_rate!r}")
        positive = (
            "defer_threshold",
            "violation_weight",
            "critical_weight",
            "critical_threshold",
            "recompute_weight",
            "forecast_horizon_s",
            "quota_smoothing_s",
        )
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("eps", "quota_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not self.priority_weights or any(
            not (isinstance(w, int | float) and math.isfinite(w) and w > 0) for w in self.priority_weights
        ):
            raise ValueError(f"priority_weights must be finite numbers > 0, got {self.priority_weights!r}")
        for name in ("completion_threshold", "embedding_chunk_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "completion_threshold" else 1):
                raise ValueError(f"{name} must be an integer >= 0 (chunk >= 1), got {value!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, for `--param name=value` parsing."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, slots=True)
class Quota:
    """The pool split: blocks the LLM KV cache and the embedding workspaces may hold."""

    llm_blocks: int
    embedding_blocks: int


class Decision(StrEnum):
    """Algorithm 1's answers."""

    ADMIT = "admit"
    ADMIT_WITH_PREEMPTION = "admit_with_preemption"
    DEFER = "defer"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Admission:
    """An admission decision, why it was taken, and (with preemption) the requests to preempt."""

    decision: Decision
    reason: str
    preempt: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LLMView:
    """What the controller sees of an LLM request (queued or running).

    Attributes:
        request_id: The engine's id.
        arrival_s: Arrival time.
        prompt_tokens: Prompt length.
        generated_tokens: Output tokens produced so far.
        max_tokens: The request's output cap.
        slo: Its objective.
        priority: 0 = lowest; see `ColocationParams.priority_weights`.
        first_token_s: When its first token came out, None before.
        blocks: KV blocks it holds now.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    generated_tokens: int
    max_tokens: int
    slo: LLMSLO
    priority: int
    first_token_s: float | None
    blocks: int


@dataclass(frozen=True, slots=True)
class EmbeddingView:
    """What the controller sees of an embedding request (one batch of texts).

    Attributes:
        request_id: The engine's id.
        arrival_s: Arrival time.
        tokens: Tokens over all texts of the batch.
        slo: Its deadline.
        blocks: Pool blocks its activation workspace reserves while it runs.
        started_s: When it started running, None while queued.
    """

    request_id: str
    arrival_s: float
    tokens: int
    slo: EmbeddingSLO
    blocks: int
    started_s: float | None


@dataclass(frozen=True, slots=True)
class MemoryState:
    """The pool at a moment, in blocks (`free_blocks` = total - used by either class)."""

    total_blocks: int
    used_llm_blocks: int
    used_embedding_blocks: int
    free_blocks: int
