"""``sage llm benchmark --workload colocation``: the colocation systems side by side on the grid.

`run_colocation_benchmark` generates one workload per (ratio, load, seed) and replays it
through every system (`engine_adapter.sim.colocation.systems.SYSTEMS`), then averages each
system's metrics over the seeds into one row per (ratio, load, system). Beside the metrics of
`engine_adapter.sim.colocation.metrics` a row carries:

- ``combined_attainment_std``: its spread over the seeds;
- ``tpot_p99_no_embedding_ms`` (sage's rows): sage's TPOT P99 on the same LLM requests without
  the embedding traffic, for the issue's "TPOT holds" target;
- ``quota_direction_changes_per_min`` (systems with dynamic quotas): how often the LLM quota
  turned from growing to shrinking or back, per minute of simulated time;
- ``quota_settle_intervals`` (the shifting mix): after each step of the mix, the quota
  intervals until the LLM quota stays within the dead band of where it ends that phase.

Returns ``{"settings", "capacity", "results"}``, JSON-able; `output` gets the same as JSON.
Bad options raise `ColocationBenchmarkError` (a `ValueError`) with a one-line message.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine_adapter.colocation import ColocationParams
from engine_adapter.sim.colocation.metrics import RunResult, metrics
from engine_adapter.sim.colocation.run import run_colocation
from engine_adapter.sim.colocation.systems import SYSTEMS
from engine_adapter.sim.colocation.workload import (
    ARRIVAL_PATTERNS,
    COMPUTE_MODES,
    OUTPUT_CLASSES,
    SHIFT,
    ColocationWorkload,
    capacity,
    generate,
    parse_ratio,
)
from sage_eviction import PolicyConfigError, resolve_policy

__all__ = [
    "ColocationBenchmarkError",
    "quota_direction_changes",
    "quota_settle_intervals",
    "run_colocation_benchmark",
]


class ColocationBenchmarkError(ValueError):
    """Options the colocation benchmark cannot run with; the message is one line."""


def quota_direction_changes(trace: Sequence[tuple[float, int]]) -> int:
    """Times the quota turned from growing to shrinking or back."""
    changes, last = 0, 0
    for (_, a), (_, b) in itertools.pairwise(trace):
        step = (b > a) - (b < a)
        if step and last and step != last:
            changes += 1
        if step:
            last = step
    return changes


def quota_settle_intervals(
    trace: Sequence[tuple[float, int]],
    boundaries: Sequence[float],
    ends: Sequence[float],
    band: float,
    interval: float,
) -> float:
    """The longest settling, in quota intervals, over the phase boundaries (see the module docstring)."""

    def value_at(t: float) -> int:
        current = trace[0][1]
        for when, value in trace:
            if when > t:
                break
            current = value
        return current

    worst = 0.0
    for start, end in zip(boundaries, ends, strict=True):
        final = value_at(end)
        settled = start
        for i, (when, value) in enumerate(trace):
            if start <= when <= end and abs(value - final) > band:
                # Out of the band from this sample until the next one changes it.
                settled = trace[i + 1][0] if i + 1 < len(trace) else end
        worst = max(worst, (settled - start) / interval)
    return worst


@dataclass(frozen=True, slots=True)
class _Grid:
    """The checked options of one grid (`run_colocation_benchmark`'s arguments)."""

    ratios: Sequence[str]
    loads: Sequence[float]
    arrival: str
    output_length: str
    compute: str
    seeds: Sequence[int]
    systems: list[str]
    alpha: float
    beta: float
    gamma: float
    duration_s: float
    params: ColocationParams
    policy: str


def run_colocation_benchmark(
    *,
    ratios: Sequence[str] = ("1:9", "3:7", "5:5", "7:3", "9:1"),
    loads: Sequence[float] = (1.0,),
    arrival: str = "poisson",
    output_length: str = "medium",
    compute: str = "shared",
    seeds: Sequence[int] = (0,),
    systems: Sequence[str] | None = None,
    alpha: float = 0.5,
    beta: float = 0.5,
    gamma: float = 0.0,
    duration_s: float = 60.0,
    params: ColocationParams | None = None,
    output: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    policy: str = "lru",
) -> dict[str, Any]:
    """Run the grid (see the module docstring); `policy` (a registry spec) evicts the pool's
    cached blocks in every run.

    Raises:
        ColocationBenchmarkError: An unknown ratio, system, arrival pattern, output class or
            compute mode, a load or duration that is not positive, no seeds, an unknown or
            offline policy (the registry's message).
    """
    names = list(systems) if systems is not None else list(SYSTEMS)
    grid = _Grid(
        ratios, loads, arrival, output_length, compute, seeds, names, alpha, beta, gamma, duration_s,
        params or ColocationParams(), policy,
    )  # fmt: skip
    fractions = _checked_fractions(grid)
    # The shifting mix: the time-weighted capacity of its three phases (9:1, 1:9, 9:1).
    caps = {
        r: capacity(f, output_length, compute)
        if f is not None
        else (2 * capacity(0.9, output_length, compute) + capacity(0.1, output_length, compute)) / 3
        for r, f in fractions.items()
    }
    total = len(ratios) * len(loads) * len(seeds)
    done = 0
    rows: list[dict[str, Any]] = []
    for ratio in ratios:
        for load in loads:
            cell = _Cell(ratio, load, names)
            for seed in seeds:
                cell.run_seed(grid, seed)
                done += 1
                if progress is not None:
                    progress(done, total)
            rows += [cell.row(grid, name) for name in names]
    result = {"settings": _settings(grid), "capacity": {r: c for r, c in caps.items()}, "results": rows}
    if output is not None:
        Path(output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _checked_fractions(grid: _Grid) -> dict[str, float | None]:
    """Each ratio's LLM fraction (None: the shifting mix), once every option is checked."""
    unknown = [n for n in grid.systems if n not in SYSTEMS]
    if unknown:
        raise ColocationBenchmarkError(
            f"unknown system(s) {', '.join(unknown)}; systems: {', '.join(SYSTEMS)}"
        )
    try:
        fractions = {r: parse_ratio(r) for r in grid.ratios}
    except ValueError as exc:
        raise ColocationBenchmarkError(str(exc)) from None
    if grid.arrival not in ARRIVAL_PATTERNS:
        raise ColocationBenchmarkError(
            f"arrival must be one of {', '.join(ARRIVAL_PATTERNS)}, got {grid.arrival!r}"
        )
    if grid.output_length not in (*OUTPUT_CLASSES, "mixed"):
        raise ColocationBenchmarkError(
            f"output length must be one of {', '.join(OUTPUT_CLASSES)}, mixed; got {grid.output_length!r}"
        )
    if grid.compute not in COMPUTE_MODES:
        raise ColocationBenchmarkError(
            f"compute must be one of {', '.join(COMPUTE_MODES)}, got {grid.compute!r}"
        )
    if not grid.loads or any(not load > 0 for load in grid.loads):
        raise ColocationBenchmarkError(f"loads must be fractions of capacity > 0, got {list(grid.loads)}")
    if not grid.seeds:
        raise ColocationBenchmarkError("give at least one seed")
    if not grid.duration_s > 0:
        raise ColocationBenchmarkError(f"duration must be > 0 seconds, got {grid.duration_s}")
    try:
        resolve_policy(grid.policy, online=True)
    except PolicyConfigError as exc:
        raise ColocationBenchmarkError(str(exc)) from None
    return fractions


def _settings(grid: _Grid) -> dict[str, Any]:
    return {
        "ratios": list(grid.ratios),
        "loads": list(grid.loads),
        "arrival": grid.arrival,
        "output_length": grid.output_length,
        "compute": grid.compute,
        "seeds": list(grid.seeds),
        "systems": grid.systems,
        "policy": grid.policy,
        "alpha": grid.alpha,
        "beta": grid.beta,
        "gamma": grid.gamma,
        "duration_s": grid.duration_s,
    }


class _Cell:
    """One (ratio, load) of the grid: every system's run on each seed's workload."""

    def __init__(self, ratio: str, load: float, names: list[str]) -> None:
        self.ratio = ratio
        self.load = load
        self.runs: dict[str, list[RunResult]] = {n: [] for n in names}
        self.no_embedding_tpot: list[float] = []
        self.workloads: list[ColocationWorkload] = []

    def run_seed(self, grid: _Grid, seed: int) -> None:
        """Every system on this seed's workload (and sage without its embeddings)."""
        workload = generate(
            ratio=self.ratio,
            load=self.load,
            arrival=grid.arrival,
            output=grid.output_length,
            compute=grid.compute,
            duration_s=grid.duration_s,
            seed=seed,
        )
        self.workloads.append(workload)
        for name in self.runs:
            self.runs[name].append(
                run_colocation(workload, name, compute=grid.compute, params=grid.params, policy=grid.policy)
            )
        if "sage" in self.runs:
            alone = run_colocation(
                replace(workload, embeddings=()),
                "sage",
                compute=grid.compute,
                params=grid.params,
                policy=grid.policy,
            )
            self.no_embedding_tpot.append(metrics(alone)["llm_tpot_p99_ms"])

    def row(self, grid: _Grid, name: str) -> dict[str, Any]:
        """A system's metrics averaged over the seeds, with the quota and TPOT figures."""
        runs = self.runs[name]
        per_seed = [metrics(r, grid.alpha, grid.beta, grid.gamma) for r in runs]
        row: dict[str, Any] = {"ratio": self.ratio, "load": self.load, "system": name}
        for key in per_seed[0]:
            row[key] = statistics.fmean(m[key] for m in per_seed)
        combined = [m["combined_attainment"] for m in per_seed]
        row["combined_attainment_std"] = statistics.pstdev(combined) if len(combined) > 1 else 0.0
        row["requests"] = statistics.fmean(r.llm_total + r.embedding_total for r in runs)
        row["lost"] = sum(r.lost for r in runs)
        row["peak_used_blocks"] = max(r.peak_used_blocks for r in runs)
        if SYSTEMS[name].partition == "dynamic":
            row["quota_direction_changes_per_min"] = statistics.fmean(
                quota_direction_changes(r.quota_trace) / max(r.makespan_s / 60, 1e-9) for r in runs
            )
            if self.ratio == SHIFT:
                row["quota_settle_intervals"] = self._settle(grid, runs)
        if name == "sage" and self.no_embedding_tpot:
            row["tpot_p99_no_embedding_ms"] = statistics.fmean(self.no_embedding_tpot)
        return row

    def _settle(self, grid: _Grid, runs: list[RunResult]) -> float:
        """The shifting mix: the longest settling of the quota after a step, over the seeds."""
        band = grid.params.quota_deadband * runs[0].total_blocks
        settle = []
        for r, w in zip(runs, self.workloads, strict=True):
            phases = w.settings["phases"]
            assert isinstance(phases, list)
            starts = [p[0] for p in phases[1:]]
            ends = [p[1] for p in phases[1:]]
            settle.append(
                quota_settle_intervals(r.quota_trace, starts, ends, band, grid.params.quota_interval_s)
            )
        return max(settle)
