"""An engine twin on the cost model's clock, and its benchmark row: shared by every twin.

A twin (`vllm_sched.VllmTwin`, `sage_sched.SageTwin`) decides which blocks hit and when requests
run; `run_on_clock` queues each request at its arrival, steps the twin, and prices each step with
the `CostModel` (time is the cost model's), and `twin_row` makes the benchmark's row over each
request's first-admission hit (`TwinRun`, with the per-request hits beside it).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.sim_result import SimResult
from engine_adapter.sim.workloads import SimRequest
from sage_eviction import get_policy_class
from sage_eviction.metrics import jain_fairness, percentile

__all__ = ["UNBOUNDED", "RowCounts", "SteppedTwin", "TwinClock", "TwinRun", "run_on_clock", "twin_row"]

UNBOUNDED = "unbounded"


@dataclass(frozen=True, slots=True)
class TwinRun:
    """A twin's row and what the fidelity checks compare request by request."""

    result: SimResult
    hit_tokens: list[int]  # each request's cached prompt tokens at first admission, by request index
    preemptions: int
    ttft_s: list[float]  # every request's TTFT, sorted


class SteppedTwin(Protocol):
    """What `run_on_clock` steps: a queue, the running sequences and a step that returns the
    step's work (the `CostModel.step_time` arguments as attributes) and the finished ones."""

    @property
    def running(self) -> Sequence[Any]: ...

    def add(self, seq: Any) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> tuple[Any, list[Any]]: ...

    def stuck(self) -> str: ...


@dataclass(slots=True)
class TwinClock:
    """The times of one run: its start and end, and every request's TTFT and TPOT."""

    start: float = 0.0
    end: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)


def run_on_clock(
    twin: SteppedTwin, seqs: Sequence[Any], requests: Sequence[SimRequest], cost: CostModel
) -> TwinClock:
    """Step `twin` over the arrivals of `seqs` (request i's is ``requests[i]``; a sequence has
    `index` and `num_output`); each step's time from the cost model.

    Raises:
        ValueError: Nothing runs and the queue's head cannot start (`twin.stuck()` says why).
    """
    first_token: dict[int, float] = {}
    out = TwinClock(requests[0].arrival_s if requests else 0.0)
    now, arrived = out.start, 0
    for _ in itertools.count():
        while arrived < len(seqs) and requests[arrived].arrival_s <= now:
            twin.add(seqs[arrived])
            arrived += 1
        if not twin.has_unfinished():
            if arrived == len(seqs):
                break
            now = requests[arrived].arrival_s
            continue
        before = {id(s): s.num_output for s in twin.running}
        work, finished = twin.step()
        if not twin.running and not finished:
            raise ValueError(twin.stuck())
        now += cost.step_time(
            prefill_tokens=work.prefill_tokens,
            prefill_batch=work.prefill_batch,
            cached_tokens=work.cached_tokens,
            decode_batch=work.decode_batch,
            context_tokens=work.context_tokens,
        )
        for seq in [*twin.running, *finished]:
            if seq.num_output and seq.index not in first_token and before.get(id(seq), 0) < seq.num_output:
                first_token[seq.index] = now
                out.ttfts.append(now - requests[seq.index].arrival_s)
        for seq in finished:
            r = requests[seq.index]
            if r.output_len > 1:
                out.tpots.append((now - first_token[seq.index]) / (r.output_len - 1))
    out.end = now
    return out


@dataclass(frozen=True, slots=True)
class RowCounts:
    """What the twin's cache counted over the run (the row's cache columns)."""

    hits: list[int]  # each request's cached prompt tokens at first admission
    preemptions: int
    evictions: int
    re_prefill_rate: float
    block_size: int


def twin_row(
    cache_model: str,
    requests: Sequence[SimRequest],
    policy: str,
    capacity: int,
    clock: TwinClock,
    counts: RowCounts,
    wall: float,
) -> TwinRun:
    """The benchmark's row of the run, over first admissions' hits."""
    hits, bs = counts.hits, counts.block_size
    group_hits: dict[object, list[int]] = {}
    for r, hit in zip(requests, hits, strict=True):
        group = group_hits.setdefault(r.tenant or r.session or r.request_id, [0, 0])
        group[0] += hit
        group[1] += r.input_len
    looked = sum(r.input_len for r in requests)
    lookups = sum(r.input_len // bs for r in requests)
    makespan = clock.end - clock.start
    clock.ttfts.sort()
    clock.tpots.sort()
    name = UNBOUNDED if policy == UNBOUNDED else get_policy_class(policy.split(":", 1)[0]).name
    result = SimResult(
        policy=name,
        capacity_blocks=capacity,
        cache_model=cache_model,
        requests=len(requests),
        block_lookups=lookups,
        block_hits=sum(h // bs for h in hits),
        hit_rate=sum(hits) / looked if looked else 0.0,
        re_prefill_rate=counts.re_prefill_rate,
        fairness_score=jain_fairness([h / n for h, n in group_hits.values() if n]),
        memory_utilization=1.0 if counts.evictions else 0.0,
        evictions=counts.evictions,
        eviction_p50_us=0.0,
        eviction_p99_us=0.0,
        ttft_p50_s=percentile(clock.ttfts, 0.5),
        ttft_p99_s=percentile(clock.ttfts, 0.99),
        tpot_p50_s=percentile(clock.tpots, 0.5),
        tpot_p99_s=percentile(clock.tpots, 0.99),
        throughput_tok_s=sum(r.input_len + r.output_len for r in requests) / makespan
        if makespan > 0
        else 0.0,
        throughput_impact=0.0,
        preemptions=counts.preemptions,
        wall_s=wall,
        lookups_per_s=lookups / wall if wall > 0 else 0.0,
    )
    return TwinRun(result, hits, counts.preemptions, clock.ttfts)
