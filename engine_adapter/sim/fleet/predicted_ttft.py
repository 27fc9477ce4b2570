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
    """Seconds until `request`'s first token on `replica` if it were routed there `now`."""
    cost = replica.cost
    block_size = replica.simulator.block_size
    cached = min(cached_blocks * block_size, request.input_len)
    work = replica.queued_prefill_tokens + request.input_len - cached
    steps = max(1, -(-work // replica.simulator.max_prefill_tokens))
    busy = max(0.0, replica.clock - now)
    prefill = cost.prefill_time(work, replica.queued_requests + 1, cached)
    return busy + prefill + steps * cost.decode_step_time(replica.decoding, replica.context_tokens)


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
