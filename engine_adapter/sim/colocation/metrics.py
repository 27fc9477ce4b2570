"""What one colocation run measures: `RunResult` (counts and latencies) and `metrics` (its row).

Attainment counts every arrived request (a rejected one missed its SLO); latencies are P99 over
the finished requests. Pure Python; imports nothing of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["RunResult", "metrics"]


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
    # Decisions in which the quota, not the pool, was the limit: LLM allocations the cap refused,
    # cached blocks evicted to keep within it, embedding batches held back by their quota, LLM
    # requests preempted to give embeddings their quota. 0: the quota (Algorithm 2, or the static
    # split that replaces it) changed nothing in the run.
    quota_limited: int = 0


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
        "quota_limited": float(result.quota_limited),
    }
