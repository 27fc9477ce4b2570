"""The simulator as a library: a trace, `simulate`, and its `Results` as a table or a plot.

What ``sage llm benchmark --mode sim`` runs, callable from a notebook (the CLI calls this
`simulate`: one implementation under both):

    >>> from engine_adapter.sim.api import Trace, simulate
    >>> trace = Trace.shipped("mooncake:conversation")
    >>> results = simulate(trace, policies=["lru", "s3fifo"], capacity_ratios=[0.05])
    >>> results.to_pandas()[["policy", "capacity_blocks", "hit_rate"]]
    >>> results.plot("mooncake.png")

A `Trace` says where the requests come from (a file, a trace shipped with sage, or the seeded
generator) and is read when `simulate` runs; `Results` holds the rows exactly as the
benchmark's JSON has them (`results.rows`), with the workload, the settings and how the sweep
ran. pandas and polars are optional (`to_pandas`, `to_polars` say which extra to install),
matplotlib too (`plot`, the `plot` extra).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapter.sim.api_checks import check_capacities, check_options, policy_specs
from engine_adapter.sim.benchmark import BenchmarkError, SweepRun, build_workload, run_sweep
from engine_adapter.sim.saturation import SaturationWarning
from engine_adapter.sim.workloads import Workload
from sage_eviction.registry import register_policy

__all__ = [
    "TRACE_OPTIONS",
    "BenchmarkError",
    "Results",
    "SaturationWarning",
    "Trace",
    "register_policy",
    "simulate",
]

TRACE_OPTIONS = (
    "trace",
    "trace_format",
    "workload",
    "requests",
    "tenants",
    "seed",
    "duration",
    "time_scale",
    "block_size",
)
"""The benchmark's options that say where the requests come from (a `Trace`'s `options`)."""


@dataclass(frozen=True)
class Trace:
    """Where a simulation's requests come from: build one with `read`, `shipped` or `synthetic`.

    Attributes:
        options: The workload options of `engine_adapter.sim.benchmark.build_workload`.
    """

    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(TRACE_OPTIONS))
        if unknown:
            raise TypeError(
                f"not a trace option: {', '.join(unknown)} (trace options: {', '.join(TRACE_OPTIONS)})"
            )

    @classmethod
    def read(
        cls,
        path: str | Path,
        *,
        format: str | None = None,
        requests: int | None = None,
        duration: float | None = None,
        time_scale: float = 0.0,
    ) -> Trace:
        """A trace file: Mooncake JSON lines or an Azure CSV (either gzipped).

        Args:
            path: The file.
            format: ``"mooncake"`` or ``"azure"``; default: from the file name (``.csv`` is Azure).
            requests: Take only its first requests.
            duration: Keep only the requests within this many seconds of the first.
            time_scale: Virtual seconds per second of the trace's arrivals (0: as recorded).
        """
        return cls(
            {"trace": Path(path), "trace_format": format, "requests": requests, "duration": duration,
             "time_scale": time_scale}
        )  # fmt: skip

    @classmethod
    def shipped(cls, name: str, **kwargs: Any) -> Trace:
        """A trace shipped with sage, by name (``mooncake:conversation``, ``mooncake:synthetic``,
        ``azure:code``, ``azure:conversation``); `kwargs` as `read`'s.

        Raises:
            ValueError: No shipped trace has that name (the message lists them).
        """
        from engine_adapter.sim.shipped_traces import shipped_trace

        path, shipped = shipped_trace(name)
        return cls.read(path, format=shipped.trace_format, **kwargs)

    @classmethod
    def synthetic(
        cls,
        *,
        requests: int = 1000,
        tenants: int | None = None,
        seed: int = 0,
        preset: str | None = None,
        block_size: int | None = None,
    ) -> Trace:
        """The seeded generator: multi-turn sessions over shared prefixes, or a named preset
        (``"spec"``: the module spec's workload).

        Args:
            requests: Requests to generate.
            tenants: Tenants (default: the generator's).
            seed: The seed: the same seed gives the same requests.
            preset: A preset's name instead of the default generator.
            block_size: Tokens per block (vLLM's ``--block-size``, SGLang's page size); default:
                the generator's.
        """
        return cls(
            {
                "workload": preset,
                "requests": requests,
                "tenants": tenants,
                "seed": seed,
                "block_size": block_size,
            }
        )

    def load(self) -> Workload:
        """Read (or generate) the requests now: a `Workload` (its `describe()` sums them up).

        Raises:
            BenchmarkError: An unreadable or malformed trace (a one-line message).
        """
        return build_workload(**self.options)


_EXTRA = "pip install 'sage-kv[dataframes]' (from a clone: pip install -e '.[dataframes]')"

_REPR_ROWS = 20
"""The rows `repr(results)` shows; the rest are counted."""


@dataclass(frozen=True)
class Results:
    """What `simulate` returns: the benchmark's JSON document and its rows' TTFT quantiles.

    Attributes:
        raw: The document ``sage llm benchmark --json`` prints.
        ttft_quantiles: Each row's TTFT quantiles at 0, 1, ..., 100 % (what `plot` draws).
    """

    raw: dict[str, Any]
    ttft_quantiles: list[tuple[float, ...]]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per (policy, capacity) row, reference rows included (``unbounded``,
        ``belady``), with the fields of the benchmark's table (``hit_rate``, ``ttft_p50_s``...)."""
        rows: list[dict[str, Any]] = self.raw["results"]
        return rows

    @property
    def workload(self) -> dict[str, Any]:
        """The workload: its source, requests, distinct blocks, block lookups, tokens."""
        workload: dict[str, Any] = self.raw["workload"]
        return workload

    @property
    def settings(self) -> dict[str, Any]:
        """What the sweep ran with: capacities, cache model, cost model, tiers, fleet."""
        settings: dict[str, Any] = self.raw["settings"]
        return settings

    def __repr__(self) -> str:
        """A summary: the workload, then one line per row (policy, blocks, hit rate, TTFT p50),
        not the document (`raw`) itself."""
        rows, workload = self.rows, self.workload
        head = (
            f"<Results: {workload.get('source')}, {workload.get('requests', 0):,} requests, "
            f"{self.settings.get('cache_model')} model, {len(rows)} rows"
        )
        saturated = self.raw.get("saturation", {}).get("saturated_rows") or []
        head += f", {len(saturated)} saturated>" if saturated else ">"
        width = max((len(str(row["policy"])) for row in rows), default=6)
        lines = [head, f"  {'policy':<{width}}  {'blocks':>9}  {'hit_rate':>8}  {'ttft_p50_s':>10}"]
        for row in rows[:_REPR_ROWS]:
            lines.append(
                f"  {row['policy']:<{width}}  {row['capacity_blocks']:>9,}  {row['hit_rate']:>8.4f}  "
                f"{row['ttft_p50_s']:>10.4g}"
            )
        if len(rows) > _REPR_ROWS:
            lines.append(f"  ... {len(rows) - _REPR_ROWS} more rows (results.rows, results.to_pandas())")
        return "\n".join(lines)

    def to_pandas(self) -> Any:
        """The rows as a `pandas.DataFrame` (needs pandas: the `dataframes` extra)."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise ImportError(f"Results.to_pandas needs pandas: {_EXTRA}") from None
        return pandas.DataFrame(self.rows)

    def to_polars(self) -> Any:
        """The rows as a `polars.DataFrame` (needs polars: the `dataframes` extra)."""
        try:
            import polars  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ImportError(f"Results.to_polars needs polars: {_EXTRA}") from None
        return polars.DataFrame(self.rows, infer_schema_length=None)

    def plot(self, path: str | Path | None = None) -> Any:
        """Hit rate against the capacity ratio per policy, and each cache size's TTFT CDF (the
        figure of ``--plot``); written as a PNG to `path` when given. Returns the
        `matplotlib.figure.Figure` (a notebook shows it). Needs matplotlib (the `plot` extra)."""
        from engine_adapter.sim.plot import benchmark_figure

        workload, model = self.workload, self.settings["cache_model"]
        title = f"{workload['source']}: {workload['requests']:,} requests ({model} model)"
        figure = benchmark_figure(self.rows, self.ttft_quantiles, workload["unique_blocks"], title)
        if path is not None:
            figure.savefig(path, dpi=100)
        return figure


PolicyLike = Any
"""A policy spec (``"slru:protected_threshold=3"``), an `EvictionPolicy` subclass or instance."""


def simulate(
    trace: Trace,
    policies: str | Sequence[PolicyLike] | PolicyLike,
    *,
    capacities: Sequence[int] | None = None,
    capacity_ratios: Sequence[float] | None = None,
    cache_model: str = "radix",
    jobs: int | None = 1,
    **options: Any,
) -> Results:
    """Run each policy at each capacity on `trace`, beside the reference rows, as ``sage llm
    benchmark --mode sim`` does.

    Args:
        trace: The requests (`Trace.read`, `Trace.shipped`, `Trace.synthetic`).
        policies: Policy specs (registry names, optionally ``name:k=v``), as a list or one
            comma-separated string (``"lru,slru:protected_threshold=3"``); or policy classes
            and instances defined here (an `EvictionPolicy` subclass: registered for the session
            by `sage_eviction.register_policy`; an instance stands for its class and the params
            it was built with). A row is labelled with its spec, params included. Built-ins run
            in the compiled loops, a class of the session in Python (``policy_calls``).
        capacities: Cache sizes in blocks, a list of whole numbers; or
        capacity_ratios: Cache sizes as fractions of the trace's distinct blocks (default 5 %
            and 10 %). Not both.
        cache_model: ``"radix"`` (sage's cache), ``"flat"`` (libCacheSim's model),
            ``"sglang"`` (SGLang's radix cache, queue order and retraction: SGLang's eviction
            strategies or ``sage-<spec>``; ``schedule_policy="lpm"`` among the options), or an
            engine twin (``"vllm"``, ``"sage"``: sage's own engine scheduler).
        jobs: Worker processes for the rows (1: this process, the default here; None: every
            usable core); 1 with a policy class of the session.
        **options: Any other field of `engine_adapter.sim.benchmark.SimBenchmarkOptions`
            (``host_capacity_ratio``, ``replicas``, ``routers``, ``cost_model``, ``output``...).

    Warns:
        SaturationWarning: Rows whose TTFT measures a queue, not the cache (``results.raw
            ["saturation"]``); ``cost_model_path="h100-llama-1b"`` is an engine that keeps up.

    Raises:
        BenchmarkError: Options it cannot run with, or an unreadable trace (one-line message).
        TypeError: An argument of the wrong type, or an option that is not a field of
            `SimBenchmarkOptions` (the message suggests the nearest).
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a Trace (Trace.read, Trace.shipped, Trace.synthetic), not {trace!r}")
    check_options(options)
    blocks, ratios = check_capacities(capacities, capacity_ratios)
    specs = policy_specs(policies, jobs, options.get("ray_address"))
    run: SweepRun = run_sweep(
        **trace.options,
        policies=specs,
        capacity_blocks=blocks,
        capacity_ratios=ratios,
        cache_model=cache_model,
        jobs=jobs,
        **options,
    )
    for message in run.result["saturation"]["warnings"]:
        warnings.warn(message, SaturationWarning, stacklevel=2)
    return Results(run.result, run.ttft_quantiles)
