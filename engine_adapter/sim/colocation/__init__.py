"""The colocation simulator: LLM requests and embedding batches on one block pool (issue 19).

One run replays a `ColocationWorkload` through one *system* on a virtual clock. Its modules,
in the order a run uses them:

    workload.py    the workload (spec 004's grid and the shifting mix), its capacity, the pool's
                   shape (`PoolShape`) and the embedding cost model
    systems.py     the systems of the comparison (`SystemSpec`, `SYSTEMS`)
    pool.py        the pool of a run: the engine's `CacheManager` over a `BlockAllocator`, the
                   registered eviction policy, LLM sequences and embedding reservations
    state.py       the state of a run (`ColocationRun`): requests in flight, queues, quota, views
    llm.py         the LLM side: admission (FCFS or Algorithm 1), preemption, completion
    embeddings.py  the embedding side: arrival and admission, start on a reservation, completion
    step.py        one engine iteration: its work and its time (shared or split compute)
    run.py         `run_colocation`: the loop on the virtual clock
    metrics.py     `RunResult` and `metrics`: a run's counts and its row
    benchmark.py   `run_colocation_benchmark`: the systems on the grid (`sage llm benchmark
                   --workload colocation`)

The controller the systems call (Algorithms 1-3, the quotas) is `engine_adapter.colocation`,
which the engine calls too. These modules import it, the cache core (`engine_adapter.cache`)
and the simulator's cost model; never torch, `model` or `serving`. Importing this package
imports the run (`run_colocation`, `SYSTEMS`, `RunResult`, `metrics`); the grid is imported
from `engine_adapter.sim.colocation.benchmark`.
"""

from __future__ import annotations

from engine_adapter.sim.colocation.metrics import RunResult, metrics
from engine_adapter.sim.colocation.run import run_colocation
from engine_adapter.sim.colocation.systems import DEFAULT_SYSTEMS, SYSTEMS, SystemSpec

__all__ = ["DEFAULT_SYSTEMS", "SYSTEMS", "RunResult", "SystemSpec", "metrics", "run_colocation"]
