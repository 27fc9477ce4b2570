"""Run a benchmark's (policy, capacity) rows: in this process, in worker processes, or on Ray.

`run_rows(context, rows, executor, progress)` returns one `RowOutcome` per `RowSpec`, in the
order of `rows` whichever executor ran them, so the benchmark's JSON does not depend on it
(only the wall-time fields differ). Every executor runs the same top-level function,
`run_row`, on the same typed records:

- `SweepContext`: what all rows share (the workload, the cache model, the cost model). It
  crosses to each worker once, not once per row: a forked worker inherits it, a spawned one
  unpickles it in its initializer, a Ray worker fetches it from the object store on its first
  row of the sweep and keeps it for the next ones.
- `RowSpec`: one row (its index, policy, capacity, adaptive batch or not; for a fleet row, its
  router and replicas: `run_row` then replays it with `engine_adapter.sim.fleet.run`).
- `RowOutcome`: the row's dict, which implementation of the core computed it
  (`sage_eviction.native.core_implementation()` in the process that ran it: a Ray node may
  differ from this machine), and its TTFT distribution as 101 quantiles (`--plot` draws the
  CDF from them; the row's dict, and so the JSON, carries only p50 and p99).

Executors (`Executor`): ``jobs=1`` runs the rows here, one after the other, with progress per
request; ``jobs=N`` runs them in N processes (`concurrent.futures.ProcessPoolExecutor`: forked
where the platform has fork and this process runs no other thread, since a fork inherits the
imported modules and the workload for free; spawned otherwise); ``ray_address`` runs them as Ray
tasks (`ray.init(address=...)`: ``"local"`` starts a cluster on this machine, ``"auto"`` joins
the one running here, ``"host:6379"`` or ``"ray://host:10001"`` a remote one, where sage must be
installed on every node; where this process is already connected to Ray, that connection is
used and left open). Ray is the optional extra ``sage-kv[ray]``. On an error or Ctrl-C the
worker processes are ended and the Ray tasks cancelled, rather than left to finish their rows.

Errors: a row's bad input stays the `ValueError` the simulator raised, whichever process raised
it; an executor that cannot run (Ray missing or unreachable, a worker process that died) raises
`SweepError`, one line.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.twins import TWINS, twin_runner
from engine_adapter.sim.workloads import Workload
from sage_eviction.metrics import percentile
from sage_eviction.native import core_implementation

__all__ = [
    "Executor",
    "RowOutcome",
    "RowProgress",
    "RowSpec",
    "SweepContext",
    "SweepError",
    "ray_available",
    "run_row",
    "run_rows",
    "ttft_quantiles",
    "usable_cores",
]

RAY_EXTRA = "pip install 'sage-kv[ray]'"

# How often a waiting executor redraws the progress bar (seconds); the bar has no thread of its own.
_POLL_S = 0.25


class SweepError(RuntimeError):
    """The rows could not be run where they were sent; the message is one line."""


@dataclass(frozen=True, slots=True)
class SweepContext:
    """What every row of a sweep shares; sent to each worker once."""

    workload: Workload
    cache_model: str
    cost_model: CostModel
    protect_queued: float = 0.0
    write_policy: str = "write_back"  # of the rows with KV tiers
    schedule_policy: str = "fcfs"  # the sglang model's queue order
    preemption_order: str = "policy"  # the radix model's scheduler's (sage_eviction.preemption)


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One row of a sweep: a policy (or ``"unbounded"``) at a capacity (None: the workload's), with
    a host tier of `host_blocks` under `host_policy` (and a disk tier) or none."""

    index: int
    policy: str
    capacity: int | None
    adaptive: bool = False
    host_policy: str | None = None
    host_blocks: int = 0
    disk_blocks: int = 0
    prefetch_blocks: int = 0
    router: str | None = None  # a fleet row: `replicas` replicas of `capacity` behind this router
    replicas: int = 0
    compress: str | None = None  # compress-on-evict's PRESS:RATIO, or None

    @property
    def label(self) -> str:
        label = f"{self.policy} @ {self.capacity if self.capacity is not None else 'unbounded'}"
        if self.router is not None:
            label = f"{self.router} x {self.replicas}: {label}"
        if self.host_policy is not None:
            label += f" + host {self.host_policy} @ {self.host_blocks}"
            label += f" + disk @ {self.disk_blocks}" if self.disk_blocks else ""
        label += f" + compress {self.compress}" if self.compress else ""
        return label + (" (adaptive batch)" if self.adaptive else "")

    def tiers(self, write_policy: str) -> TierConfig | None:
        """The row's KV tiers, or None."""
        if self.host_policy is None or not self.host_blocks:
            return None
        return TierConfig(
            host_blocks=self.host_blocks,
            disk_blocks=self.disk_blocks,
            host_policy=self.host_policy,
            write_policy=write_policy,
            prefetch_blocks=self.prefetch_blocks,
        )


@dataclass(frozen=True, slots=True)
class RowOutcome:
    """A row's figures (`SimResult.to_dict()`), the implementation of the core that ran it, its
    TTFT quantiles at 0, 1, ..., 100 % (seconds; empty when no request got a token), and how the
    cache called the policy: "c-state" (in C with its state in C arrays: the flat model's
    `sage_eviction._core.FlatState`), "compiled" (the policy's C table,
    `sage_eviction._core.PolicyOps`) or "python" (its methods: the pure-Python core, the twin
    models, a plugin); and its event loop: "compiled" (the whole row in one compiled call) or
    "python (why)" (`Simulator.loop_label`)."""

    index: int
    row: dict[str, Any]
    implementation: str
    ttft_quantiles_s: tuple[float, ...] = ()
    policy_calls: str = "python"
    event_loop: str = "python"


def ttft_quantiles(sorted_ttfts: Sequence[float]) -> tuple[float, ...]:
    """The quantiles at 0, 1, ..., 100 % of sorted TTFTs: a CDF in 101 points, whatever the count."""
    if not sorted_ttfts:
        return ()
    return tuple(percentile(sorted_ttfts, q / 100) for q in range(101))


@dataclass(frozen=True, slots=True)
class Executor:
    """Where the rows run: `jobs` local processes (1: this process), or Ray at `ray_address`."""

    jobs: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if type(self.jobs) is not int or self.jobs < 1:
            raise ValueError(f"jobs={self.jobs!r}: give a positive number of processes")

    def workers(self, rows: int) -> int:
        """Local processes for `rows` rows: never more than rows (0 with Ray: the cluster's)."""
        return 0 if self.ray_address is not None else max(1, min(self.jobs, rows))

    def describe(self, rows: int) -> dict[str, Any]:
        """The executor as the benchmark's JSON records it (``"run"``)."""
        if self.ray_address is not None:
            return {"executor": "ray", "ray_address": self.ray_address}
        workers = self.workers(rows)
        return {"executor": "processes" if workers > 1 else "in-process", "workers": workers}


class RowProgress(Protocol):
    """What an executor reports while rows run (the benchmark draws a bar from it)."""

    def started(self, spec: RowSpec) -> None:
        """`spec` started (reported only where rows run one at a time)."""

    def requests_done(self, spec: RowSpec, done: int) -> None:
        """`done` requests of `spec` are finished so far."""

    def finished(self, spec: RowSpec) -> None:
        """`spec` is done."""

    def refresh(self) -> None:
        """Redraw (called while waiting on workers)."""


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), the default number of `--jobs`."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def ray_available() -> bool:
    """Whether the optional `ray` package is installed (without importing it: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def run_row(
    context: SweepContext, spec: RowSpec, progress: Callable[[int], None] | None = None
) -> RowOutcome:
    """Simulate one row: the same code whichever executor calls it.

    Raises:
        ValueError: A policy or capacity the simulator cannot run with.
    """
    n_requests = len(context.workload.requests)
    every = max(1, min(1000, n_requests // 20 or 1))
    if spec.router is not None:
        from engine_adapter.sim.fleet.run import simulate_fleet

        fleet = simulate_fleet(
            context.workload,
            spec.replicas,
            spec.router,
            spec.policy,
            spec.capacity,
            progress=progress,
            progress_every=every,
            cost_model=context.cost_model,
            protect_queued=context.protect_queued,
        )
        return RowOutcome(
            spec.index,
            fleet.result.to_dict(),
            core_implementation(),
            ttft_quantiles(fleet.ttft_s),
            fleet.policy_calls,
            "python (a fleet: its replicas step on one clock)",
        )
    if context.cache_model in TWINS:  # an engine's twin: its own scheduler on the cost model's clock
        order = {} if context.preemption_order == "policy" else {"preemption_order": context.preemption_order}
        twin = twin_runner(context.cache_model)(
            context.workload, spec.policy, spec.capacity, cost_model=context.cost_model, **order
        )
        twin_loop = f"python (the {context.cache_model} twin)"
        return RowOutcome(
            spec.index, twin.result.to_dict(), "twin", ttft_quantiles(twin.ttft_s), event_loop=twin_loop
        )
    with _row_garbage_collected():
        return _simulated_row(context, spec, progress, every)


@contextmanager
def _row_garbage_collected() -> Iterator[None]:
    """Collect the cycles a row leaves when it returns, traversing only what it made.

    The row's simulator, run and cache manager refer to each other (the manager's clock is the
    simulator's): freed when the row returns, not at a collection that a compiled row, which
    makes few Python objects, may not reach before the next row is built beside it (Belady's
    next uses, 8 bytes a lookup, were still held while the unbounded row ran). A full collection
    walks every object of the process, the trace's included: 33 ms a row on the Mooncake
    conversation trace, a third of a flat lru row. What lived before the row is frozen for the
    collection (`gc.freeze`: out of the collected generations, O(1)) and given back after, so it
    walks the row's objects only; where something else froze objects already (a forked worker),
    the collection is a full one, as before."""
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        if frozen:
            gc.unfreeze()


def _simulated_row(
    context: SweepContext, spec: RowSpec, progress: Callable[[int], None] | None, every: int
) -> RowOutcome:
    """`run_row` of a plain row: one `Simulator`."""
    simulator = Simulator(
        context.workload,
        spec.policy,
        spec.capacity,
        cache_model=context.cache_model,
        cost_model=context.cost_model,
        progress=progress,
        progress_every=every,
        protect_queued=context.protect_queued,
        adaptive_batch=spec.adaptive,
        tiers=spec.tiers(context.write_policy),
        compress_on_evict=spec.compress,
        schedule_policy=context.schedule_policy,
        preemption_order=context.preemption_order,
    )
    row = simulator.run().to_dict()
    quantiles = ttft_quantiles(simulator.ttft_s)
    calls, loop = simulator.policy_calls, simulator.loop_label
    return RowOutcome(spec.index, row, core_implementation(), quantiles, calls, loop)


def run_rows(
    context: SweepContext, rows: Sequence[RowSpec], executor: Executor, progress: RowProgress
) -> list[RowOutcome]:
    """Every row of `rows`, run by `executor`; the outcomes in the order of `rows`.

    Raises:
        ValueError: A row the simulator cannot run (the first one found).
        SweepError: The executor cannot run them (Ray missing or unreachable, a dead worker).
    """
    if executor.ray_address is not None:
        outcomes = _run_on_ray(context, rows, executor.ray_address, progress)
    elif executor.workers(len(rows)) > 1:
        outcomes = _run_in_processes(context, rows, executor.workers(len(rows)), progress)
    else:
        outcomes = _run_here(context, rows, progress)
    by_index = {outcome.index: outcome for outcome in outcomes}
    return [by_index[spec.index] for spec in rows]


# ---------------------------------------------------------------------- in this process


def _run_here(context: SweepContext, rows: Sequence[RowSpec], progress: RowProgress) -> list[RowOutcome]:
    outcomes = []
    for spec in rows:
        progress.started(spec)

        def tick(done: int, spec: RowSpec = spec) -> None:
            progress.requests_done(spec, done)

        outcomes.append(run_row(context, spec, tick))
        progress.finished(spec)
    return outcomes


# ---------------------------------------------------------------------- worker processes

_WORKER_CONTEXT: SweepContext | None = None
"""The sweep a worker process serves: set once by `_init_worker`, read by every row it runs."""


def _init_worker(context: SweepContext | None) -> None:
    global _WORKER_CONTEXT
    # Ctrl-C reaches the whole process group: the parent handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if context is not None:  # None: forked, the context is already here
        _WORKER_CONTEXT = context


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the workers now (on an error or Ctrl-C): `shutdown` alone lets the rows already
    queued to them run to their end."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14+
    if terminate is not None:
        terminate()
        return
    processes: dict[int, Any] = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        process.terminate()


def _worker_row(spec: RowSpec) -> RowOutcome:
    if _WORKER_CONTEXT is None:
        raise SweepError("a worker process started without its sweep")
    return run_row(_WORKER_CONTEXT, spec)


def _run_in_processes(
    context: SweepContext, rows: Sequence[RowSpec], workers: int, progress: RowProgress
) -> list[RowOutcome]:
    global _WORKER_CONTEXT
    # fork is safe only while no other thread holds a lock the child would inherit locked; the
    # progress bar has no thread of its own (the executor redraws it between waits).
    forking = "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1
    mp_context = multiprocessing.get_context("fork" if forking else "spawn")
    if forking:
        _WORKER_CONTEXT = context  # inherited by the forked workers: nothing is pickled
    outcomes: list[RowOutcome] = []
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp_context,
        initializer=_init_worker,
        initargs=(None if forking else context,),
    )
    try:
        pending: dict[Future[RowOutcome], RowSpec] = {pool.submit(_worker_row, spec): spec for spec in rows}
        while pending:
            done, _ = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                spec = pending.pop(future)
                outcomes.append(future.result())
                progress.finished(spec)
            progress.refresh()
    except BrokenProcessPool as exc:
        raise SweepError(f"a worker process died while running the rows: {exc}") from None
    except BaseException:
        _stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if forking:
            _WORKER_CONTEXT = None
    return outcomes


# ---------------------------------------------------------------------- Ray

_RAY_SWEEP: tuple[str, SweepContext] | None = None
"""The sweep a Ray worker process served last (its id and context), kept for its next rows."""


def _ray_row(sweep_id: str, boxed_context: list[Any], spec: RowSpec) -> RowOutcome:
    """A Ray task: one row. The context's object ref comes in a list so that Ray does not fetch
    it for every task; a worker fetches it on its first row of the sweep."""
    global _RAY_SWEEP
    if _RAY_SWEEP is None or _RAY_SWEEP[0] != sweep_id:
        import ray

        _RAY_SWEEP = (sweep_id, ray.get(boxed_context[0]))
    return run_row(_RAY_SWEEP[1], spec)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _run_on_ray(
    context: SweepContext, rows: Sequence[RowSpec], address: str, progress: RowProgress
) -> list[RowOutcome]:
    if not ray_available():
        raise SweepError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}")
    import ray
    from ray.exceptions import RayError, RayTaskError

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SweepError(
                f"--ray {address}: cannot start or reach a Ray cluster: {_one_line(exc)}"
            ) from None
    pending: dict[Any, RowSpec] = {}
    try:
        context_ref = ray.put(context)
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_row)
        sweep_id = uuid.uuid4().hex
        pending = {task.remote(sweep_id, [context_ref], spec): spec for spec in rows}
        outcomes: list[RowOutcome] = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            for ref in done:
                spec = pending.pop(ref)
                try:
                    outcomes.append(ray.get(ref))
                except RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, ValueError):
                        raise cause from None
                    raise SweepError(f"Ray task {spec.label} failed: {_one_line(cause or exc)}") from None
                except RayError as exc:
                    raise SweepError(f"Ray task {spec.label} failed: {_one_line(exc)}") from None
                progress.finished(spec)
            progress.refresh()
        return outcomes
    except BaseException:
        for ref in pending:  # on a cluster that outlives this run, its rows would go on
            ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()
