"""``sage llm benchmark`` (``--mode sim``): the policies in the trace-driven simulator.

The checked options go, as keyword arguments, to
``engine_adapter.sim.benchmark.run_benchmark(**options)``, imported only then: the simulator
loads for this command alone.

The contract with the simulator: ``run_benchmark`` takes the keyword arguments of
`BenchmarkOptions` (see `BenchmarkOptions.as_kwargs`), shows its own progress on stderr, writes
``output`` (JSON) and ``plot`` (PNG) when they are set, and returns a JSON-able dict with a
``"results"`` list of flat dicts (one per policy and capacity), which the CLI prints as a table
(or the whole dict with ``--json``). Its bad-input error, ``BenchmarkError``, is reported as one
line with exit code 2 (`sage_cli.errors`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sage_cli.benchmark.checks import BenchmarkPlan
from sage_cli.benchmark.options import BenchmarkArgs
from sage_cli.benchmark.table import results_table
from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.output import Output

__all__ = ["BenchmarkOptions", "run_in_simulator"]


@dataclass(frozen=True)
class BenchmarkOptions:
    """The checked options, as ``run_benchmark`` receives them."""

    policies: list[str]
    mode: str
    trace: Path | None
    trace_format: str | None
    workload: str | None
    requests: int | None
    tenants: int | None
    seed: int
    capacity_blocks: list[int] | None
    capacity_ratios: list[float] | None
    cache_model: str
    duration: float | None
    output: Path | None
    plot: Path | None
    cost_model: dict[str, Any] | None
    cost_model_path: Path | None
    protect_queued: float = 0.0
    adaptive_batch: bool = False
    jobs: int | None = None
    ray_address: str | None = None
    host_capacity_ratio: float | None = None
    host_eviction_policies: list[str] | None = None
    disk_capacity_ratio: float | None = None
    host_write_policy: str = "write_back"
    host_link: str | None = None
    disk_link: str | None = None
    time_scale: float = 0.0
    prefetch_ratio: float = 0.0
    replicas: list[int] | None = None
    routers: list[str] | None = None
    compress_on_evict: str | None = None
    block_size: int | None = None
    schedule_policy: str = "fcfs"

    def as_kwargs(self) -> dict[str, Any]:
        return asdict(self)


def simulator_options(args: BenchmarkArgs, plan: BenchmarkPlan) -> BenchmarkOptions:
    """What ``run_benchmark`` receives for these options."""
    source = plan.source
    return BenchmarkOptions(
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
        cache_model=args.cache_model.value,
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
        schedule_policy=args.schedule_policy.value,
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
        from engine_adapter.sim.benchmark import run_benchmark
    except ImportError as exc:
        raise CLIError(
            f"the benchmark needs engine_adapter.sim.benchmark, which cannot be loaded: {exc}"
        ) from exc
    result = run_benchmark(**options.as_kwargs())
    if isinstance(result, dict):
        Output(args.json_out).result(result, lambda: results_table(result), wide=True)
