"""Issue 19's targets for LLM + embedding colocation, measured in the simulator.

Runs the grid (ratios 1:9 ... 9:1 and the shifting mix, loads 50 %, 100 %, 125 %) with every
system, averages over the seeds, and checks each target of issue 19 ("Targets") for sage's
system, the spec's system (Algorithms 1-3 as written) on its own row beside it:

1. LLM-heavy mixes (7:3, 9:1) at 100 % and 125 %: >= 10 points of combined attainment over the
   best static partition without admission.
2. Every ratio at 100 % and 125 %: never > 1 point below the best baseline given the same
   deadline-aware admission, and >= 3 points above it on average over the ten cells.
3. The shifting mix: >= 5 points above every static split given the same admission.
4. 50 % load: never > 1 point below any baseline.
5. Shared compute: LLM TPOT P99 with embedding traffic at 100 % load <= 1.5x without it.
6. Quotas: <= 1 direction change of the LLM quota per minute under steady load (100 %); the
   shifting mix's steps settle within 10 intervals.
7. Nothing lost: every request finished or rejected with a reason, the pool never over-committed.

    python benchmarks/colocation.py                       # shared and split, seeds 0,1,2
    python benchmarks/colocation.py --compute split --seeds 0,1,2,3,4 --json out.json
    python benchmarks/colocation.py --policy slo           # the pool's cache evicted by slo
    python benchmarks/colocation.py --cell shared:7:3:1.25 --seeds 0,1,2,3,4   # one cell, every system

`--cell COMPUTE:RATIO:LOAD` runs one cell of the grid with every system and prints its
per-system table (docs/concepts/colocation.md's), with each system's preemptions and the decisions its quota
made (`quota_limited`: 0 means the quota, Algorithm 2 or the static split that replaces it,
changed nothing in the run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.sim.colocation.benchmark import run_colocation_benchmark

RATIOS = ["1:9", "3:7", "5:5", "7:3", "9:1"]
STATIC = ["static-50/50", "static-80/20"]
ADMISSION = ["static-50/50+adm", "static-80/20+adm", "shared-lru+adm"]
BASELINES = ["static-50/50", "static-80/20", "shared-lru", *ADMISSION]


def _cells(result: dict[str, Any]) -> dict[tuple[str, float], dict[str, dict[str, Any]]]:
    cells: dict[tuple[str, float], dict[str, dict[str, Any]]] = {}
    for row in result["results"]:
        cells.setdefault((row["ratio"], row["load"]), {})[row["system"]] = row
    return cells


def _points(value: float) -> str:
    return f"{value * 100:+.1f}"


def check_targets(result: dict[str, Any], system: str) -> list[tuple[str, bool, str]]:
    """(target, holds, the figures) for `system` ("sage" or "spec")."""
    cells = _cells(result)
    both = "combined_attainment"
    out: list[tuple[str, bool, str]] = []

    gains = []
    for ratio in ("7:3", "9:1"):
        for load in (1.0, 1.25):
            c = cells[(ratio, load)]
            gains.append((ratio, load, c[system][both] - max(c[s][both] for s in STATIC)))
    out.append(
        (
            "1. LLM-heavy: >= +10 pts over the best static partition",
            all(g >= 0.10 for *_, g in gains),
            ", ".join(f"{r}@{load:.0%} {_points(g)}" for r, load, g in gains),
        )
    )

    margins = []
    for ratio in RATIOS:
        for load in (1.0, 1.25):
            c = cells[(ratio, load)]
            margins.append((ratio, load, c[system][both] - max(c[s][both] for s in ADMISSION)))
    mean = statistics.fmean(m for *_, m in margins)
    out.append(
        (
            "2. every ratio: >= -1 pt vs the best baseline+admission, mean >= +3",
            all(m >= -0.01 for *_, m in margins) and mean >= 0.03,
            f"mean {_points(mean)}; worst "
            + ", ".join(
                f"{r}@{load:.0%} {_points(m)}" for r, load, m in sorted(margins, key=lambda x: x[2])[:3]
            ),
        )
    )

    shift = []
    for load in (1.0, 1.25):
        c = cells[("shift", load)]
        shift.append(
            (load, c[system][both] - max(c[s][both] for s in ("static-50/50+adm", "static-80/20+adm")))
        )
    out.append(
        (
            "3. shifting mix: >= +5 pts over every static split + admission",
            all(g >= 0.05 for _, g in shift),
            ", ".join(f"@{load:.0%} {_points(g)}" for load, g in shift),
        )
    )

    low = []
    for ratio in [*RATIOS, "shift"]:
        c = cells[(ratio, 0.5)]
        low.append((ratio, c[system][both] - max(c[s][both] for s in BASELINES)))
    out.append(
        (
            "4. 50 % load: >= -1 pt vs every baseline",
            all(g >= -0.01 for _, g in low),
            "worst " + ", ".join(f"{r} {_points(g)}" for r, g in sorted(low, key=lambda x: x[1])[:3]),
        )
    )

    if result["settings"]["compute"] == "shared" and system == "sage":
        ratios = [
            (
                ratio,
                cells[(ratio, 1.0)]["sage"]["llm_tpot_p99_ms"]
                / max(cells[(ratio, 1.0)]["sage"]["tpot_p99_no_embedding_ms"], 1e-9),
            )
            for ratio in [*RATIOS, "shift"]
        ]
        out.append(
            (
                "5. shared compute: TPOT P99 <= 1.5x without embeddings (100 %)",
                all(x <= 1.5 for _, x in ratios),
                ", ".join(f"{r} {x:.2f}x" for r, x in ratios),
            )
        )

    changes = [
        (ratio, cells[(ratio, 1.0)][system].get("quota_direction_changes_per_min", 0.0)) for ratio in RATIOS
    ]
    settle = [cells[("shift", load)][system].get("quota_settle_intervals", 0.0) for load in (1.0, 1.25)]
    out.append(
        (
            "6. quota: <= 1 direction change/min (steady), shift settles <= 10 intervals",
            all(x <= 1.0 for _, x in changes) and all(s <= 10 for s in settle),
            "changes/min "
            + ", ".join(f"{r} {x:.1f}" for r, x in changes)
            + "; settle "
            + ", ".join(f"{s:.1f}" for s in settle),
        )
    )

    lost = sum(row["lost"] for row in result["results"])
    over = [row for row in result["results"] if row["peak_used_blocks"] > 2048]
    out.append(
        (
            "7. nothing lost, pool never over-committed",
            lost == 0 and not over,
            f"lost {lost}, over-committed rows {len(over)}",
        )
    )
    return out


def cell_table(compute: str, ratio: str, load: float, seeds: list[int], duration: float, policy: str) -> str:
    """Every system on one cell, averaged over `seeds`, as docs/concepts/colocation.md's markdown table."""
    result = run_colocation_benchmark(
        ratios=[ratio], loads=[load], compute=compute, seeds=seeds, duration_s=duration, policy=policy
    )
    lines = [
        f"{compute} compute, {ratio} at {load:.0%}:",
        "",
        "| system | SLO both | SLO LLM | SLO emb | TTFT p99 ms | TPOT p99 ms | emb p99 ms | req/s | KV hit "
        "| rejected | deferred | preempted | quota decisions |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["results"]:
        cells = [
            f"{100 * r['combined_attainment']:.1f}",
            f"{100 * r['llm_attainment']:.1f}",
            f"{100 * r['embedding_attainment']:.1f}",
            f"{r['llm_ttft_p99_ms']:.0f}",
            f"{r['llm_tpot_p99_ms']:.0f}",
            f"{r['embedding_p99_ms']:.0f}",
            f"{r['throughput_rps']:.2f}",
            f"{100 * r['kv_hit_rate']:.1f}",
            *(f"{r[key]:.1f}" for key in ("rejected", "deferred", "preemptions", "quota_limited")),
        ]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parse_cell(text: str) -> tuple[str, str, float]:
    compute, ratio_l, ratio_e, load = text.split(":")
    return compute, f"{ratio_l}:{ratio_e}", float(load.rstrip("%")) / (100 if load.endswith("%") else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute", default="shared,split", help="shared, split or both (comma-separated)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=None, help="write every row and check as JSON")
    parser.add_argument("--policy", default="lru", help="the pool cache's eviction policy (registry spec)")
    parser.add_argument(
        "--cell", default=None, help="COMPUTE:RATIO:LOAD, e.g. shared:7:3:1.25: one cell's table"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(machine_line())
    if args.cell is not None:
        start = time.perf_counter()
        print(cell_table(*_parse_cell(args.cell), seeds, args.duration, args.policy))
        print(f"\n({time.perf_counter() - start:.0f} s wall, seeds {seeds}, policy {args.policy})")
        return
    everything: dict[str, Any] = {}
    for compute in args.compute.split(","):
        start = time.perf_counter()
        result = run_colocation_benchmark(
            ratios=[*RATIOS, "shift"],
            loads=[0.5, 1.0, 1.25],
            compute=compute,
            seeds=seeds,
            duration_s=args.duration,
            policy=args.policy,
        )
        wall = time.perf_counter() - start
        print(
            f"\n== {compute} compute, seeds {seeds}, {args.duration:g} s runs, policy {args.policy} "
            f"({wall:.0f} s wall)"
        )
        print(
            "capacity at 100 % (requests/s): "
            + ", ".join(f"{r} {c:.2f}" for r, c in result["capacity"].items())
        )
        cells = _cells(result)
        print(f"{'ratio':6s} {'load':>5s} {'sage':>6s} {'spec':>6s} {'best static':>12s} {'best +adm':>10s}")
        for (ratio, load), c in cells.items():
            best_static = max(c[s]["combined_attainment"] for s in STATIC)
            best_adm = max(c[s]["combined_attainment"] for s in ADMISSION)
            sage, spec = c["sage"]["combined_attainment"], c["spec"]["combined_attainment"]
            print(f"{ratio:6s} {load:5.0%} {sage:6.1%} {spec:6.1%} {best_static:12.1%} {best_adm:10.1%}")
        checks = {}
        for system in ("sage", "spec"):
            print(f"-- targets for {system}")
            checks[system] = check_targets(result, system)
            for name, holds, figures in checks[system]:
                print(f"  [{'holds' if holds else 'MISS '}] {name}: {figures}")
        everything[compute] = {
            "result": result,
            "checks": {k: [list(c) for c in v] for k, v in checks.items()},
        }
    if args.json is not None:
        args.json.write_text(json.dumps(everything, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
