"""The records of one simulator run: `RunState` (what a run changes) and `StepAdmission` (what
one step admits); `SimResult` (the row it ends with) is `sim_result`'s, named here too.

Kept apart from the event loop (`engine_adapter.sim.simulator`) so that the loop reads as its
steps; imports the cache models and the sequence record, never the loop.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from engine_adapter.sim.cache_models import FlatModel, RadixModel
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.sim_result import SimResult
from engine_adapter.sim.twins.sglang_model import SGLangModel
from engine_adapter.sim.workloads import SimRequest

__all__ = ["RunRequests", "RunState", "SimResult", "StepAdmission", "run_requests"]

RunRequests = list[SimRequest] | RequestTable
"""A run's requests: a workload's table or list, or a fleet replica's list, which grows as
requests are routed to it (both take `append`)."""


def run_requests(requests: Sequence[SimRequest]) -> RunRequests:
    """`requests` as a run keeps them: a table or a list as they are, any other sequence listed."""
    return requests if isinstance(requests, list | RequestTable) else list(requests)


@dataclass(slots=True)
class StepAdmission:
    """The requests one step admits and the prefill work they bring."""

    admitted: list[SimSequence] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_batch: int = 0
    cached_tokens: int = 0
    host_tokens: int = 0  # of `cached_tokens`, loaded back from the host tier in this step
    disk_tokens: int = 0
    prefetch_s: float = 0.0  # loads for queued requests, overlapped with the step's compute


@dataclass(slots=True)
class RunState:
    """Everything one run changes: the queues, the step counter, the virtual clock, the counters.

    `finishes` and `needs` are heaps of (step, sequence id, epoch): the last step of a running
    sequence, and the step at which a decoding one needs a new block; a preemption bumps the
    sequence's epoch, so its stale entries are skipped when popped. The decoding sequences'
    KV tokens at step g are ``context_sum + decoding * g``.
    """

    requests: RunRequests
    ends: array[int]  # per request: its blocks' end in the whole lookup sequence
    cache: RadixModel | SGLangModel | None
    flat: FlatModel | None
    clock: float
    first_arrival: float
    waiting: deque[SimSequence] = field(default_factory=deque)
    running: dict[int, SimSequence] = field(default_factory=dict)
    decoding: int = 0
    context_sum: int = 0
    finishes: list[tuple[int, int, int]] = field(default_factory=list)
    needs: list[tuple[int, int, int]] = field(default_factory=list)
    step: int = 0  # the next step to run
    next_arrival: int = 0
    queued: int = 0  # the next arrived request not yet in `waiting` (`queue_arrivals`)
    queue_window: int = 0  # the most arrivals `waiting` holds at once; 0: every arrival
    group_hits: dict[Hashable, list[int]] = field(default_factory=dict)
    block_lookups: int = 0
    block_hits: int = 0
    tokens_looked_up: int = 0
    tokens_hit: int = 0
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    total_tokens: int = 0
    finished: int = 0
    host_hits: int = 0  # first admissions' block hits loaded from the host tier
    disk_hits: int = 0
    load_s: float = 0.0
    recompute_s: float = 0.0
    prefetch_hits: int = 0

    def arrival_s(self, index: int) -> float:
        """Request `index`'s arrival, read from the table's column where there is one (no
        `SimRequest` built)."""
        requests = self.requests
        return requests.arrival_s(index) if isinstance(requests, RequestTable) else requests[index].arrival_s

    def queue_arrivals(
        self, block_size: int, group_of: Callable[[SimRequest], Hashable]
    ) -> Iterator[SimSequence]:
        """Mark the requests that have arrived by the clock, and queue them in arrival order (a
        `SimSequence` each, its group `group_of(request)`), yielding each as it joins `waiting`.

        With a `queue_window` (a workload's table, a model that admits from the head in order:
        `Simulator.start_run`), at most that many arrivals wait as `SimSequence`s; the others
        stay indices past the queue's tail (`queued` .. `next_arrival`) until the head has
        room. The window exceeds what one step admits, so the queue is never empty while one
        waits, and the order, hence the run, is the same; a trace whose arrivals outrun the
        server (a generated one) does not then hold every request's keys as objects at once."""
        n = len(self.requests)
        while self.next_arrival < n and self.arrival_s(self.next_arrival) <= self.clock:
            self.next_arrival += 1
        window = self.queue_window
        while self.queued < self.next_arrival and (not window or len(self.waiting) < window):
            sid = self.queued
            r = self.requests[sid]
            seq = SimSequence(r, sid, block_size, group_of(r), self.ends[sid])
            self.waiting.append(seq)
            self.queued += 1
            yield seq
