"""``sage llm benchmark``: compare eviction policies, one module per mode.

    command.py            the command `benchmark` and its steps: check, then run one mode
    options.py            the options as `Annotated` aliases, `BenchmarkArgs` (one field each)
    checks.py             the options' checks, in order; `BenchmarkPlan`, `WorkloadSource`
    table.py              the table of policy rows; --output and --json
    sim.py                mode sim: the simulator (`engine_adapter.sim.benchmark.run_benchmark`)
    engine.py             mode engine: a live sage engine, or a temporary one
    remote.py             mode engine, --engine-url: a vLLM server or sage engines over HTTP,
                          directly or behind a router (--worker-url: the fleet's /metrics)
    replay.py             what the engine modes share: prompts, the replay, latency figures
    colocation.py         --workload colocation: `ColocationGrid`, its checks and its table
    colocation_sim.py     the colocation grid in the simulator
    colocation_engine.py  the colocation grid on live engines, one per system

Only `command`, `options`, `checks` and `colocation` load with the command tree; a mode's module
loads when it runs, and the engine (`engine_adapter`) inside its functions. The modes import the
shared modules, never one another, nor `command`.
"""

from __future__ import annotations

__all__: list[str] = []
