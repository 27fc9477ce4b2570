"""`round_robin`: each request to the next replica in turn, whatever it holds or runs.

The baseline of every router: sgl-router's and vllm-router's ``round_robin``, and what a plain
Kubernetes Service (or any L4 balancer) does. Request i goes to replica i mod N.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine_adapter.sim.fleet.router import Router

if TYPE_CHECKING:
    from engine_adapter.sim.fleet.replica import Replica
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["RoundRobin"]


class RoundRobin(Router):
    name = "round_robin"
    models = "sgl-router / vllm-router round_robin; a Kubernetes Service"

    def __init__(self, replicas: Sequence[Replica], **params: Any) -> None:
        super().__init__(replicas, **params)
        self._next = 0

    def route(self, request: SimRequest, now: float) -> int:
        index = self._next
        self._next = (index + 1) % len(self.replicas)
        return index
