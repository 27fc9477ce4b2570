"""`predicted_ttft`: sage's router, each request to the replica where it should get its first
token soonest, by the simulator's own cost model.

For each replica, from what it caches and runs at the request's arrival:

- busy: the rest of the step it is running (its clock past the arrival);
- prefill: the uncached part of the prompt (its real cached prefix, as `precise` reads it)
  behind the prefill work already queued there (each queued request's uncached tokens as
  expected when it was routed), in steps of at most the replica's `max_prefill_tokens`;
- decode: every such step also decodes the replica's running batch.

Expected TTFT = busy + ``CostModel.prefill_time(work, queued + 1, cached)`` + steps x
``CostModel.decode_step_time(batch, context)``, lowest wins (ties: fewer outstanding tokens,
then the lowest index). Cache affinity and load come out of one figure in seconds instead of
thresholds: a replica with the conversation's prefix wins until its queue costs more than
prefilling the prompt elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine_adapter.sim.fleet.router import Router

if TYPE_CHECKING:
    from engine_adapter.sim.fleet.replica import Replica
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["PredictedTTFT", "expected_ttft"]


def expected_ttft(replica: Replica, request: SimRequest, cached_blocks: int, now: float) -> float:
    """Seconds until `request`'s first token on `replica` if it were routed there `now`.

    Reads the run state's fields in place (no properties, no helpers): it runs once per replica
    per request, the fleet's hottest loop at 64 replicas. The queued prefill work is what the
    requests routed there were expected to miss, less what the admitted ones really missed.
    """
    sim = replica.simulator
    st = replica.state
    cost = sim.cost
    cached = min(cached_blocks * sim.block_size, request.input_len)
    queued_work = replica.routed_uncached - (st.tokens_looked_up - st.tokens_hit)
    work = (queued_work if queued_work > 0 else 0) + request.input_len - cached
    steps = -(-work // sim.max_prefill_tokens) or 1
    busy = st.clock - now if st.clock > now else 0.0
    queued = len(st.waiting) + len(st.requests) - st.next_arrival
    prefill = cost.prefill_time(work, queued + 1, cached)
    decoding = st.decoding
    if not decoding:
        return busy + prefill
    return busy + prefill + steps * cost.decode_step_time(decoding, st.context_sum + decoding * st.step)


class PredictedTTFT(Router):
    name = "predicted_ttft"
    models = "sage's own: cached prefix and queue priced by the simulator's cost model"

    def __init__(self, replicas: Sequence[Replica], **params: Any) -> None:
        super().__init__(replicas, **params)
        self._uncached: tuple[int, int] = (-1, 0)  # (replica, tokens) of the last choice

    def route(self, request: SimRequest, now: float) -> int:
        keys = request.block_hashes
        replicas = self.replicas
        best: tuple[float, int, int] | None = None
        cached_best = 0
        for i, replica in enumerate(replicas):
            cached = replica.cached_prefix_blocks(keys)
            score = (expected_ttft(replica, request, cached, now), replica.outstanding_tokens, i)
            if best is None or score < best:
                best, cached_best = score, cached
        assert best is not None
        index = best[2]
        block_size = replicas[index].simulator.block_size
        self._uncached = (index, request.input_len - min(cached_best * block_size, request.input_len))
        return index

    def expected_uncached(self, request: SimRequest, index: int) -> int | None:
        chosen, tokens = self._uncached
        return tokens if chosen == index else None
