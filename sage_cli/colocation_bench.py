"""``sage llm benchmark --workload colocation``: the colocation systems side by side (issue 19).

The options of the colocation grid (`RatioOpt`, `LoadOpt`, ... as `Annotated` aliases that
`sage_cli.benchmark.benchmark` declares), their checks, and the table. The simulator
(`engine_adapter.sim.colocation.benchmark`) is imported only when the command runs.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.output import Output, format_cell

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "AlphaOpt",
    "ArrivalOpt",
    "BetaOpt",
    "ComputeOpt",
    "GammaOpt",
    "LoadOpt",
    "OutputLengthOpt",
    "RatioOpt",
    "SeedsOpt",
    "SystemsOpt",
    "colocation_table",
    "parse_loads",
    "parse_ratios",
    "parse_seeds",
    "run_colocation_cli",
]

_RATIOS = ("1:9", "3:7", "5:5", "7:3", "9:1")


class Arrival(str, Enum):
    poisson = "poisson"
    bursty = "bursty"
    periodic = "periodic"


class OutputLength(str, Enum):
    short = "short"
    medium = "medium"
    long = "long"
    mixed = "mixed"


class Compute(str, Enum):
    shared = "shared"
    split_devices = "split"  # `split` would shadow str.split


RatioOpt = Annotated[
    str,
    typer.Option(
        "--ratio",
        metavar="L:E[,L:E...]",
        help="colocation: LLM:embedding request ratios, or 'shift' (9:1 -> 1:9 -> 9:1 during the run).",
    ),
]
LoadOpt = Annotated[
    str,
    typer.Option(
        "--load",
        metavar="F[,F...]",
        help="colocation: offered load as fractions (1.25) or percentages (125%) of the mix's capacity.",
    ),
]
ArrivalOpt = Annotated[Arrival, typer.Option("--arrival", help="colocation: arrival pattern.")]
OutputLengthOpt = Annotated[
    OutputLength,
    typer.Option(
        "--output-length",
        help="colocation: LLM output tokens, short 50-100, medium 200-500, long 1000-2000, or mixed.",
    ),
]
ComputeOpt = Annotated[
    Compute,
    typer.Option(
        "--compute",
        help="colocation: shared (one engine time-slices both) or split (own devices, shared memory).",
    ),
]
SeedsOpt = Annotated[
    str | None,
    typer.Option(
        "--seeds",
        metavar="S[,S...]",
        show_default=False,
        help="colocation: seeds to average over (default: --seed).",
    ),
]
SystemsOpt = Annotated[
    str | None,
    typer.Option(
        "--systems",
        metavar="NAME[,NAME...]",
        show_default=False,
        help="colocation: systems to compare (default: all; see the README's Colocation section).",
    ),
]
AlphaOpt = Annotated[
    float, typer.Option("--alpha", min=0.0, help="colocation: objective weight of LLM SLO attainment.")
]
BetaOpt = Annotated[
    float, typer.Option("--beta", min=0.0, help="colocation: objective weight of embedding SLO attainment.")
]
GammaOpt = Annotated[
    float, typer.Option("--gamma", min=0.0, help="colocation: objective weight of the completion ratio.")
]


def parse_ratios(text: str) -> list[str]:
    """``7:3,9:1,shift`` as a checked list (duplicates dropped)."""
    ratios: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        left, sep, right = item.partition(":")
        ok = item == "shift" or (
            sep and left.isdigit() and right.isdigit() and int(left) > 0 and int(right) > 0
        )
        if not ok:
            raise CLIUsageError(f"--ratio {item!r}: give L:E with positive integers (e.g. 7:3) or 'shift'")
        if item not in ratios:
            ratios.append(item)
    return ratios


def parse_loads(text: str) -> list[float]:
    """``0.5,100%,1.25`` as fractions of capacity."""
    loads: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            value = float(item[:-1]) / 100 if item.endswith("%") else float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= 10):
            raise CLIUsageError(f"--load {item!r}: give a fraction of capacity in (0, 10] or a percentage")
        loads.append(value)
    return loads


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` as seeds."""
    seeds: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not item.isdigit():
            raise CLIUsageError(f"--seeds {item!r}: give non-negative integers, comma-separated")
        seeds.append(int(item))
    return seeds


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("ratio", "Ratio", "text"),
    ("load", "Load", "percent0"),
    ("system", "System", "text"),
    ("combined_attainment", "SLO both", "percent"),
    ("llm_attainment", "SLO LLM", "percent"),
    ("embedding_attainment", "SLO emb", "percent"),
    ("objective", "Objective", "ratio"),
    ("llm_ttft_p99_ms", "TTFT p99 ms", "int"),
    ("llm_tpot_p99_ms", "TPOT p99 ms", "int"),
    ("embedding_p99_ms", "Emb p99 ms", "int"),
    ("throughput_rps", "Req/s", "ratio"),
    ("kv_hit_rate", "KV hit", "percent"),
    ("rejected", "Rejected", "number"),
    ("deferred", "Deferred", "number"),
)



def colocation_table(result: dict[str, Any]) -> Table | str:
    """One row per ratio, load and system; the capacities in the caption."""
    from rich import box
    from rich.table import Table

    rows = result.get("results")
    if not isinstance(rows, list) or not rows:
        return "No results."
    settings = result.get("settings", {})
    caps = result.get("capacity", {})
    caption = "capacity at 100 % load (requests/s): " + ", ".join(f"{r} {c:.2f}" for r, c in caps.items())
    seeds = settings.get("seeds", [])
    table = Table(
        title=(
            f"Colocation benchmark ({settings.get('compute')} compute, {settings.get('arrival')} arrivals,"
            f" {settings.get('output_length')} outputs, mean of {len(seeds)} seed(s))"
        ),
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for key, title, _ in _COLUMNS:
        table.add_column(
            title, justify="left" if key in ("ratio", "system") else "right", no_wrap=key == "system"
        )
    for row in rows:
        table.add_row(*(format_cell(row.get(key), kind) for key, _, kind in _COLUMNS))
    return table


def run_colocation_cli(
    *,
    ratio: str,
    load: str,
    arrival: Arrival,
    output_length: OutputLength,
    compute: Compute,
    seeds: str | None,
    seed: int,
    systems: str | None,
    alpha: float,
    beta: float,
    gamma: float,
    duration: float | None,
    output: Path | None,
    json_out: bool,
    engine_mode: bool,
    other_options: list[str],
    requests: int | None = None,
    num_blocks: int | None = None,
) -> None:
    """Check the options, run the grid in the simulator (or, `engine_mode`, on live engines:
    sage_cli/colocation_engine_bench.py), print the table (or JSON)."""
    if other_options:
        raise CLIUsageError(f"--workload colocation does not take {', '.join(other_options)}")
    ratios = parse_ratios(ratio)
    loads = parse_loads(load)
    seed_list = parse_seeds(seeds) if seeds is not None else [seed]
    names = [s.strip() for s in systems.split(",")] if systems is not None else None
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise CLIUsageError(f"--duration {duration:g}: give a positive number of seconds")
    if alpha + beta + gamma <= 0:
        raise CLIUsageError("--alpha, --beta and --gamma: at least one must be > 0")
    if engine_mode:
        from sage_cli.colocation_engine_bench import run_engine_colocation_cli

        run_engine_colocation_cli(
            ratios=ratios, loads=loads, arrival=arrival.value, output_length=output_length.value,
            compute=compute.value, seeds=seed_list, systems=names, alpha=alpha, beta=beta, gamma=gamma,
            duration=duration, requests=requests, num_blocks=num_blocks, output=output, json_out=json_out,
        )  # fmt: skip
        return
    from rich.console import Console
    from rich.progress import Progress

    from engine_adapter.sim.colocation.benchmark import ColocationBenchmarkError, run_colocation_benchmark

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("colocation", total=len(ratios) * len(loads) * len(seed_list))
        try:
            result = run_colocation_benchmark(
                ratios=ratios,
                loads=loads,
                arrival=arrival.value,
                output_length=output_length.value,
                compute=compute.value,
                seeds=seed_list,
                systems=names,
                alpha=alpha,
                beta=beta,
                gamma=gamma,
                duration_s=duration if duration is not None else 60.0,
                output=output,
                progress=lambda done, total: bar.update(task, completed=done),
            )
        except ColocationBenchmarkError as exc:
            raise CLIUsageError(str(exc)) from None
    Output(json_out).result(result, lambda: colocation_table(result))
