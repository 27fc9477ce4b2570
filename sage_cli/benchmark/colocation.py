"""``sage llm benchmark --workload colocation``: the grid both colocation modes run, and its table.

`check_grid` turns the options into a `ColocationGrid` (ratios, loads, seeds, systems, the
objective's weights, the eviction policy of the pool) or names the first option it cannot use; the
simulator (`colocation_sim`) and live engines (`colocation_engine`) run it; `colocation_table`
shows either's rows, one per ratio, load and system.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sage_cli.benchmark.checks import fraction, parse_capacities, parse_policies
from sage_cli.benchmark.options import BenchmarkArgs, Mode
from sage_cli.errors import CLIUsageError
from sage_cli.output import format_cell

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "DEFAULT_POLICY",
    "ColocationGrid",
    "check_grid",
    "colocation_table",
    "parse_loads",
    "parse_ratios",
    "parse_seeds",
]
DEFAULT_POLICY = "lru"


@dataclass(frozen=True, slots=True)
class ColocationGrid:
    """The checked options of a colocation run.

    Attributes:
        ratios: LLM:embedding ratios (``"7:3"``) or ``"shift"``.
        loads: Offered loads as fractions of the mix's capacity.
        arrival: poisson, bursty or periodic.
        output_length: short, medium, long or mixed.
        compute: shared or split.
        seeds: The seeds to average over.
        systems: The systems to compare; None: all.
        alpha: Objective weight of LLM SLO attainment.
        beta: Objective weight of embedding SLO attainment.
        gamma: Objective weight of the completion ratio.
        duration: Simulated seconds; None: the default.
        requests: Requests per cell on engines; None: the default.
        num_blocks: Pool of each engine; None: the default.
        policy: The eviction policy of the shared pool in the simulator (one registry name).
        policy_given: Whether ``--eviction-policies`` named it (else `DEFAULT_POLICY`).
        output: ``--output``.
        json_out: ``--json``.
    """

    ratios: list[str]
    loads: list[float]
    arrival: str
    output_length: str
    compute: str
    seeds: list[int]
    systems: list[str] | None
    alpha: float
    beta: float
    gamma: float
    duration: float | None
    requests: int | None
    num_blocks: int | None
    policy: str
    policy_given: bool
    output: Path | None
    json_out: bool


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
            value = fraction(item)
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


def _policy(text: str | None) -> str:
    """The one eviction policy of a colocation run (``--eviction-policies``; default lru).

    Raises:
        CLIUsageError: An unknown name, or more than one.
    """
    if text is None:
        return DEFAULT_POLICY
    policies = parse_policies(text, Mode.sim.value)
    if len(policies) > 1:
        raise CLIUsageError(
            "--workload colocation runs one eviction policy on the shared pool: give one name in "
            f"--eviction-policies, not {', '.join(policies)}"
        )
    return policies[0]


def _options_it_does_not_take(args: BenchmarkArgs) -> list[str]:
    """The flags given that a colocation run has no use for (in engine mode it takes
    ``--capacity-blocks`` as each engine's pool and ``--requests`` per cell; in the simulator one
    ``--eviction-policies``, the pool's)."""
    engine = args.mode is Mode.engine
    given = {
        "--eviction-policies": args.eviction_policies is not None and engine,
        "--capacity-blocks": args.capacity_blocks is not None and not engine,
        "--capacity-ratio": args.capacity_ratio is not None,
        "--requests": args.requests is not None and not engine,
        "--tenants": args.tenants is not None,
        "--plot": args.plot is not None,
        "--trace": args.trace is not None,
    }
    return [flag for flag, on in given.items() if on]


def check_grid(args: BenchmarkArgs) -> ColocationGrid:
    """The options of a colocation run, checked in order.

    Raises:
        CLIUsageError: The first option that cannot be used, named in the message.
    """
    pool = args.capacity_blocks and parse_capacities(args.capacity_blocks, "--capacity-blocks", ratio=False)
    other_options = _options_it_does_not_take(args)
    if other_options:
        raise CLIUsageError(f"--workload colocation does not take {', '.join(other_options)}")
    policy = _policy(args.eviction_policies)
    ratios = parse_ratios(args.ratio)
    loads = parse_loads(args.load)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else [args.seed]
    systems = [s.strip() for s in args.systems.split(",")] if args.systems is not None else None
    duration = args.duration
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise CLIUsageError(f"--duration {duration:g}: give a positive number of seconds")
    if args.alpha + args.beta + args.gamma <= 0:
        raise CLIUsageError("--alpha, --beta and --gamma: at least one must be > 0")
    return ColocationGrid(
        ratios=ratios,
        loads=loads,
        arrival=args.arrival.value,
        output_length=args.output_length.value,
        compute=args.compute.value,
        seeds=seeds,
        systems=systems,
        alpha=args.alpha,
        beta=args.beta,
        gamma=args.gamma,
        duration=duration,
        requests=args.requests,
        num_blocks=int(pool[0]) if pool else None,
        policy=policy,
        policy_given=args.eviction_policies is not None,
        output=args.output,
        json_out=args.json_out,
    )


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
    ("preemptions", "Preempted", "number"),
    # Decisions the quota (Algorithm 2, or a static split) made; 0: it changed nothing in the run.
    ("quota_limited", "Quota decisions", "number"),
)


def colocation_table(result: dict[str, Any], policy: str = DEFAULT_POLICY) -> Table | str:
    """One row per ratio, load and system; the eviction policy (the result's ``settings.policy``,
    else `policy`) and the capacities in the caption."""
    from rich import box
    from rich.table import Table

    rows = result.get("results")
    if not isinstance(rows, list) or not rows:
        return "No results."
    settings = result.get("settings", {})
    caps = result.get("capacity", {})
    caption = f"eviction policy: {settings.get('policy') or policy}; capacity at 100 % load (requests/s): "
    caption += ", ".join(f"{r} {c:.2f}" for r, c in caps.items())
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
    present = {key for row in rows if isinstance(row, dict) for key in row}
    columns = [c for c in _COLUMNS if c[0] in present]  # live engines' rows count no quota decisions
    for key, title, _ in columns:
        table.add_column(
            title, justify="left" if key in ("ratio", "system") else "right", no_wrap=key == "system"
        )
    for row in rows:
        table.add_row(*(format_cell(row.get(key), kind) for key, _, kind in columns))
    return table
