"""Algorithm 2 (SLO-driven quota adjustment) and sage's demand-following variant.

The spec (section 3.3), once per interval:

    urgency(class)  = sum over its pending and running requests of
                        VIOLATION_WEIGHT * |slack|      if slack < 0
                        CRITICAL_WEIGHT / (slack + 1)   if 0 <= slack < CRITICAL_THRESHOLD
    flexible        = M - MIN_LLM - MIN_EMBEDDING
    llm_share       = DEFAULT_LLM_RATIO if both urgencies are 0, else llm / (llm + embedding)
    llm_quota       = smooth_adjust(current, MIN_LLM + flexible * llm_share, MAX_CHANGE_RATE)
    embedding_quota = M - llm_quota

sage (issue 19: quotas that follow a shifting mix): the target share is the LLM's share of the
memory demand (predicted KV of its requests against the blocks of queued and running embedding
batches plus the forecaster's arrivals), averaged with the urgency share when anything is
urgent; and the quota moves only when the target leaves a dead band around it, so a steady
load does not make it oscillate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from engine_adapter.colocation.records import ColocationParams

__all__ = ["demand_share", "floors", "smooth_adjust", "target_llm_blocks", "urgency"]


def urgency(slacks: Iterable[float], params: ColocationParams) -> float:
    """compute_urgency over the slacks (seconds) of one class's pending and running requests."""
    total = 0.0
    for slack in slacks:
        if slack < 0:
            total += params.violation_weight * abs(slack)
        elif slack < params.critical_threshold:
            total += params.critical_weight / (slack + 1.0)
    return total


def floors(total_blocks: int, params: ColocationParams) -> tuple[int, int]:
    """The LLM and embedding floors in blocks (their sum never exceeds the pool)."""
    llm = math.ceil(total_blocks * params.min_llm_quota)
    embedding = math.ceil(total_blocks * params.min_embedding_quota)
    if llm + embedding > total_blocks:
        embedding = total_blocks - llm
    return llm, embedding


def smooth_adjust(current: int, target: float, max_change: float) -> int:
    """`target` approached from `current` by at most `max_change` blocks (line 16)."""
    step = max(-max_change, min(max_change, target - current))
    return round(current + step)


def target_llm_blocks(total_blocks: int, llm_share: float, params: ColocationParams) -> float:
    """Line 15: MIN_LLM + flexible * llm_share, in blocks."""
    llm_floor, embedding_floor = floors(total_blocks, params)
    return llm_floor + (total_blocks - llm_floor - embedding_floor) * min(1.0, max(0.0, llm_share))


def demand_share(llm_demand: float, embedding_demand: float, default: float) -> float:
    """The LLM's share of the memory demand (`default` when there is none)."""
    if llm_demand + embedding_demand <= 0:
        return default
    return llm_demand / (llm_demand + embedding_demand)
