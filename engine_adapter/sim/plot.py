"""``sage llm benchmark --plot FILE.png``: the benchmark's rows as a figure (matplotlib, Agg).

`benchmark_figure` draws, left, each policy's hit rate against the cache size as a share of
the workload's distinct blocks, the scale of ``--capacity-ratio`` (blocks on the top axis), the
unbounded cache as a dashed line; right, one panel per cache size, the CDF of the requests'
TTFT for each policy there (from each row's 101 TTFT quantiles, `sweep.RowOutcome`), on a log
axis when the times span more than a decade, the unbounded cache's as a dashed line. Rows run
with the adaptive batch limit are their own lines, "(adaptive)". When the rows carry age
histograms (the radix model), a second row of panels draws the block ages at hit and at
eviction at the smallest size (`plot_ages`). `write_plot` saves it.

matplotlib is imported inside the functions that need it (the extra ``sage-kv[plot]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine_adapter.sim.plot_ages import AGE_PANELS, draw_age_panels
from engine_adapter.sim.simulator import UNBOUNDED

__all__ = ["benchmark_figure", "write_plot"]

_MAX_CDF_PANELS = 6
"""The CDF panels drawn (the smallest cache sizes first); a sweep of more sizes draws these."""


def _name(row: dict[str, Any]) -> str:
    return f"{row['policy']} (adaptive)" if row.get("adaptive_batch") else str(row["policy"])


def _hit_rate_panel(ax: Any, rows: Sequence[dict[str, Any]], unique_blocks: int) -> None:
    names = list(dict.fromkeys(_name(row) for row in rows if row["policy"] != UNBOUNDED))
    for name in names:
        points = sorted(
            (row["capacity_blocks"] / unique_blocks, row["hit_rate"]) for row in rows if _name(row) == name
        )
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    for row in rows:
        if row["policy"] == UNBOUNDED:
            ax.axhline(row["hit_rate"], color="grey", linestyle="--", linewidth=1, label=UNBOUNDED)
            break
    ratios = [row["capacity_blocks"] / unique_blocks for row in rows if row["policy"] != UNBOUNDED]
    ax.set_xlim(0.0, 1.1 * max(ratios, default=1.0))
    ax.set_ylim(0.0, 1.1 * max((row["hit_rate"] for row in rows), default=1.0) or 1.0)
    ax.set_xlabel("capacity ratio (share of the workload's distinct blocks)")
    ax.set_ylabel("hit rate (prompt tokens)")
    ax.xaxis.set_major_formatter(_percent_formatter())
    ax.yaxis.set_major_formatter(_percent_formatter())
    top = ax.secondary_xaxis("top", functions=(lambda r: r * unique_blocks, lambda b: b / unique_blocks))
    top.set_xlabel("blocks")
    ax.set_title("hit rate against capacity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=2)


def _percent_formatter() -> Any:
    from matplotlib.ticker import PercentFormatter  # type: ignore[import-not-found,unused-ignore]

    return PercentFormatter(1.0)


def _cdf_panel(
    ax: Any,
    capacity: int,
    unique_blocks: int,
    lines: Sequence[tuple[dict[str, Any], Sequence[float]]],
    reference: tuple[dict[str, Any], Sequence[float]] | None,
) -> None:
    probabilities = [q / (len(lines[0][1]) - 1) for q in range(len(lines[0][1]))]
    times = [t for _, quantiles in lines for t in quantiles if t > 0]
    for row, quantiles in lines:
        ax.plot(quantiles, probabilities, label=_name(row))
    if reference is not None:
        ax.plot(reference[1], probabilities, color="grey", linestyle="--", linewidth=1, label=UNBOUNDED)
    if times and max(times) > 10 * min(times):
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of requests")
    ax.yaxis.set_major_formatter(_percent_formatter())
    ax.set_ylim(0.0, 1.0)
    ax.set_title(f"TTFT CDF at {capacity / unique_blocks:.1%} ({capacity} blocks)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def benchmark_figure(
    rows: Sequence[dict[str, Any]],
    ttft_quantiles: Sequence[Sequence[float]],
    unique_blocks: int,
    title: str,
) -> Any:
    """The figure (module docstring): a `matplotlib.figure.Figure`.

    Args:
        rows: The benchmark's rows, in their order.
        ttft_quantiles: Each row's TTFT quantiles at 0, 1, ..., 100 % (empty: no CDF line).
        unique_blocks: The workload's distinct blocks (the capacity ratio's denominator).
        title: The figure's title.
    """
    from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]

    quantiles = dict(zip(range(len(rows)), ttft_quantiles, strict=True))
    reference = next(
        ((row, quantiles[i]) for i, row in enumerate(rows) if row["policy"] == UNBOUNDED and quantiles[i]),
        None,
    )
    capacities = sorted({row["capacity_blocks"] for row in rows if row["policy"] != UNBOUNDED})
    capacities = capacities[:_MAX_CDF_PANELS]
    ages = bool(capacities) and any(row.get("age_histograms") for row in rows)
    n_cols = 1 + len(capacities)  # at least 2 with ages: as many as AGE_PANELS
    figure = Figure(figsize=(6.5 * n_cols, 4.8 * (2 if ages else 1)))
    grid = figure.subplots(2 if ages else 1, n_cols, squeeze=False)
    axes = grid[0]
    if ages:
        draw_age_panels(grid[1], rows, capacities[0])
        for ax in grid[1][len(AGE_PANELS) :]:
            ax.set_axis_off()
    _hit_rate_panel(axes[0], rows, max(1, unique_blocks))
    for ax, capacity in zip(axes[1:], capacities, strict=True):
        lines = [
            (row, quantiles[i])
            for i, row in enumerate(rows)
            if row["policy"] != UNBOUNDED and row["capacity_blocks"] == capacity and quantiles[i]
        ]
        if lines:
            _cdf_panel(ax, capacity, max(1, unique_blocks), lines, reference)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def write_plot(
    rows: Sequence[dict[str, Any]],
    ttft_quantiles: Sequence[Sequence[float]],
    unique_blocks: int,
    path: str | Path,
    title: str,
) -> None:
    """Draw `benchmark_figure` into a PNG at `path`.

    Raises:
        ImportError: matplotlib is not installed.
        OSError: The file cannot be written.
    """
    figure = benchmark_figure(rows, ttft_quantiles, unique_blocks, title)
    figure.savefig(path, dpi=100)
