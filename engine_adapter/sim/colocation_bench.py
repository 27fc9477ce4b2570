"""``sage llm benchmark --workload colocation``: the colocation systems side by side on the grid.

`run_colocation_benchmark` generates one workload per (ratio, load, seed) and replays it
through every system (`engine_adapter.sim.colocation.SYSTEMS`), then averages each system's
metrics over the seeds into one row per (ratio, load, system). Beside the metrics of
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_adapter.colocation import ColocationParams
from engine_adapter.sim.colocation import SYSTEMS, RunResult, metrics, run_colocation
from engine_adapter.sim.colocation_workload import (
    ARRIVAL_PATTERNS,
    COMPUTE_MODES,
    OUTPUT_CLASSES,
    SHIFT,
    ColocationWorkload,
    capacity,
    generate,
    parse_ratio,
)

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


def _without_embeddings(workload: ColocationWorkload) -> ColocationWorkload:
    return replace(workload, embeddings=())


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
) -> dict[str, Any]:
    """Run the grid (see the module docstring).

    Raises:
        ColocationBenchmarkError: An unknown ratio, system, arrival pattern, output class or
            compute mode, a load or duration that is not positive, no seeds.
    """
    names = list(systems) if systems is not None else list(SYSTEMS)
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise ColocationBenchmarkError(
            f"unknown system(s) {', '.join(unknown)}; systems: {', '.join(SYSTEMS)}"
        )
    try:
        fractions = {r: parse_ratio(r) for r in ratios}
    except ValueError as exc:
        raise ColocationBenchmarkError(str(exc)) from None
    if arrival not in ARRIVAL_PATTERNS:
        raise ColocationBenchmarkError(
            f"arrival must be one of {', '.join(ARRIVAL_PATTERNS)}, got {arrival!r}"
        )
    if output_length not in (*OUTPUT_CLASSES, "mixed"):
        raise ColocationBenchmarkError(
            f"output length must be one of {', '.join(OUTPUT_CLASSES)}, mixed; got {output_length!r}"
        )
    if compute not in COMPUTE_MODES:
        raise ColocationBenchmarkError(f"compute must be one of {', '.join(COMPUTE_MODES)}, got {compute!r}")
    if not loads or any(not load > 0 for load in loads):
        raise ColocationBenchmarkError(f"loads must be fractions of capacity > 0, got {list(loads)}")
    if not seeds:
        raise ColocationBenchmarkError("give at least one seed")
    if not duration_s > 0:
        raise ColocationBenchmarkError(f"duration must be > 0 seconds, got {duration_s}")
    params = params or ColocationParams()
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
            runs: dict[str, list[RunResult]] = {n: [] for n in names}
            no_embedding_tpot: list[float] = []
            workloads = []
            for seed in seeds:
                workload = generate(
                    ratio=ratio,
                    load=load,
                    arrival=arrival,
                    output=output_length,
                    compute=compute,
                    duration_s=duration_s,
                    seed=seed,
                )
                workloads.append(workload)
                for name in names:
                    runs[name].append(run_colocation(workload, name, compute=compute, params=params))
                if "sage" in names:
                    alone = run_colocation(
                        _without_embeddings(workload), "sage", compute=compute, params=params
                    )
                    no_embedding_tpot.append(metrics(alone)["llm_tpot_p99_ms"])
                done += 1
                if progress is not None:
                    progress(done, total)
            for name in names:
                per_seed = [metrics(r, alpha, beta, gamma) for r in runs[name]]
                row: dict[str, Any] = {"ratio": ratio, "load": load, "system": name}
                for key in per_seed[0]:
                    row[key] = statistics.fmean(m[key] for m in per_seed)
                combined = [m["combined_attainment"] for m in per_seed]
                row["combined_attainment_std"] = statistics.pstdev(combined) if len(combined) > 1 else 0.0
                row["requests"] = statistics.fmean(r.llm_total + r.embedding_total for r in runs[name])
                row["lost"] = sum(r.lost for r in runs[name])
                row["peak_used_blocks"] = max(r.peak_used_blocks for r in runs[name])
                spec = SYSTEMS[name]
                if spec.partition == "dynamic":
                    row["quota_direction_changes_per_min"] = statistics.fmean(
                        quota_direction_changes(r.quota_trace) / max(r.makespan_s / 60, 1e-9)
                        for r in runs[name]
                    )
                    if ratio == SHIFT:
                        band = params.quota_deadband * runs[name][0].total_blocks
                        settle = []
                        for r, w in zip(runs[name], workloads, strict=True):
                            phases = w.settings["phases"]
                            assert isinstance(phases, list)
                            starts = [p[0] for p in phases[1:]]
                            ends = [p[1] for p in phases[1:]]
                            settle.append(
                                quota_settle_intervals(
                                    r.quota_trace, starts, ends, band, params.quota_interval_s
                                )
                            )
                        row["quota_settle_intervals"] = max(settle)
                if name == "sage" and no_embedding_tpot:
                    row["tpot_p99_no_embedding_ms"] = statistics.fmean(no_embedding_tpot)
                rows.append(row)
    result = {
        "settings": {
            "ratios": list(ratios),
            "loads": list(loads),
            "arrival": arrival,
            "output_length": output_length,
            "compute": compute,
            "seeds": list(seeds),
            "systems": names,
            "alpha": alpha,
            "beta": beta,
            "gamma": gamma,
            "duration_s": duration_s,
        },
        "capacity": {r: c for r, c in caps.items()},
        "results": rows,
    }
    if output is not None:
        Path(output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
