"""``sage llm benchmark`` (``--mode sim``): the policies in the trace-driven simulator.

The checked options go to the simulator's library, ``engine_adapter.sim.api.simulate`` (what a
notebook calls: one implementation under both), imported only then: the simulator loads for this
command alone. They are the fields of ``engine_adapter.sim.benchmark.SimBenchmarkOptions``
(`simulator_options`); the ones that say where the requests come from make its `Trace`.

``simulate`` shows its own progress on stderr, writes ``output`` (JSON) and ``plot`` (PNG) when
they are set, and returns the benchmark's JSON document, whose ``"results"`` rows the CLI prints
as a table (or the whole document with ``--json``). Its bad-input error, ``BenchmarkError``, is
reported as one line with exit code 2 (`sage_cli.errors`).
"""

from __future__ import annotations

import warnings
from typing import Any

from sage_cli.benchmark.checks import BenchmarkPlan
from sage_cli.benchmark.options import BenchmarkArgs
from sage_cli.benchmark.table import results_table
from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.output import Output

__all__ = ["run_in_simulator", "simulator_options"]


def simulator_options(args: BenchmarkArgs, plan: BenchmarkPlan) -> dict[str, Any]:
    """The simulator's options for these arguments: the fields of
    `engine_adapter.sim.benchmark.SimBenchmarkOptions` (declared there once), as keywords."""
    source = plan.source
    return dict(
        policies=plan.policies,
        mode=args.mode.value,
        trace=source.trace,
        trace_format=source.trace_format,
        workload=source.workload,
        requests=source.requests,
        tenants=source.tenants,
        seed=source.seed,
        capacity_blocks=plan.capacity_blocks,
        capacity_ratios=plan.capacity_ratios,
        cache_model=args.cache_model,
        duration=source.duration,
        output=args.output,
        plot=args.plot,
        cost_model=plan.cost_model,
        cost_model_path=args.cost_model,
        protect_queued=args.protect_queued,
        adaptive_batch=args.adaptive_batch,
        jobs=args.jobs,
        ray_address=args.ray_address,
        host_capacity_ratio=None if plan.tiers is None else plan.tiers.host_capacity_ratio,
        host_eviction_policies=None if plan.tiers is None else plan.tiers.host_eviction_policies,
        disk_capacity_ratio=None if plan.tiers is None else plan.tiers.disk_capacity_ratio,
        host_write_policy=args.host_write_policy,
        host_link=args.host_link,
        disk_link=args.disk_link,
        time_scale=args.time_scale,
        prefetch_ratio=args.prefetch_ratio,
        replicas=_replicas(args.replicas),
        routers=_routers(args.router),
        compress_on_evict=args.compress_on_evict,
        block_size=args.block_size,
        schedule_policy=args.schedule_policy,
        preemption_order=args.preemption_order,
    )


def _replicas(text: str | None) -> list[int] | None:
    """``--replicas N[,N...]``: fleet sizes as numbers (the simulator checks each is at least 1)."""
    if text is None:
        return None
    sizes: list[int] = []
    for item in text.split(","):
        try:
            sizes.append(int(item.strip()))
        except ValueError:
            raise CLIUsageError(f"--replicas: {item.strip()!r} is not a number of replicas") from None
    return sizes


def _routers(text: str | None) -> list[str] | None:
    """``--router NAME[,NAME...]``: router specs, checked against the fleet's routers."""
    if text is None:
        return None
    from engine_adapter.sim.fleet.registry import split_router_specs
    from engine_adapter.sim.fleet.router import RouterError

    try:
        return split_router_specs(text)
    except RouterError as exc:
        raise CLIUsageError(str(exc)) from None


def run_in_simulator(args: BenchmarkArgs, plan: BenchmarkPlan) -> None:
    """Run the plan in the simulator; print its rows as the table (or JSON)."""
    options = simulator_options(args, plan)
    try:
        from engine_adapter.sim.api import TRACE_OPTIONS, SaturationWarning, Trace, simulate
    except ImportError as exc:
        raise CLIError(f"the benchmark needs engine_adapter.sim.api, which cannot be loaded: {exc}") from exc
    trace = Trace({key: options.pop(key) for key in TRACE_OPTIONS})
    policies = options.pop("policies")
    capacities, ratios = options.pop("capacity_blocks"), options.pop("capacity_ratios")
    with warnings.catch_warnings():  # the table prints the saturation warnings itself, once
        warnings.simplefilter("ignore", SaturationWarning)
        result = simulate(trace, policies, capacities=capacities, capacity_ratios=ratios, **options).raw
    Output(args.json_out).result(result, lambda: results_table(result), wide=True)
