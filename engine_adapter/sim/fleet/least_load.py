"""`least_load`: each request to the replica with the fewest outstanding tokens.

Outstanding tokens are the prompt and output tokens of the requests routed to a replica and not
finished yet: what a router that counts its own in-flight work knows without asking the engine
(vllm-router's and llm-d's load-aware scorers count requests; tokens weigh a long prompt as the
work it is). Ties go to the lowest index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine_adapter.sim.fleet.router import Router

if TYPE_CHECKING:
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["LeastLoad"]


class LeastLoad(Router):
    name = "least_load"
    models = "a least-outstanding-work balancer (vllm-router least-load, llm-d load-aware scorer)"

    def route(self, request: SimRequest, now: float) -> int:
        return self.least_loaded()
