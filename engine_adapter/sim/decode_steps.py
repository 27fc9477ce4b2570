"""The arithmetic of decode-only steps: how many to run before the next event, and how long.

Between events the simulator advances all decoding sequences by `k` steps in one go; a step's
decode time is the `CostModel`'s ``d + e*batch + f*context_tokens`` with the context growing by
`batch` tokens a step, so the time of `k` steps has a closed form (`decode_time`).
Pure functions of their arguments; imports the cost model and the sequence record only.
"""

from __future__ import annotations

import heapq

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.sequence import SimSequence

__all__ = ["decode_time", "steps_to_next", "steps_until"]


def steps_to_next(
    finishes: list[tuple[int, int, int]],
    needs: list[tuple[int, int, int]],
    running: dict[int, SimSequence],
    step: int,
) -> int:
    """Decode steps to run from `step`: through the next finish, or up to the next block need.

    Stale heap heads (a sequence no longer running, or of an older epoch) are popped on the way.
    """
    k = 1 << 62
    for heap, through in ((finishes, 1), (needs, 0)):
        while heap:
            target, sid, epoch = heap[0]
            seq = running.get(sid)
            if seq is None or seq.epoch != epoch:
                heapq.heappop(heap)
                continue
            k = min(k, target - step + through)
            break
    return max(k, 1) if k != 1 << 62 else 1


def decode_time(cost: CostModel, batch: int, context_sum: int, step: int, k: int) -> float:
    """Seconds of `k` decode-only steps from `step` (context grows by `batch` a step)."""
    if batch <= 0:
        return 0.0
    contexts = k * (context_sum + batch * step) + batch * k * (k - 1) // 2
    return (
        k * (cost.decode_base_s + cost.decode_per_seq_s * batch) + cost.decode_per_context_token_s * contexts
    )


def steps_until(
    cost: CostModel, arrival: float, clock: float, batch: int, context_sum: int, step: int, k_max: int
) -> int:
    """Fewest decode steps (at most `k_max`) after which the clock reaches `arrival`."""
    if batch <= 0 or arrival <= clock:
        return 1
    if clock + decode_time(cost, batch, context_sum, step, k_max) < arrival:
        return k_max
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if clock + decode_time(cost, batch, context_sum, step, mid) >= arrival:
            hi = mid
        else:
            lo = mid + 1
    return lo
