"""``sage llm benchmark --mode sim``: every policy at every capacity on one workload, plus references.

`run_benchmark` (and `run_sweep`, which also returns the rows' TTFT quantiles for a plot; the
library of `engine_adapter.sim.api` calls it) takes the checked options of
`sage_cli.benchmark.BenchmarkOptions` as keyword arguments (the fields of `SimBenchmarkOptions`),
builds the workload (a Mooncake or Azure trace,
the synthetic generator or the module spec's preset), runs a `Simulator` for each policy and
capacity (in this process, in `jobs` worker processes or as Ray tasks:
`engine_adapter.sim.sweep`), and adds two reference
rows at every capacity: ``unbounded`` (a cache holding every distinct block, never evicting;
its `capacity_blocks` is the workload's distinct blocks) and ``belady`` (offline; see
`engine_adapter.sim.simulator` for its radix variant and for what each reference row bounds:
``unbounded`` is the ceiling of every row's hit rate). `throughput_impact` of a row is
``1 - throughput / throughput(unbounded)`` on the same workload (docs/architecture.md, "Metrics").

With a host tier (`host_capacity_ratio`; docs/architecture.md, "Tiers"), each online policy at
each device capacity also runs once per host policy (`host_eviction_policies`) with a host tier
of that fraction of the distinct blocks under it (and a disk tier with `disk_capacity_ratio`),
beside its device-only row; Belady then gets a second reference row over the total capacity
(device + host + disk, no tiers), the bound of what any split of that memory can hit.

Every row runs through `CacheManager` and the registered policy (not the simulator's lean LRU
path), so `eviction_p50_us`/`eviction_p99_us` time the same kind of code in every row.

Returns ``{"workload": Workload.describe(), "settings": {...}, "results": [row, ...],
"saturation": {...}, "run": {...}}`` and writes the same as JSON to `output`; ``saturation``
names the rows whose median TTFT is queueing rather than prefill, with a one-line warning for
each case (`engine_adapter.sim.saturation`). `plot` gets a PNG of hit rate against the capacity
ratio per policy and of each cache size's TTFT CDF (`engine_adapter.sim.plot`).
A Rich progress bar on stderr shows the runs (and the requests of each) while they go; the
result's ``run`` block says how they ran (executor, workers, the core's implementation).

Bad input raises `BenchmarkError` (a `ValueError`) with a one-line message: an unreadable or
malformed trace, a capacity below 1 or beyond the workload's distinct blocks, a bad cost model,
missing matplotlib for `plot`.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine_adapter.cache.compressed import parse_compress_spec
from engine_adapter.cache.tiers import WRITE_POLICIES
from engine_adapter.sim.benchmark_inputs import (
    DEFAULT_CAPACITY_RATIOS,
    BenchmarkError,
    build_workload,
    capacities_for,
)
from engine_adapter.sim.cache_model_kinds import model_traits
from engine_adapter.sim.cost_model import CostModel, CostModelError
from engine_adapter.sim.cost_models import shipped_cost_model
from engine_adapter.sim.saturation import saturation
from engine_adapter.sim.simulator import UNBOUNDED
from engine_adapter.sim.sweep import (
    Executor,
    RowOutcome,
    RowSpec,
    SweepContext,
    run_rows,
    usable_cores,
)
from engine_adapter.sim.sweep_bar import SweepBar, sweep_progress
from engine_adapter.sim.workloads import Workload, unique_blocks
from sage_eviction.preemption import POLICY

__all__ = [
    "DEFAULT_CAPACITY_RATIOS",
    "BenchmarkError",
    "SimBenchmarkOptions",
    "build_workload",
    "capacities_for",
    "SweepRun",
    "run_benchmark",
    "run_sweep",
]

REFERENCE_BELADY = "belady"


def _cost_model(
    cost_model: dict[str, Any] | None,
    cost_model_path: str | Path | None,
    host_link: str | None = None,
    disk_link: str | None = None,
) -> CostModel:
    try:
        costs = CostModel()
        if cost_model is not None:
            costs = CostModel.from_dict(cost_model, where=str(cost_model_path or "cost model"))
        elif cost_model_path is not None:
            shipped = None if Path(cost_model_path).exists() else shipped_cost_model(str(cost_model_path))
            costs = CostModel.from_yaml(shipped if shipped is not None else cost_model_path)
        return costs.with_links(host_link, disk_link)
    except CostModelError as exc:
        raise BenchmarkError(str(exc)) from None


def _check_options(mode: str, cache_model: str, plot: str | Path | None, adaptive_batch: bool) -> None:
    if mode != "sim":
        raise BenchmarkError("engine mode is run by the CLI against a live engine, not by the simulator")
    try:
        traits = model_traits(cache_model)
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None
    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchmarkError(
                "--plot needs matplotlib: install matplotlib (pip install 'sage-kv[plot]')"
            ) from None
    if adaptive_batch and not traits.radix_options:
        raise BenchmarkError(f"--adaptive-batch needs --cache-model radix (not in the {cache_model} model)")


def _check_sglang_policies(policies: Sequence[str]) -> None:
    """The sglang model's policies are SGLang's eviction strategies (``slru:protected_threshold=3``)
    or sage policies plugged into SGLang (``sage-s3fifo``)."""
    from engine_adapter.sim.twins.sglang_model import check_sglang_policy

    for spec in policies:
        if spec.split(":", 1)[0] == REFERENCE_BELADY:
            continue  # the reference rows are left out of the sglang model
        try:
            check_sglang_policy(spec)
        except ValueError as exc:
            raise BenchmarkError(f"--cache-model sglang: {exc}") from None


def _check_schedule_policy(policy: str, cache_model: str) -> None:
    """A queue order is SGLang's: the sglang model has them (`SCHEDULE_POLICIES`), the others
    admit first come, first served."""
    from engine_adapter.sim.twins.sglang_queue import SCHEDULE_POLICIES

    if policy not in SCHEDULE_POLICIES:
        raise BenchmarkError(
            f"--schedule-policy {policy}: the sglang model has {', '.join(SCHEDULE_POLICIES)}"
        )
    if policy != "fcfs" and not model_traits(cache_model).queue_orders:
        raise BenchmarkError(f"--schedule-policy {policy} is SGLang's: it needs --cache-model sglang")


def _simulate_rows(context: SweepContext, runs: list[RowSpec], executor: Executor) -> list[RowOutcome]:
    """One simulation per (policy, capacity), by `executor`, under one progress bar; in `runs`' order."""
    n_requests = len(context.workload.requests)
    run = executor.describe(len(runs))
    where = {"processes": f" on {run.get('workers')} processes", "ray": " on Ray"}.get(run["executor"], "")
    try:
        with sweep_progress() as progress:
            return run_rows(context, runs, executor, SweepBar(progress, len(runs), n_requests, where))
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def _compress_spec(opts: SimBenchmarkOptions) -> str | None:
    """The compressed rows' ``PRESS:RATIO``, checked (None: no such rows)."""
    if opts.compress_on_evict is None:
        return None
    if not model_traits(opts.cache_model).radix_options:
        raise BenchmarkError("--compress-on-evict needs --cache-model radix (the flat model has no tree)")
    try:
        return str(parse_compress_spec(opts.compress_on_evict))
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def _runs(
    policies: Sequence[str],
    capacities: list[int],
    adaptive_batch: bool,
    tiers: _TierRows | None = None,
    fleet: tuple[list[int], list[str]] | None = None,
    compress: str | None = None,
) -> list[RowSpec]:
    """The rows in the order of the results: per capacity each online policy (and its
    adaptive-batch twin, and its rows over each host policy) and Belady (and Belady over the total
    capacity with tiers), then the unbounded reference (every row's throughput is relative to
    it). Workers take rows in this order, so the cheapest row, unbounded (it never evicts), comes
    last and fills a gap rather than leaving one at the end of the sweep. A fleet's rows: replicas
    x capacities x policies x routers."""
    if fleet is not None:  # replicas x capacities x policies x routers; no reference rows
        grid = itertools.product(fleet[0], capacities, policies, fleet[1])
        return [RowSpec(i, p, size, router=r, replicas=n) for i, (n, size, p, r) in enumerate(grid)]
    online = [p for p in policies if p.split(":", 1)[0] != REFERENCE_BELADY]
    rows: list[dict[str, Any]] = []
    for size in capacities:
        for policy in online:
            rows.append({"policy": policy, "capacity": size})
            if adaptive_batch:
                rows.append({"policy": policy, "capacity": size, "adaptive": True})
            if compress is not None:  # the same row, compressing what it would drop
                rows.append({"policy": policy, "capacity": size, "compress": compress})
            if tiers is not None:
                prefetch = int(size * tiers.prefetch_ratio)
                for host_policy in tiers.host_policies:
                    row = {"policy": policy, "capacity": size, "host_policy": host_policy, **tiers.blocks}
                    rows.append({**row, "prefetch_blocks": prefetch})
        rows.append({"policy": REFERENCE_BELADY, "capacity": size})
        if tiers is not None:
            total = min(size + tiers.blocks["host_blocks"] + tiers.blocks["disk_blocks"], tiers.unique)
            rows.append({"policy": REFERENCE_BELADY, "capacity": total})
    rows.append({"policy": UNBOUNDED, "capacity": None})
    return [RowSpec(index, **row) for index, row in enumerate(rows)]


def _online_only(runs: list[RowSpec], cache_model: str) -> list[RowSpec]:
    """An engine's model (a twin, or the sglang cache model) runs what the engine can: no
    offline reference row (SGLang and vLLM order their evictions themselves)."""
    if not model_traits(cache_model).online_only:
        return runs
    return [replace(row, index=i) for i, row in enumerate(r for r in runs if r.policy != REFERENCE_BELADY)]


@dataclass(frozen=True, slots=True)
class _TierRows:
    """What the tiered rows of a sweep share: the host policies and the tiers' sizes in blocks."""

    host_policies: tuple[str, ...]
    blocks: dict[str, int]  # host_blocks, disk_blocks
    unique: int  # the workload's distinct blocks (Belady's total capacity stops there)
    prefetch_ratio: float = 0.0  # of each row's device pool, for queued requests' prefetches


def _tier_rows(opts: SimBenchmarkOptions, workload: Workload) -> _TierRows | None:
    """The tiered rows' settings from the options, or None without a host tier.

    Raises:
        BenchmarkError: A ratio outside (0, 1], a disk tier without a host tier, tiers with the
            flat model, an unknown write policy or link, or no host policy.
    """
    host, disk = opts.host_capacity_ratio, opts.disk_capacity_ratio
    if host is None:
        if disk is not None or opts.host_eviction_policies:
            raise BenchmarkError(
                "--disk-capacity-ratio and --host-eviction-policies need --host-capacity-ratio"
            )
        return None
    for name, ratio in (("--host-capacity-ratio", host), ("--disk-capacity-ratio", disk)):
        if ratio is not None and not 0.0 < ratio <= 1.0:
            raise BenchmarkError(f"{name} {ratio!r} is not in (0, 1]")
    if not 0.0 <= opts.prefetch_ratio <= 1.0:
        raise BenchmarkError(f"--prefetch-ratio {opts.prefetch_ratio!r} is not in [0, 1]")
    if not model_traits(opts.cache_model).radix_options:
        raise BenchmarkError("KV tiers need --cache-model radix (the flat model has no tree to demote from)")
    if opts.host_write_policy not in WRITE_POLICIES:
        raise BenchmarkError(
            f"write policy {opts.host_write_policy!r}; write policies: {', '.join(WRITE_POLICIES)}"
        )
    policies = tuple(opts.host_eviction_policies or ("lru",))
    unique = unique_blocks(workload.requests)
    blocks = {"host_blocks": max(1, int(unique * host)), "disk_blocks": int(unique * disk) if disk else 0}
    return _TierRows(policies, blocks, unique, opts.prefetch_ratio)


@dataclass(frozen=True, slots=True)
class SimBenchmarkOptions:
    """The options of `run_sweep` (what ``sage llm benchmark --mode sim`` passes through
    `engine_adapter.sim.api.simulate`).

    Attributes:
        policies: Policy specs (registry names, optionally ``name:k=v``).
        mode: ``"sim"``; ``"engine"`` is run by the CLI against a live engine.
        trace: A trace file; otherwise `workload` is generated.
        trace_format: ``"mooncake"`` or ``"azure"`` (default: from the file name).
        workload: ``"synthetic"`` (default) or a preset (``"spec"``).
        requests: Requests to generate, or to take from the start of the trace.
        tenants: Tenants of a generated workload.
        seed: Seed of a generated workload.
        capacity_blocks: Cache sizes in blocks.
        capacity_ratios: Cache sizes as fractions of the distinct blocks (default 0.05, 0.10).
        cache_model: ``"radix"``, ``"flat"``, ``"sglang"`` (SGLang's radix cache in the event loop;
            its policies are SGLang's eviction strategies) or an engine twin with its own loop
            (`engine_adapter.sim.twins.TWINS`: ``"vllm"``, whose capacities are vLLM's
            `num_gpu_blocks`; ``"sage"``, sage's engine scheduler). The engines' models have no
            Belady row.
        duration: Keep only the requests arriving within this many seconds of the first.
        output: Write the result here as JSON.
        plot: Write a PNG of hit rate against the capacity ratio and the TTFT CDFs here (needs
            matplotlib).
        cost_model: Cost-model fields (as read from `cost_model_path` by the CLI).
        cost_model_path: A cost-model YAML file, or a shipped one's name (``"h100-llama-1b"``:
            `engine_adapter.sim.cost_models`), read when `cost_model` is None.
        protect_queued: Radix model: fraction of the pool that queued requests' cached prefixes
            may hold protected from eviction (`Simulator`'s `protect_queued`); 0: off.
        adaptive_batch: Run each online policy twice, without and with the adaptive batch
            limit (engine_adapter.cache.adaptive_batch), side by side; radix model only.
        jobs: Worker processes for the rows (default: the usable cores; 1: this process).
        ray_address: Run the rows as Ray tasks there instead (``"local"``, ``"auto"``,
            ``"host:6379"``, ``"ray://host:10001"``; `engine_adapter.sim.sweep`).
        host_capacity_ratio: A host KV tier of this fraction of the distinct blocks under each
            online row (also run without); None: no tiers.
        host_eviction_policies: The host tier's policies, a row each (default ``lru``).
        disk_capacity_ratio: A disk tier of this fraction under the host tier (LRU).
        host_write_policy: ``write_back`` or ``write_through``.
        host_link, disk_link: Link presets of the cost model (`cost_model.LINKS`: ``pcie4``,
            ``pcie5``, ``nvme``); None keeps the cost model's.
        time_scale: Virtual seconds per second of the workload's arrivals (0: as recorded).
        prefetch_ratio: With a host tier, each step loads ahead the host/disk-resident prefixes
            of the head of the queue, within this fraction of the row's device pool (0: off).
        replicas: Fleet sizes, rows of that many replicas of the capacity (`engine_adapter.sim.fleet`).
        routers: The fleet's router specs (``name:k=v``; default ``round_robin``).
        compress_on_evict: ``PRESS:RATIO``: each online row runs again with evicted prefixes
            compressed instead of dropped (radix model; "compress or drop"); None: off.
        block_size: Tokens per block of a generated workload (None: its default); a Mooncake
            trace accepts only its 512.
        schedule_policy: The sglang model's queue order (SGLang's ``--schedule-policy``:
            ``fcfs``, ``lpm``, ``dfs-weight``); the other models admit first come, first served.
        preemption_order: The radix model's scheduler: which running request it preempts first, a
            name in `sage_eviction.preemption.ORDERS`, or ``policy``: each policy's own order.
    """

    policies: Sequence[str]
    mode: str = "sim"
    trace: str | Path | None = None
    trace_format: str | None = None
    workload: str | None = None
    requests: int | None = None
    tenants: int | None = None
    seed: int = 0
    capacity_blocks: Sequence[int] | None = None
    capacity_ratios: Sequence[float] | None = None
    cache_model: str = "radix"
    duration: float | None = None
    output: str | Path | None = None
    plot: str | Path | None = None
    cost_model: dict[str, Any] | None = None
    cost_model_path: str | Path | None = None
    protect_queued: float = 0.0
    adaptive_batch: bool = False
    jobs: int | None = None
    ray_address: str | None = None
    host_capacity_ratio: float | None = None
    host_eviction_policies: Sequence[str] | None = None
    disk_capacity_ratio: float | None = None
    host_write_policy: str = "write_back"
    host_link: str | None = None
    disk_link: str | None = None
    time_scale: float = 0.0
    prefetch_ratio: float = 0.0
    replicas: Sequence[int] | None = None
    routers: Sequence[str] | None = None
    compress_on_evict: str | None = None
    block_size: int | None = None
    schedule_policy: str = "fcfs"
    preemption_order: str = "policy"


@dataclass(frozen=True)
class SweepRun:
    """A benchmark's result and what its plot needs beside it.

    Attributes:
        result: What `run_benchmark` returns (and writes as JSON).
        ttft_quantiles: Each row's TTFT quantiles at 0, 1, ..., 100 % (empty for a row without).
    """

    result: dict[str, Any]
    ttft_quantiles: list[tuple[float, ...]]


def run_benchmark(**options: Any) -> dict[str, Any]:
    """`run_sweep`'s result (the fields of `SimBenchmarkOptions` as keywords): the benchmark's
    JSON document."""
    return run_sweep(**options).result


def _policy_calls(outcomes: Sequence[RowOutcome]) -> dict[str, str]:
    """Each row policy's path: "c-state" when it ran in C with its state (the flat cache's
    `FlatState`), "compiled" when its calls ran through its C table, else "python" (joined when
    its rows differ, e.g. a radix row and a flat one)."""
    paths: dict[str, set[str]] = {}
    for outcome in outcomes:
        paths.setdefault(str(outcome.row.get("policy")), set()).add(outcome.policy_calls)
    return {policy: "; ".join(sorted(found)) for policy, found in paths.items()}


def _python_loops(outcomes: Sequence[RowOutcome]) -> dict[str, str]:
    """The policies with rows in the Python event loop -> why (joined when their rows differ): the
    table says so under the rows, the JSON beside them (each row's ``event_loop``). Rows that ran
    in Python because the compiled core is not built (or `SAGE_PURE_PYTHON`) are left out: the
    run's ``implementation`` says that once for all of them."""
    found: dict[str, set[str]] = {}
    for outcome in outcomes:
        why = outcome.event_loop.removeprefix("python (").removesuffix(")")
        slow = outcome.event_loop != "compiled" and not why.startswith("pure-python")
        if slow and outcome.row.get("policy") != UNBOUNDED:
            found.setdefault(str(outcome.row.get("policy")), set()).add(why)
    return {policy: "; ".join(sorted(whys)) for policy, whys in found.items()}


def _labelled_rows(outcomes: Sequence[RowOutcome], runs: Sequence[RowSpec]) -> list[dict[str, Any]]:
    """The rows, each labelled with its spec's params (``slru:protected_threshold=3``: a model
    names a row by its policy alone, and two rows of one policy must be told apart) and saying
    how its policy was called (``policy_calls``: "python" for a policy class of the session)."""
    rows = []
    for outcome, spec in zip(outcomes, runs, strict=True):
        row = outcome.row
        params = ",".join(filter(None, (p.strip() for p in spec.policy.partition(":")[2].split(","))))
        if params:
            row["policy"] = f"{row['policy']}:{params}"
        row["policy_calls"] = outcome.policy_calls
        row["event_loop"] = outcome.event_loop
        rows.append(row)
    return rows


def run_sweep(**options: Any) -> SweepRun:
    """Run every policy at every capacity on one workload, with the reference rows.

    Args:
        **options: The fields of `SimBenchmarkOptions` (`policies` is required).

    Returns:
        The result ``{"workload": {...}, "settings": {...}, "results": [row, ...], "saturation":
        {...}, "run": {...}}`` (rows as `SimResult`) and the rows' TTFT quantiles. ``run`` says
        how it ran (executor, workers, implementation of the core, wall seconds): the one part
        besides the rows' wall times that `jobs` and `ray_address` change.

    Raises:
        BenchmarkError: Options it cannot run with (one-line message).
        SweepError: The executor cannot run the rows (Ray missing or unreachable).
        TypeError: An option that is not a field of `SimBenchmarkOptions`, or no `policies`.
    """
    opts = SimBenchmarkOptions(**options)
    _check_options(opts.mode, opts.cache_model, opts.plot, opts.adaptive_batch)
    costs = _cost_model(opts.cost_model, opts.cost_model_path, opts.host_link, opts.disk_link)
    fleet = _fleet(opts)
    built = _workload(opts)
    capacities = capacities_for(built, opts.capacity_blocks, opts.capacity_ratios, opts.cache_model)
    executor = _executor(opts)
    tiers = _tier_rows(opts, built)
    if model_traits(opts.cache_model).queue_orders:  # SGLang's model: SGLang's strategies
        _check_sglang_policies(opts.policies)
    _check_schedule_policy(opts.schedule_policy, opts.cache_model)
    runs = _runs(opts.policies, capacities, opts.adaptive_batch, tiers, fleet, _compress_spec(opts))
    runs = _online_only(runs, opts.cache_model)
    wall0 = time.perf_counter()
    context = SweepContext(
        built, opts.cache_model, costs, opts.protect_queued, opts.host_write_policy, opts.schedule_policy,
        opts.preemption_order,
    )  # fmt: skip
    outcomes = _simulate_rows(context, runs, executor)
    rows = _labelled_rows(outcomes, runs)
    run = {
        **executor.describe(len(runs)),
        "implementation": "; ".join(sorted({outcome.implementation for outcome in outcomes})),
        "policy_calls": _policy_calls(outcomes),
        "python_loops": _python_loops(outcomes),
        "wall_s": time.perf_counter() - wall0,
    }
    _set_throughput_impact(rows)
    result = {
        "workload": built.describe(),
        "settings": _settings(opts, capacities, costs, tiers, fleet),
        "results": rows,
        # Its message reads against the unbounded row, which a fleet sweep has not.
        "saturation": saturation(rows, built, costs, UNBOUNDED) if fleet is None else {"warnings": []},
        "run": run,
    }
    _write_output(result, opts.output)
    quantiles = [outcome.ttft_quantiles_s for outcome in outcomes]
    if opts.plot is not None:
        _plot(result, quantiles, opts.plot)
    return SweepRun(result, quantiles)


def _workload(opts: SimBenchmarkOptions) -> Workload:
    """The workload the options describe (`build_workload`)."""
    return build_workload(
        trace=opts.trace,
        trace_format=opts.trace_format,
        workload=opts.workload,
        requests=opts.requests,
        tenants=opts.tenants,
        seed=opts.seed,
        duration=opts.duration,
        time_scale=opts.time_scale,
        block_size=opts.block_size,
    )


def _settings(
    opts: SimBenchmarkOptions,
    capacities: list[int],
    costs: CostModel,
    tiers: _TierRows | None,
    fleet: tuple[list[int], list[str]] | None = None,
) -> dict[str, Any]:
    """The JSON's ``settings``: what the sweep ran with."""
    tier_settings: dict[str, Any] | None = None
    if tiers is not None:
        tier_settings = {
            "host_policies": list(tiers.host_policies),
            "write_policy": opts.host_write_policy,
            "prefetch_ratio": tiers.prefetch_ratio,
        }
        tier_settings.update(tiers.blocks)
    return {
        "tiers": tier_settings,
        "mode": opts.mode,
        "cache_model": opts.cache_model,
        "block_size": opts.block_size,
        "policies": list(opts.policies),
        "capacities": capacities,
        "cost_model": costs.to_dict(),
        "protect_queued": opts.protect_queued,
        "adaptive_batch": opts.adaptive_batch,
        "fleet": None if fleet is None else {"replicas": fleet[0], "routers": fleet[1]},
        **({"compress_on_evict": opts.compress_on_evict} if opts.compress_on_evict else {}),
        **({"schedule_policy": opts.schedule_policy} if model_traits(opts.cache_model).queue_orders else {}),
        **({"preemption_order": opts.preemption_order} if opts.preemption_order != POLICY else {}),
    }


def _plot(result: dict[str, Any], ttft_quantiles: list[tuple[float, ...]], path: str | Path) -> None:
    """``--plot``: hit rate against the capacity ratio and each size's TTFT CDF (`plot`)."""
    from engine_adapter.sim.plot import write_plot

    workload = result["workload"]
    model = result["settings"]["cache_model"]
    title = f"{workload['source']}: {workload['requests']:,} requests ({model} model)"
    try:
        write_plot(result["results"], ttft_quantiles, workload["unique_blocks"], path, title)
    except ImportError:
        raise BenchmarkError(
            "--plot needs matplotlib: install matplotlib (pip install 'sage-kv[plot]')"
        ) from None
    except OSError as exc:
        raise BenchmarkError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _fleet(opts: SimBenchmarkOptions) -> tuple[list[int], list[str]] | None:
    """The fleet sizes and router specs, checked (`engine_adapter.sim.fleet.plan`), or None for
    one engine per row. A fleet runs online policies in the radix model, without tiers, the
    adaptive batch or compress-on-evict."""
    from engine_adapter.sim.fleet.plan import fleet_plan

    refused = (
        f"the {opts.cache_model} cache model" if not model_traits(opts.cache_model).radix_options
        else "KV tiers" if opts.host_capacity_ratio is not None
        else "--adaptive-batch" if opts.adaptive_batch
        else "--compress-on-evict" if opts.compress_on_evict
        else None
    )  # fmt: skip
    try:
        return fleet_plan(opts.replicas, opts.routers, opts.policies, refused, (REFERENCE_BELADY, UNBOUNDED))
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def _executor(opts: SimBenchmarkOptions) -> Executor:
    """The executor of the rows, once `protect_queued` is checked against the cache model."""
    if not 0.0 <= opts.protect_queued <= 1.0:
        raise BenchmarkError(f"protect_queued={opts.protect_queued!r} must be within [0, 1]")
    if opts.protect_queued > 0 and not model_traits(opts.cache_model).radix_options:
        raise BenchmarkError("protect_queued needs the radix cache model (the flat model has no queue)")
    try:
        return Executor(jobs=usable_cores() if opts.jobs is None else opts.jobs, ray_address=opts.ray_address)
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def _set_throughput_impact(rows: list[dict[str, Any]]) -> None:
    """Each row's `throughput_impact` against the unbounded row (the last; a fleet has none)."""
    if rows[-1]["policy"] != UNBOUNDED:
        return
    reference = rows[-1]["throughput_tok_s"]
    for row in rows:
        impact = 1.0 - row["throughput_tok_s"] / reference if reference > 0 else 0.0
        row["throughput_impact"] = 0.0 if math.isclose(impact, 0.0, abs_tol=1e-12) else impact


def _write_output(result: dict[str, Any], output: str | Path | None) -> None:
    if output is None:
        return
    try:
        Path(output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BenchmarkError(f"{output}: cannot write: {exc.strerror or exc}") from None
