"""The records of one simulator run: `RunState` (what a run changes), `StepAdmission` (what
one step admits) and `SimResult` (the row it ends with).

Kept apart from the event loop (`engine_adapter.sim.simulator`) so that the loop reads as its
steps; imports the cache models and the sequence record, never the loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine_adapter.sim.cache_models import FlatModel, RadixModel
from engine_adapter.sim.sequence import SimSequence
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


@dataclass(slots=True)
class SimResult:
    """One benchmark row: a policy at a capacity on a workload (keys as `run_benchmark` writes them).

    With KV tiers (docs/architecture.md, "Tiers"), `capacity_blocks` is the device pool's;
    `host_policy` and the capacities say what was below it; the block hits of first admissions
    split by the tier they came from (`device_hit_ratio + host_hit_ratio + disk_hit_ratio` is
    `block_hits / block_lookups`); `load_s` is the step time spent loading blocks back (every
    admission, re-admissions too) and `recompute_s` what prefilling those blocks again would have
    cost in the same steps instead; `prefetch_hits` counts the device hits whose blocks were
    loaded ahead of time while their request queued (`TierConfig.prefetch_blocks`). With
    compress-on-evict (`compress_on_evict` set), `compressions` counts the chains compressed and
    `compressed_hits` / `compressed_hit_tokens` the admissions served from one; a row without it
    has none of these keys (rows are unchanged when it is off).
    """

    policy: str
    capacity_blocks: int
    cache_model: str
    requests: int
    block_lookups: int
    block_hits: int
    hit_rate: float
    re_prefill_rate: float
    fairness_score: float
    memory_utilization: float
    evictions: int
    eviction_p50_us: float
    eviction_p99_us: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    throughput_tok_s: float
    throughput_impact: float
    preemptions: int
    wall_s: float
    lookups_per_s: float
    adaptive_batch: bool = False
    batch_changes: int = 0
    host_policy: str | None = None
    host_capacity_blocks: int = 0
    disk_capacity_blocks: int = 0
    device_hit_ratio: float = 0.0
    host_hit_ratio: float = 0.0
    disk_hit_ratio: float = 0.0
    load_s: float = 0.0
    recompute_s: float = 0.0
    prefetch_hits: int = 0
    compress_on_evict: str | None = None
    compressions: int = 0
    compressed_hits: int = 0
    compressed_hit_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-able dict."""
        row = asdict(self)
        if self.compress_on_evict is None:
            for key in ("compress_on_evict", "compressions", "compressed_hits", "compressed_hit_tokens"):
                del row[key]
        return row
