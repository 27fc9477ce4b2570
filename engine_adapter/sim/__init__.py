"""The trace-driven simulator: workloads through the engine's cache core on a virtual clock.

Workloads (what a run replays):

    workloads.py       the records every source returns (`SimRequest`, `Workload`) and their checks
    request_table.py   `RequestTable`: a workload's requests as arrays (keys, offsets, columns)
    trace_file.py      trace files as a stream of lines (and their sha256); `WorkloadError`
    mooncake_trace.py  `read_mooncake`: the native JSON-lines format
    contracts.py       a request's prompt-cache contract fields (salt, lifetime, breakpoint)
    azure_trace.py     `read_azure`: the Azure CSV, with prefixes from the prefix model
    prefix_model.py    `PrefixModel`: seeded shared system prompts and multi-turn conversations
    synthetic.py       the seeded synthetic generator and the presets (the module spec's)
    sources.py         workloads by name, for the CLI
    shipped_traces.py  the traces the repository ships (gzipped, with their licences), by name

The run (one policy at one capacity):

    cost_model.py      prefill and decode step times on the virtual clock
    cost_models/       the shipped cost models by name (``--cost-model h100-llama-1b``), YAML
    simulator.py       `Simulator`: the event-driven loop, admission, growth, preemption, the row
    capacity.py        the smallest capacity a workload runs in, and a row's capacity checked
    sequence.py        `SimSequence`: a request in flight
    run_state.py       `RunState`, `StepAdmission`: what a run changes, what a step admits
    sim_result.py      `SimResult`: the row a run ends with (every cache model writes it)
    decode_steps.py    runs of decode-only steps: how many to the next event, and how long
    cache_models.py    the radix model (the real `CacheManager`) and the flat model
    contract_model.py  the radix model handing each request's contract to the cache, and the
                       row's contract figures (retention, tokens per tier, idle block-seconds)
    cache_model_kinds.py  the cache models as objects: their options, what they build, why a
                       row runs compiled or not (`cache_model_for`, `model_traits`)
    model_names.py     the one list of cache model and twin names (the CLI reads it by path)
    flat_run.py        a flat row's whole run in one compiled call (`_flat_run.pyx`), same row
    radix_run.py       a radix row's whole run in one compiled call (`_radix_run.pyx`: the
                       cache, its policy's state and the accounting in C), same row

The benchmark (`sage llm benchmark --mode sim`):

    benchmark.py       every policy at every capacity, plus the reference rows
    benchmark_inputs.py  the workload the options describe, its capacities, `BenchmarkError`
    sweep.py           the rows in this process, in worker processes or on Ray
    sweep_bar.py       the sweep's progress bar (Rich, stderr, drawn only when told)
    saturation.py      which rows measure a queue rather than the cache, and the warning
    plot.py            ``--plot``: hit rate against the capacity ratio, TTFT CDFs
    plot_ages.py       the plot's panels of block age at hit and at eviction per policy
    fleet/             ``--replicas N --router R``: the workload over N engines behind a router
                       on one clock (docs/fleet.md; its own docstring lists its files)
    twins/             engine twins, ``--cache-model vllm|sage|sglang``: an engine's own cache (and
                       where it decides hits, its scheduler) as a cache model, proven against
                       the real package (its own docstring lists its files and the registry `TWINS`)

    colocation/        the colocation study: LLM requests and embedding batches on one pool,
                       on the same cache manager and policies (its own docstring lists its files)

It imports the cache core (`engine_adapter.cache`), the colocation controller
(`engine_adapter.colocation`), `engine_adapter.safe_yaml`, `sage_eviction`, numpy and PyYAML;
rich, matplotlib and Ray only inside the functions that need them; never torch, `model` or
`serving`.
The library (`api.py`): `Trace`, `simulate` and its `Results` (``to_pandas``, ``to_polars``,
``plot``), what the benchmark runs, for notebooks; `register_policy` for a policy class of the
session; importable from here:

    api.py             `Trace.read` / `Trace.shipped` / `Trace.synthetic`, `simulate`, `Results`
    api_checks.py      `simulate`'s arguments checked in Python's words (policies, capacities)

Importing this package imports no submodule (the library's names load on first use); import
what you need, e.g. ``from engine_adapter.sim import Trace, simulate`` or
``from engine_adapter.sim.mooncake_trace import read_mooncake``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BenchmarkError", "Results", "SaturationWarning", "Trace", "register_policy", "simulate"]


def __dir__() -> list[str]:
    # The lazy names too: `dir(engine_adapter.sim)` and a notebook's completion show the library.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def __getattr__(name: str) -> Any:
    # The library's names, imported on first use: the CLI's light commands import this package
    # without paying for the simulator.
    if name in __all__:
        from engine_adapter.sim import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
