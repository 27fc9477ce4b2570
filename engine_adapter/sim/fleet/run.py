"""`simulate_fleet`: a workload over N replicas behind one router, on one virtual clock; its row.

The replay: for each request in arrival order, every replica first runs the steps that start
before the arrival (`Replica.advance`; a step under way when the request arrives ends after
it, as on a real engine), then the router picks a replica from what it sees at that instant and
the request joins that replica's queue; when all are routed each replica runs to its end. One
replica behind any router is exactly the plain simulator's run (tests/test_fleet_sim.py).

The row (`FleetResult`): the fleet's block hit ratio (block hits / block lookups, every
replica's first admissions) and token hit rate; the load spread (max / mean of the tokens,
prompt and output, served per replica; 1.0 is even); TTFT and TPOT percentiles over every
request; throughput (the fleet's tokens over the time from the first arrival to the last
finish); evictions and preemptions summed; how many requests the router sent to each replica.
"""

from __future__ import annotations

import copy
import gc
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine_adapter.sim.cache_model_kinds import model_traits
from engine_adapter.sim.fleet.registry import parse_router
from engine_adapter.sim.fleet.replica import Replica
from engine_adapter.sim.fleet.router import Router, RouterError
from engine_adapter.sim.run_state import SimResult
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.workloads import SimRequest, Workload
from sage_eviction import PolicyConfigError, get_policy_class
from sage_eviction.metrics import percentile

__all__ = ["FleetResult", "FleetRun", "Observer", "simulate_fleet"]

Observer = Callable[[SimRequest, float, list[Replica], int], None]
"""Sees each routing decision: the request, its arrival, the replicas, the chosen index."""


@dataclass(slots=True)
class FleetResult:
    """One fleet row: a router over `replicas` replicas, each a `policy` cache of `capacity_blocks`."""

    router: str
    replicas: int
    policy: str
    capacity_blocks: int
    cache_model: str
    requests: int
    block_lookups: int
    block_hits: int
    block_hit_ratio: float
    hit_rate: float
    load_spread: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    throughput_tok_s: float
    evictions: int
    preemptions: int
    wall_s: float
    router_params: dict[str, Any] = field(default_factory=dict)
    routed: list[int] = field(default_factory=list)  # requests per replica

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class FleetRun:
    """A finished replay: the row, each replica's own row, and where each request went."""

    result: FleetResult
    replica_results: list[SimResult]
    assignment: list[int]
    ttft_s: list[float]  # every request's TTFT, sorted
    policy_calls: str = "python"  # how the replicas' caches called the policy (`Simulator.policy_calls`)


def simulate_fleet(
    workload: Workload,
    replicas: int,
    router: str = "round_robin",
    policy: str = "lru",
    capacity_blocks: int | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    progress_every: int = 1000,
    observer: Observer | None = None,
    **options: Any,
) -> FleetRun:
    """Replay `workload` over `replicas` engines behind `router` (a ``name:k=v`` spec).

    Args:
        workload: The requests, in arrival order.
        replicas: Engines in the fleet (>= 1).
        router: The router spec (`registry.ROUTERS`).
        policy: Each replica's eviction policy (an online one).
        capacity_blocks: Each replica's cache in blocks.
        progress: Called with the requests routed so far, every `progress_every`.
        observer: Called at each decision, before the request joins its replica, with the
            request, the time, the replicas and the chosen index (the tests check routers so).
        **options: `Simulator` keyword options of each replica (``cost_model``,
            ``max_running``, ``max_prefill_tokens``, ``protect_queued``, ``compiled``).

    Raises:
        ValueError: Fewer than one replica, a bad router spec (`RouterError`), an offline
            policy or ``unbounded``, or what `Simulator` refuses (a capacity too small).
    """
    if type(replicas) is not int or replicas < 1:
        raise ValueError(f"replicas={replicas!r}: a fleet needs at least one replica")
    name, params = parse_router(router)
    _check_policy(policy)
    if (
        not model_traits(options.get("cache_model", "radix")).radix_options
        or options.get("tiers") is not None
    ):
        raise ValueError("the fleet runs the radix cache model without KV tiers")
    collecting = gc.isenabled()
    gc.disable()  # as `Simulator.run`: no cycles in the records, full collections cost a lot
    try:
        hooks = (progress, progress_every, observer)
        return _replay(workload, replicas, (name, params), policy, capacity_blocks, hooks, options)
    finally:
        if collecting:
            gc.enable()


def _check_policy(policy: str) -> None:
    try:
        get_policy_class(policy.split(":", 1)[0], online=True)
    except PolicyConfigError as exc:
        raise ValueError(f"the fleet runs online policies only: {exc}") from None


def _replay(
    workload: Workload,
    n: int,
    spec: tuple[str, dict[str, Any]],
    policy: str,
    capacity: int | None,
    hooks: tuple[Callable[[int], None] | None, int, Observer | None],
    options: dict[str, Any],
) -> FleetRun:
    from engine_adapter.sim.fleet.registry import ROUTERS

    name, params = spec
    progress, progress_every, observer = hooks
    wall0 = time.perf_counter()
    requests = workload.requests
    first = requests[0].arrival_s if requests else 0.0
    template = Simulator(workload, policy, capacity, **options)  # checks the options once
    # A shallow copy shares the settings; each replica's run state and cache are its own (`start_run`).
    fleet = [Replica(i, copy.copy(template), first) for i in range(n)]
    chooser: Router = ROUTERS[name](fleet, **params)
    assignment: list[int] = []
    every = max(1, progress_every)
    for done, request in enumerate(requests, 1):
        now = request.arrival_s
        for replica in fleet:
            st = replica.state
            # Only a replica with work whose step ends before the arrival has steps to run
            # (skipping the others changes nothing and saves most calls at 64 replicas).
            if st.clock < now and (st.running or st.waiting or st.next_arrival < len(st.requests)):
                replica.advance(now, now)
        index = chooser.route(request, now)
        if not 0 <= index < n:
            raise RouterError(f"router {name!r} chose replica {index} of {n}")
        if observer is not None:
            observer(request, now, fleet, index)
        fleet[index].submit(request, chooser.expected_uncached(request, index))
        assignment.append(index)
        if progress is not None and done % every == 0:
            progress(done)
    wall = time.perf_counter() - wall0
    rows = [replica.finish(wall) for replica in fleet]
    wall = time.perf_counter() - wall0
    ttfts = list(heapq.merge(*(replica.state.ttfts for replica in fleet)))
    result = _fleet_row(fleet, rows, ttfts, name, chooser.params, policy, wall)
    result.routed = [len(replica.state.requests) for replica in fleet]
    calls = "; ".join(sorted({replica.simulator.policy_calls for replica in fleet}))
    return FleetRun(result, rows, assignment, ttfts, calls)


def _fleet_row(
    fleet: list[Replica],
    rows: list[SimResult],
    ttfts: list[float],
    router: str,
    params: dict[str, Any],
    policy: str,
    wall: float,
) -> FleetResult:
    states = [replica.state for replica in fleet]
    tpots = sorted(t for st in states for t in st.tpots)
    served = [st.total_tokens for st in states]
    mean = sum(served) / len(served)
    makespan = max(st.clock for st in states) - states[0].first_arrival
    lookups = sum(st.block_lookups for st in states)
    looked_up = sum(st.tokens_looked_up for st in states)
    return FleetResult(
        router=router,
        replicas=len(fleet),
        policy=rows[0].policy,
        capacity_blocks=rows[0].capacity_blocks,
        cache_model="radix",
        requests=sum(st.finished for st in states),
        block_lookups=lookups,
        block_hits=sum(st.block_hits for st in states),
        block_hit_ratio=sum(st.block_hits for st in states) / lookups if lookups else 0.0,
        hit_rate=sum(st.tokens_hit for st in states) / looked_up if looked_up else 0.0,
        load_spread=max(served) / mean if mean > 0 else math.nan,
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p99_s=percentile(ttfts, 0.99),
        tpot_p50_s=percentile(tpots, 0.5),
        tpot_p99_s=percentile(tpots, 0.99),
        throughput_tok_s=sum(served) / makespan if makespan > 0 else 0.0,
        evictions=sum(row.evictions for row in rows),
        preemptions=sum(row.preemptions for row in rows),
        wall_s=wall,
        router_params=dict(params),
    )
