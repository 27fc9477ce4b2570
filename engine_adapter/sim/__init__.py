"""The trace-driven simulator.

    workloads.py   request streams: Mooncake and Azure traces, the synthetic generator, presets
    cost_model.py  prefill and decode step times on the virtual clock
    simulator.py   the event-driven simulation over the cache manager (radix) or a flat cache
    benchmark.py   `sage llm benchmark --mode sim`: every policy at every capacity, plus references

Importing this package imports no submodule and never torch; import what you need, e.g.
``from engine_adapter.sim.workloads import read_mooncake``.
"""

from __future__ import annotations

__all__: list[str] = []
