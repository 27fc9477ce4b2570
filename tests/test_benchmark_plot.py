"""``sage llm benchmark --plot`` and the table's saturation warning (issue 28, items 10 and 13).

The plot: hit rate against the capacity *ratio* (the table's and ``--capacity-ratio``'s scale)
and a TTFT CDF per cache size, drawn from each row's TTFT quantiles; the CDF's median and p99
are the row's own ``ttft_p50_s`` and ``ttft_p99_s``, so the picture and the table agree.

Saturation: a row is saturated when its median TTFT exceeds ten idle prefills of the mean
prompt; the warning names the case (the workload overloads the engine, or only small caches
queue), and none is given where the engine keeps up.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.sim.benchmark import run_benchmark
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.plot import benchmark_figure
from engine_adapter.sim.saturation import SATURATION_FACTOR, idle_prefill_s, saturation
from engine_adapter.sim.simulator import UNBOUNDED
from engine_adapter.sim.sweep import RowSpec, SweepContext, run_row, ttft_quantiles
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import unique_blocks


@pytest.fixture(scope="module")
def swept() -> tuple[Any, list[dict[str, Any]], list[tuple[float, ...]]]:
    workload = synthetic(requests=150, seed=3)
    context = SweepContext(workload, "radix", CostModel())
    unique = unique_blocks(workload.requests)
    sizes = [max(unique // 4, 300), max(unique // 2, 300)]
    specs = [RowSpec(0, "lru", sizes[0]), RowSpec(1, "arc", sizes[0]), RowSpec(2, "lru", sizes[1])]
    specs.append(RowSpec(3, UNBOUNDED, None))
    outcomes = [run_row(context, spec) for spec in specs]
    return workload, [o.row for o in outcomes], [o.ttft_quantiles_s for o in outcomes]


def test_ttft_quantiles_are_a_cdf_in_101_points() -> None:
    values = sorted([0.5, 0.1, 3.0, 2.0, 0.7])
    q = ttft_quantiles(values)
    assert len(q) == 101 and q[0] == 0.1 and q[-1] == 3.0 and q[50] == 0.7
    assert list(q) == sorted(q)
    assert ttft_quantiles([]) == ()


def test_the_cdf_agrees_with_the_rows_percentiles(swept: Any) -> None:
    _, rows, quantiles = swept
    for row, q in zip(rows, quantiles, strict=True):
        assert q[50] == pytest.approx(row["ttft_p50_s"])
        assert q[99] == pytest.approx(row["ttft_p99_s"])


def test_the_figure_draws_hit_rate_by_capacity_ratio_and_a_cdf_per_size(swept: Any) -> None:
    workload, rows, quantiles = swept
    unique = unique_blocks(workload.requests)
    figure = benchmark_figure(rows, quantiles, unique, "synthetic")
    axes = figure.get_axes()
    hit, cdfs = axes[0], [ax for ax in axes[1:] if ax.get_title().startswith("TTFT CDF")]
    sizes = sorted({row["capacity_blocks"] for row in rows if row["policy"] != UNBOUNDED})
    assert len(cdfs) == len(sizes)
    assert "capacity ratio" in hit.get_xlabel()
    lines = {line.get_label(): line for line in hit.get_lines()}
    lru = [row for row in rows if row["policy"] == "lru"]
    assert list(lines["lru"].get_xdata()) == pytest.approx(sorted(r["capacity_blocks"] / unique for r in lru))
    assert list(lines["lru"].get_ydata()) == pytest.approx(
        [r["hit_rate"] for r in sorted(lru, key=lambda r: r["capacity_blocks"])]
    )
    assert UNBOUNDED in lines  # the ceiling, dashed
    for ax, size in zip(cdfs, sizes, strict=True):
        drawn = {line.get_label(): line for line in ax.get_lines()}
        here = [(row, q) for row, q in zip(rows, quantiles, strict=True) if row["capacity_blocks"] == size]
        for row, q in here:
            if row["policy"] == UNBOUNDED:
                continue
            line = drawn[row["policy"]]
            assert list(line.get_xdata()) == pytest.approx(list(q))
            assert line.get_ydata()[0] == 0.0 and line.get_ydata()[-1] == 1.0
        assert UNBOUNDED in drawn
        assert ax.get_xlabel() == "TTFT (s)"


def test_the_plot_option_writes_that_figure_as_a_png(tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    run_benchmark(
        policies=["lru"], workload="synthetic", requests=60, capacity_ratios=[0.3, 0.6], jobs=1, plot=png
    )
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    # two rows of 6.5 x 4.8 in at 100 dpi: the hit-rate panel and two TTFT CDFs, then the age
    # panels (issue 32: block age at hit and at eviction)
    assert (width, height) == (1950, 960)


def _row(policy: str, ttft_p50_s: float, capacity: int = 10) -> dict[str, Any]:
    return {"policy": policy, "capacity_blocks": capacity, "ttft_p50_s": ttft_p50_s}


def test_saturation_names_the_case() -> None:
    workload = synthetic(requests=50, seed=1)
    cost = CostModel()
    idle, mean_prompt = idle_prefill_s(workload, cost)
    assert mean_prompt == round(sum(r.input_len for r in workload.requests) / len(workload.requests))
    limit = SATURATION_FACTOR * idle
    keeps_up = saturation([_row("lru", 2 * idle), _row(UNBOUNDED, idle)], workload, cost, UNBOUNDED)
    assert keeps_up["warnings"] == [] and keeps_up["saturated_rows"] == []
    small = saturation([_row("lru", 2 * limit), _row(UNBOUNDED, idle)], workload, cost, UNBOUNDED)
    assert small["saturated_rows"] == ["lru@10"] and not small["reference_saturated"]
    assert len(small["warnings"]) == 1 and "unbounded cache keeps up" in small["warnings"][0]
    overloaded = saturation([_row("lru", 3 * limit), _row(UNBOUNDED, 2 * limit)], workload, cost, UNBOUNDED)
    assert overloaded["reference_saturated"]
    assert "overloads the modelled engine" in overloaded["warnings"][0]
    assert "--cost-model" in overloaded["warnings"][0]


def test_a_slow_engine_saturates_the_run_and_a_fast_one_does_not() -> None:
    slow = {"prefill_per_token_s": 0.01, "decode_base_s": 0.2}
    fast = {"prefill_base_s": 0.0, "prefill_per_token_s": 1e-7, "prefill_attn_s": 0.0, "decode_base_s": 1e-5,
            "decode_per_seq_s": 0.0, "decode_per_context_token_s": 0.0}  # fmt: skip
    common: dict[str, Any] = {"policies": ["lru"], "workload": "synthetic", "requests": 120, "jobs": 1}
    overloaded = run_benchmark(**common, cost_model=slow)["saturation"]
    assert overloaded["reference_saturated"] and overloaded["warnings"]
    calm = run_benchmark(**common, cost_model=fast, capacity_ratios=[1.0])["saturation"]
    assert calm["warnings"] == [] and calm["saturated_rows"] == []
