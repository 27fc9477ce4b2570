"""The trace-driven simulator.

    workloads.py   requests and workloads; the Mooncake and Azure trace readers, the prefix model
    trace_file.py  trace files as a stream of lines (and their sha256); WorkloadError
    synthetic.py   the seeded synthetic generator and the presets
    sources.py     workloads by name, for the CLI
    cost_model.py  prefill and decode step times on the virtual clock
    simulator.py   the event-driven simulation on the virtual clock
    cache_models.py  the radix model (the real CacheManager) and the flat model
    benchmark.py   `sage llm benchmark --mode sim`: every policy at every capacity, plus references
    colocation_workload.py  LLM requests and embedding batches (spec 004's grid), capacity
    colocation.py  the colocation simulator: the systems on one block pool, shared or split compute
    colocation_bench.py  `sage llm benchmark --workload colocation`: the systems on the grid

Importing this package imports no submodule and never torch; import what you need, e.g.
``from engine_adapter.sim.workloads import read_mooncake``.
"""

from __future__ import annotations

__all__: list[str] = []
