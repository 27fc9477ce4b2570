"""Algorithm 1 (embedding-aware admission control) and sage's admission of embedding batches.

Algorithm 1, as the spec writes it (section 3.2), for an LLM request r:

    predicted_kv      = blocks(r.prompt_len + OutputPredictor.predict(r))
    window            = estimated completion time of r (its SLO pace: TTFT + out * TPOT)
    embedding_forecast= blocks of queued embedding batches expected to start before window
                        + the forecaster's arrivals over min(window, forecast_horizon)
    required          = predicted_kv + embedding_forecast + SAFETY_RATIO * M
    used + required <= M                        -> ADMIT
    r is HIGH and lower-priority work frees it  -> ADMIT_WITH_PREEMPTION (victims: Algorithm 3)
    r's first-token deadline - now > DEFER_THRESHOLD -> DEFER (the caller asks again later)
    otherwise                                   -> REJECT

sage adds (issue 19: the spec sheds no embedding work): an embedding batch is rejected on
arrival when it cannot fit the pool beside the LLM floor, or when the work queued ahead of it
in deadline order (EDF) at the learnt embedding throughput ends past its deadline; and an LLM
request whose first-token deadline has already passed is rejected at once rather than deferred.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine_adapter.colocation.records import (
    Admission,
    ColocationParams,
    Decision,
    EmbeddingView,
    LLMView,
    MemoryState,
)

__all__ = ["admit_embedding", "admit_llm", "embedding_forecast_blocks"]


def embedding_forecast_blocks(
    queue: Sequence[EmbeddingView],
    now_s: float,
    window_end_s: float,
    *,
    seconds_per_token: float | None,
    arrivals_blocks: float,
) -> float:
    """Lines 7-9: blocks of queued batches expected to start before `window_end_s`, plus arrivals.

    A queued batch's expected start is `now_s` plus the service time of the queued work ahead of
    it (queue order), when the embedding throughput is known; otherwise every queued batch is
    taken to start within the window.
    """
    forecast = 0.0
    start = now_s
    for batch in queue:
        if batch.started_s is not None:
            continue  # running: already in the memory in use
        if start < window_end_s:
            forecast += batch.blocks
        if seconds_per_token is not None:
            start += batch.tokens * seconds_per_token
    return forecast + arrivals_blocks


def admit_llm(
    req: LLMView,
    now_s: float,
    memory: MemoryState,
    *,
    params: ColocationParams,
    predicted_kv_blocks: int,
    embedding_forecast: float,
    victims_for: Callable[[int], list[str]],
    reject_missed: bool,
) -> Admission:
    """Algorithm 1 for one LLM request (the controller supplies the predictions).

    Args:
        req: The request asking to be admitted.
        now_s: The caller's clock.
        memory: The pool now.
        params: The constants.
        predicted_kv_blocks: Line 3: KV blocks of prompt + predicted output.
        embedding_forecast: Lines 7-9: blocks of embedding work expected in the window.
        victims_for: Lower-priority requests (Algorithm 3) that free the given blocks, [] if none.
        reject_missed: (sage) reject at once a request whose first-token deadline has passed.
    """
    total = memory.total_blocks
    used = memory.used_llm_blocks + memory.used_embedding_blocks
    safety = total * params.safety_ratio
    required = predicted_kv_blocks + embedding_forecast + safety
    ttft_deadline = req.arrival_s + req.slo.ttft_ms / 1000.0
    if reject_missed and req.first_token_s is None and now_s > ttft_deadline:
        return Admission(Decision.REJECT, f"first-token deadline passed {now_s - ttft_deadline:.3f}s ago")
    if used + required <= total:
        return Admission(
            Decision.ADMIT,
            f"fits: {used} used + {predicted_kv_blocks} kv + {embedding_forecast:.0f} embedding"
            f" + {safety:.0f} safety <= {total} blocks",
        )
    shortfall = math.ceil(used + required - total)
    high = req.priority >= len(params.priority_weights) - 1
    if high:
        victims = victims_for(shortfall)
        if victims:
            return Admission(
                Decision.ADMIT_WITH_PREEMPTION,
                f"high priority: preempting {len(victims)} lower-priority request(s) for {shortfall} blocks",
                tuple(victims),
            )
    slack = ttft_deadline - now_s
    if slack > params.defer_threshold:
        return Admission(Decision.DEFER, f"short of {shortfall} blocks; first-token slack {slack:.3f}s")
    return Admission(
        Decision.REJECT, f"short of {shortfall} blocks and first-token slack {slack:.3f}s <= defer threshold"
    )


def admit_embedding(
    req: EmbeddingView,
    now_s: float,
    memory: MemoryState,
    *,
    max_embedding_blocks: int,
    queue: Sequence[EmbeddingView],
    seconds_per_token: float | None,
) -> Admission:
    """sage's admission of one embedding batch: fits the pool, and can meet its deadline (EDF).

    Args:
        req: The batch asking to be admitted.
        now_s: The caller's clock.
        memory: The pool now.
        max_embedding_blocks: The most blocks embeddings may ever hold (pool minus LLM floor).
        queue: Embedding batches already admitted and not finished (queued or running).
        seconds_per_token: Learnt embedding service time per token; None before any is known.
    """
    if req.blocks > max_embedding_blocks:
        return Admission(
            Decision.REJECT,
            f"batch needs {req.blocks} blocks, embeddings may hold at most {max_embedding_blocks}",
        )
    deadline = req.arrival_s + req.slo.deadline_ms / 1000.0
    if seconds_per_token is not None:
        # EDF: the work that runs before this batch is what is due no later than it.
        # A running batch is counted at half its tokens: the mean of what it has left.
        ahead = sum(
            e.tokens if e.started_s is None else e.tokens / 2
            for e in queue
            if e.request_id != req.request_id and e.arrival_s + e.slo.deadline_ms / 1000.0 <= deadline
        )
        finish = now_s + (ahead + req.tokens) * seconds_per_token
        if finish > deadline:
            return Admission(
                Decision.REJECT,
                f"would finish {finish - deadline:.3f}s past its deadline behind {ahead:.0f} queued tokens",
            )
    if memory.free_blocks >= req.blocks:
        return Admission(Decision.ADMIT, f"fits: {req.blocks} of {memory.free_blocks} free blocks")
    return Admission(Decision.DEFER, f"waits for {req.blocks} blocks ({memory.free_blocks} free)")
