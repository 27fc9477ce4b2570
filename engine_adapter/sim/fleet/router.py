"""`Router`: the base of the fleet's routers, and their params as ``name:k=v`` specs.

A router sees the fleet's replicas (`Replica`: what each holds and runs now) and picks one for
each request at its arrival; the fleet calls `route` once per request, in arrival order, and
submits the request where it says. A router keeps whatever state it needs (a counter, a tree
of what it sent where) and never changes a replica.

Params are declared per router class in `PARAMS` (name -> `Param`) and read from a spec the
way policy specs are (``cache_aware:cache_threshold=0.3,balance_abs_threshold=8``).
Standard library only: the CLI checks router specs with it before loading the simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from engine_adapter.sim.fleet.replica import Replica
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["Param", "Router", "RouterError"]


class RouterError(ValueError):
    """A router spec that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class Param:
    """One router param: its type (``int`` or ``float``), default, and the values it accepts."""

    kind: type
    default: float
    check: Callable[[float], bool]
    accepts: str  # said in the error, e.g. "in [0, 1]"
    help: str = ""


class Router(ABC):
    """Picks a replica for each request (subclasses: one per module of this package).

    Args:
        replicas: The fleet, in index order.
        **params: Values of the class's `PARAMS` (already converted by `registry.parse_router`).
    """

    name: ClassVar[str]
    models: ClassVar[str]  # the router of the world it follows (docs/fleet.md)
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, replicas: Sequence[Replica], **params: Any) -> None:
        if not replicas:
            raise RouterError("a fleet needs at least one replica")
        self.replicas = replicas
        self.params = {key: params.get(key, spec.default) for key, spec in self.PARAMS.items()}

    @abstractmethod
    def route(self, request: SimRequest, now: float) -> int:
        """The index of the replica `request` goes to, at its arrival `now`."""

    def expected_uncached(self, request: SimRequest, index: int) -> int | None:
        """The uncached prompt tokens the router expects of `request` on replica `index`, when it
        computed them (the replica's queued prefill work counts them); None: its whole prompt."""
        return None

    def least_loaded(self, candidates: Sequence[int] | None = None) -> int:
        """Among `candidates` (default: all), the fewest outstanding tokens; ties: lowest index."""
        replicas = self.replicas
        indices = range(len(replicas)) if candidates is None else candidates
        return min(indices, key=lambda i: (replicas[i].outstanding_tokens, i))
