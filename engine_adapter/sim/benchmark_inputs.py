"""The benchmark's inputs: the workload its options describe, the capacities it runs at, and
`BenchmarkError`, the one-line refusal of options it cannot run with.

`build_workload` reads a trace (streamed, all of it or its first requests) or generates one,
cut to a duration and spread in time as asked; `capacities_for` turns ``--capacity-blocks`` or
``--capacity-ratio`` into block counts, checked against the workload (its distinct blocks, its
largest request in the radix-like models). `engine_adapter.sim.benchmark` (the sweep) and
`engine_adapter.sim.api` (the library) both start here. Imports the workload sources and the
simulator's capacity rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_adapter.sim.cache_model_kinds import model_traits
from engine_adapter.sim.simulator import min_capacity
from engine_adapter.sim.sources import load
from engine_adapter.sim.synthetic import preset, synthetic
from engine_adapter.sim.workloads import Workload, WorkloadError, unique_blocks

__all__ = ["DEFAULT_CAPACITY_RATIOS", "BenchmarkError", "build_workload", "capacities_for"]


DEFAULT_CAPACITY_RATIOS = (0.05, 0.10)
"""Capacities as fractions of the workload's distinct blocks when none are given."""


class BenchmarkError(ValueError):
    """Options the benchmark cannot run with; the message is one line."""


def build_workload(
    *,
    trace: str | Path | None = None,
    trace_format: str | None = None,
    workload: str | None = None,
    requests: int | None = None,
    tenants: int | None = None,
    seed: int = 0,
    duration: float | None = None,
    time_scale: float = 0.0,
    block_size: int | None = None,
) -> Workload:
    """The request stream the options describe.

    A trace is streamed (all of it, or its first `requests` records); a generated workload has
    `requests` requests (1000 by default). With `duration`, only the requests that arrive within
    that many seconds of the first one are kept (all of them then run to completion). A positive
    `time_scale` spreads the arrivals: each comes `time_scale` virtual seconds per second of the
    trace after the first (a trace recorded on a fleet, replayed at a load one engine keeps up with).
    `block_size` (None: the source's) is the generated workloads' tokens per block; a Mooncake
    trace's hash ids stand for 512 tokens each, so it refuses any other.

    Raises:
        BenchmarkError: An unreadable or malformed trace, or a bad workload parameter.
    """
    try:
        if trace is not None:
            csv = str(trace).removesuffix(".gz").endswith(".csv")
            source = trace_format or ("azure" if csv else "mooncake")
            extra = {} if block_size is None or source == "mooncake" else {"block_size": block_size}
            built = load(source, path=trace, limit=requests, **extra)
        elif workload in (None, "synthetic"):
            params: dict[str, Any] = {"requests": requests if requests is not None else 1000, "seed": seed}
            params.update({} if block_size is None else {"block_size": block_size})
            if tenants is not None:
                params["tenants"] = tenants
            built = synthetic(**params)
        else:
            params = {"seed": seed, **({} if block_size is None else {"block_size": block_size})}
            if tenants is not None:
                params["tenants"] = tenants
            built = preset(workload, **params)
            if requests is not None:
                built.requests = built.requests[:requests]
    except WorkloadError as exc:
        raise BenchmarkError(str(exc)) from None
    _check_block_size(built, block_size)
    if duration is not None and built.requests:
        start = built.requests[0].arrival_s
        built.requests = [r for r in built.requests if r.arrival_s - start <= duration]
        built.params = {**built.params, "duration_limit_s": duration}
    if not built.requests:
        raise BenchmarkError("the workload has no requests")
    if time_scale > 0 and time_scale != 1.0:
        start = built.requests[0].arrival_s
        built.requests = [
            replace(r, arrival_s=start + (r.arrival_s - start) * time_scale) for r in built.requests
        ]
        built.params = {**built.params, "time_scale": time_scale}
    return built


def _check_block_size(built: Workload, block_size: int | None) -> None:
    """A workload read with block keys of its own size (a Mooncake trace's 512) refuses another."""
    if block_size is not None and built.block_size != block_size:
        raise BenchmarkError(
            f"--block-size {block_size}: the {built.source} trace's block keys stand for {built.block_size} "
            "tokens each and it carries no tokens to hash again"
        )


def capacities_for(
    workload: Workload,
    capacity_blocks: Sequence[int] | None,
    capacity_ratios: Sequence[float] | None,
    cache_model: str,
) -> list[int]:
    """Capacities in blocks: the ones given, or `ratio * distinct blocks` (at least 1; the default
    ratios are raised to what the largest request needs in the radix model).

    Raises:
        BenchmarkError: A capacity below 1, beyond the workload's distinct blocks, or (radix)
            below what its largest request needs. The messages name the value, not an option:
            the CLI (``--capacity-blocks``) and the library (``capacities=``) both show them.
    """
    unique = unique_blocks(workload.requests)
    if capacity_blocks:
        capacities = [int(c) for c in capacity_blocks]
    else:
        ratios = list(capacity_ratios) if capacity_ratios else list(DEFAULT_CAPACITY_RATIOS)
        for ratio in ratios:
            if not 0.0 < ratio <= 1.0:
                raise BenchmarkError(f"capacity ratio {ratio!r} is not in (0, 1]")
        capacities = [max(1, int(unique * ratio)) for ratio in ratios]
    traits = model_traits(cache_model)  # vLLM's pool keeps a null block: N blocks hold N-1
    need = min_capacity(workload) + traits.reserved_blocks if traits.holds_running else 1
    if not capacity_blocks and not capacity_ratios:
        # The default sizes grow to what the largest request needs, rather than fail.
        capacities = [min(max(capacity, need), unique) for capacity in capacities]
    for capacity in capacities:
        if capacity < 1:
            raise BenchmarkError(f"capacity {capacity} blocks is below 1")
        if capacity > unique:
            raise BenchmarkError(
                f"capacity {capacity} blocks is beyond the workload's {unique} distinct blocks "
                f"(the unbounded reference row covers that)"
            )
        if capacity < need:
            raise BenchmarkError(
                f"capacity {capacity} blocks cannot hold the workload's largest request "
                f"({need} blocks with its output) in the {cache_model} model; give at least {need} "
                f"(or the flat cache model)"
            )
    return list(dict.fromkeys(capacities))
