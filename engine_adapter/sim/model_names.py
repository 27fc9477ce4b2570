"""The simulator's cache models and twins by name: the one list the simulator and the CLI read.

`sage llm benchmark --cache-model` offers exactly these names and ``--schedule-policy`` exactly
`SCHEDULE_POLICIES`; the CLI may not import engine_adapter on its light paths, so
`sage_cli.benchmark.options` loads this file by path (`runpy`) rather than importing it. Hence
this module imports nothing (the standard library's ``__future__`` aside) and holds data only.
"""

from __future__ import annotations

__all__ = ["CACHE_MODELS", "EVENT_LOOP_MODELS", "SCHEDULE_POLICIES", "TWINS"]

EVENT_LOOP_MODELS: tuple[str, ...] = ("radix", "flat", "sglang")
"""The cache models the simulator's own event loop runs (`engine_adapter.sim.cache_model_kinds`):
sage's engine's radix cache, libCacheSim's flat cache, SGLang's radix cache and scheduler."""

TWINS: dict[str, str] = {
    "vllm": "engine_adapter.sim.twins.vllm_run:simulate_vllm",
    "sage": "engine_adapter.sim.twins.sage_run:simulate_sage",
}
"""Engine twins with their own scheduler: name -> the row runner, ``module:function``, imported
on first use (`engine_adapter.sim.twins.twin_runner`)."""

CACHE_MODELS: tuple[str, ...] = (*EVENT_LOOP_MODELS, *TWINS)
"""Every name ``--cache-model`` and `simulate(cache_model=...)` accept."""

SCHEDULE_POLICIES: tuple[str, ...] = ("fcfs", "lpm", "dfs-weight")
"""SGLang's queue orders the sglang model has (``fcfs`` is SGLang's default and the other
models' only order; `engine_adapter.sim.twins.sglang_queue`)."""
