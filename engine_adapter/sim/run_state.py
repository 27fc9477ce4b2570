"""The records of one simulator run: `RunState` (what a run changes) and `StepAdmission` (what
one step admits); `SimResult` (the row it ends with) is `sim_result`'s, named here too.

Kept apart from the event loop (`engine_adapter.sim.simulator`) so that the loop reads as its
steps; imports the cache models and the sequence record, never the loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from engine_adapter.sim.cache_models import FlatModel, RadixModel
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.sim_result import SimResult
from engine_adapter.sim.twins.sglang_model import SGLangModel
from engine_adapter.sim.workloads import SimRequest

__all__ = ["RunState", "SimResult", "StepAdmission"]


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

    requests: list[SimRequest]
    ends: list[int]  # per request: its blocks' end in the whole lookup sequence
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
