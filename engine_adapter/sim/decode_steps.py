"""The arithmetic of decode-only steps: how many to run before the next event, and how long.

Between events the simulator advances all decoding sequences by `k` steps in one go; a step's
decode time is the `CostModel`'s ``d + e*batch + f*context_tokens`` with the context growing by
`batch` tokens a step, so the time of `k` steps has a closed form (`decode_time`). A step's
block needs are taken off their heap together (`due_needs`) and reserved in one call to the
cache model (`grow_decoding`; `reserve_each` is that call for a model that reserves one at a time).
Pure functions of their arguments; imports the cost model and the sequence record only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.sequence import SimSequence

__all__ = ["decode_time", "due_needs", "grow_decoding", "reserve_each", "steps_to_next", "steps_until"]


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


def due_needs(
    needs: list[tuple[int, int, int]], running: dict[int, SimSequence], step: int, block_size: int
) -> list[tuple[int, SimSequence]]:
    """The block needs due by `step` that are still current (stale ones dropped), popped in heap
    order, up to one block past the first: a served need's next one (`push_next_need`, a block
    later) then sorts after all of them, as it would had each been popped and served in turn."""
    wants: list[tuple[int, SimSequence]] = []
    bound = needs[0][0] + block_size if needs else 0
    while needs and needs[0][0] <= step and needs[0][0] < bound:
        target, sid, epoch = heapq.heappop(needs)
        seq = running.get(sid)
        if seq is not None and seq.epoch == epoch:
            wants.append((target, seq))
    return wants


def push_next_need(needs: list[tuple[int, int, int]], seq: SimSequence, target: int, block_size: int) -> None:
    """`seq` got its block at `target`: its next need, a block later, while it still decodes then."""
    nxt = target + block_size
    if nxt <= seq.start_step + seq.request.output_len - seq.decoded - 1:
        heapq.heappush(needs, (nxt, seq.sid, seq.epoch))


def reserve_each(
    reserve: Callable[[SimSequence, int], bool], wants: Sequence[tuple[SimSequence, int]]
) -> int:
    """`reserve` of each (sequence, tokens) in order up to the first that falls short: how many got
    theirs (a cache model without a batched reservation; the radix model's is `reserve_many`)."""
    for done, (seq, tokens) in enumerate(wants):
        if not reserve(seq, tokens):
            return done
    return len(wants)


class GrowingCache(Protocol):
    """What `grow_decoding` asks of a cache model (the radix and sglang models)."""

    def reserve(self, seq: SimSequence, tokens: int) -> bool: ...

    def select_victims(self, exclude: list[int]) -> list[int]: ...


def grow_decoding(
    needs: list[tuple[int, int, int]],
    running: dict[int, SimSequence],
    step: int,
    block_size: int,
    cache: GrowingCache,
    reserve_many: Callable[[list[tuple[SimSequence, int]]], int],
    admitted: list[int],
    preempt: Callable[[SimSequence], None],
) -> bool:
    """Give each decoding sequence whose need is due by `step` its block, preempting others by
    the cache's choice (never one of `admitted`) when the pool is short; True when anything was
    preempted. The due needs go to `reserve_many` in one call, in heap order; the first that falls
    short is served as one call per need would serve it (victims, then again; itself when none is
    left), and the needs after it go back on the heap, to be taken again (or skipped once
    preempted) in the same order: the same reservations, evictions and preemptions."""
    preempted = False
    while needs and needs[0][0] <= step:
        wants = due_needs(needs, running, step, block_size)
        done = reserve_many([(seq, seq.tokens + target - seq.start_step) for target, seq in wants])
        for target, seq in wants[:done]:
            push_next_need(needs, seq, target, block_size)
        if done == len(wants):
            continue
        preempted = True
        target, seq = wants[done]
        tokens = seq.tokens + target - seq.start_step
        while victims := cache.select_victims([seq.sid, *admitted]):
            for victim in victims:
                preempt(running[victim])
            if cache.reserve(seq, tokens):
                push_next_need(needs, seq, target, block_size)
                break
        else:
            preempt(seq)  # nothing else to take from: it waits and re-prefills
        for later, other in wants[done + 1 :]:
            heapq.heappush(needs, (later, other.sid, other.epoch))
    return preempted
