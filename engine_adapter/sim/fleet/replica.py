"""`Replica`: one engine of a fleet, a `Simulator` driven arrival by arrival on the fleet's clock.

What the routers read of a replica is here, computed without side effects on its cache: its
outstanding requests and tokens, and the longest prefix of a request's blocks its radix cache
holds now (`RadixCache.match`, which touches nothing: a router asking is no hit).
`predicted_ttft` reads the run state (`state`) itself: its queue, batch and clock.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from engine_adapter.sim.cache_models import RadixModel
from engine_adapter.sim.run_state import RunState, SimResult
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.workloads import SimRequest

__all__ = ["Replica"]


class Replica:
    """One replica: its simulator, its run state, and what was routed to it.

    Attributes:
        index: Its position in the fleet.
        simulator: The replica's engine (its own cache, policy, capacity).
        state: The run's state (`RunState`); `state.requests` are the requests routed to it.
        routed_tokens: Prompt and output tokens of the requests routed to it.
        routed_uncached: The uncached prompt tokens expected of them when they were routed (less
            what the admitted ones really missed, the prefill work still queued here).
    """

    __slots__ = ("_match", "index", "routed_tokens", "routed_uncached", "simulator", "state")

    def __init__(self, index: int, simulator: Simulator, first_arrival: float) -> None:
        self.index = index
        self.simulator = simulator
        self.state: RunState = simulator.start_run([])
        # Every replica's clock starts at the fleet's first arrival, as a lone engine's does.
        self.state.clock = self.state.first_arrival = first_arrival
        cache = self.state.cache
        if not isinstance(cache, RadixModel):
            raise ValueError("a fleet replica needs the radix cache model")
        self._match = cache.manager.radix.match
        self.routed_tokens = 0
        self.routed_uncached = 0

    # ------------------------------------------------------------------ driving

    def advance(self, until: float, horizon: float | None) -> None:
        """Run the steps that start before `until`; `horizon` is the fleet's next arrival."""
        self.simulator.horizon = horizon
        self.simulator.advance(self.state, until)

    def submit(self, request: SimRequest, uncached_tokens: int | None = None) -> None:
        """Route `request` here: it joins the queue at its arrival (the next step's start)."""
        st = self.state
        st.ends.append((st.ends[-1] if st.ends else 0) + len(request.block_hashes))
        st.requests.append(request)
        self.routed_tokens += request.input_len + request.output_len
        self.routed_uncached += request.input_len if uncached_tokens is None else uncached_tokens

    def finish(self, wall_s: float) -> SimResult:
        """Run everything routed here to its end; the replica's own row."""
        self.advance(math.inf, None)
        return self.simulator.row(self.state, wall_s)

    # ------------------------------------------------------------------ what routers read

    @property
    def outstanding_requests(self) -> int:
        """Requests routed here and not finished (a router's in-flight count of the worker)."""
        return len(self.state.requests) - self.state.finished

    @property
    def outstanding_tokens(self) -> int:
        """Prompt and output tokens of the requests routed here and not finished."""
        return self.routed_tokens - self.state.total_tokens

    def cached_prefix_blocks(self, keys: Sequence[Hashable]) -> int:
        """Leading blocks of `keys` cached on this replica now; changes nothing."""
        return len(self._match(keys))
