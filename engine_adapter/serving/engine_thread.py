"""The engine thread: the one thread that runs torch for an engine (docs/architecture.md, "Threads").

libgomp keeps one OpenMP thread team per thread that starts a parallel region, so a model
loaded on one thread, stepped on another and queried from a third would own two or three teams
that spin against each other for the same cores (on 2 cores that cost about 45 % of decode
speed). So everything that touches torch runs here: `torch.set_num_threads`, loading the model,
its warm-up, every step, and the control requests that need the model or the pool.

`EngineThread` is a daemon thread that runs jobs one at a time. A job is a callable; `call`
runs one there and waits for its answer, `submit` returns its future. The engine's loop is one
long job (`Engine.start`), and it runs the jobs queued meanwhile between two steps
(`run_pending`), so a control request waits at most one step, whether the loop runs or not.
The thread ends when its owner is collected, or at `close`.

`apply_threads` is the job that sets the thread count, and `ThreadSettings` what it found:
the count, the cores, ``OMP_NUM_THREADS`` and the warnings when they disagree.

Imports: the standard library, structlog and torch; nothing of the engine.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
import torch

__all__ = ["EngineThread", "ThreadSettings", "apply_threads", "check_threads", "usable_cores"]

log = structlog.get_logger("sage.engine")

T = TypeVar("T")
_Job = Callable[[], None]


def _run_jobs(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The thread's body. It holds the queue, never its owner, so that an idle engine that
    nobody references can be collected (and its thread then ends)."""
    while (job := jobs.get()) is not None:
        job()
        del job  # the finished job's closure may hold the engine


class EngineThread:
    """A daemon thread that runs the jobs given to it, in order.

    Args:
        name: The thread's name (``sage-engine-<name>``).
        wake: Called after each job is queued: the engine's loop sleeps on it when idle.
    """

    def __init__(self, name: str, wake: Callable[[], None] | None = None) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._wake = wake
        self.thread = threading.Thread(target=_run_jobs, args=(self._jobs,), name=name, daemon=True)
        self.thread.start()
        weakref.finalize(self, self._jobs.put, None)

    @property
    def ident(self) -> int | None:
        """The thread's `threading.get_ident()`."""
        return self.thread.ident

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return threading.get_ident() == self.thread.ident

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue `fn(*args, **kwargs)`; its future holds the answer or the exception."""
        future: Future[T] = Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller re-raises it
                future.set_exception(exc)

        self._jobs.put(job)
        if self._wake is not None:
            self._wake()
        return future

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on this thread (at once when the caller is this thread)."""
        if self.is_current():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def run_pending(self) -> None:
        """Run the jobs queued so far: from a long job (the engine loop), between two steps."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is None:  # closed while the long job runs: the thread ends after it
                self._jobs.put(None)
                return
            job()

    def close(self) -> None:
        """End the thread once the jobs queued before are done."""
        self._jobs.put(None)


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(slots=True)
class ThreadSettings:
    """The engine thread's torch threads (``GET /v1/engine``'s ``threads``).

    Attributes:
        threads: What the engine asked for (``--threads``, else `cores`).
        cores: The cores the process may run on.
        omp_num_threads: ``$OMP_NUM_THREADS`` as set, or None.
        torch_threads: ``torch.get_num_threads()`` on the engine thread, at the last check.
        warnings: One line per disagreement (also logged).
    """

    threads: int
    cores: int
    omp_num_threads: str | None
    torch_threads: int
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "cores": self.cores,
            "omp_num_threads": self.omp_num_threads,
            "torch_threads": self.torch_threads,
            "warnings": list(self.warnings),
        }


def _warn(settings: ThreadSettings, message: str) -> None:
    if message not in settings.warnings:
        settings.warnings.append(message)
        log.warning("threads", problem=message)


def apply_threads(threads: int | None) -> ThreadSettings:
    """Set torch's intra-op threads on the calling thread (the engine thread, before the model
    loads) and say what disagrees: ``OMP_NUM_THREADS``, or more threads than cores.

    The inter-op pool is left alone: the engine never forks torch work (no ``torch.jit.fork``),
    so that pool is never started.
    """
    cores = usable_cores()
    wanted = threads if threads is not None else cores
    torch.set_num_threads(wanted)
    env = os.environ.get("OMP_NUM_THREADS")
    settings = ThreadSettings(wanted, cores, env, torch.get_num_threads())
    if env is not None and env.strip() != str(wanted):
        _warn(
            settings,
            f"OMP_NUM_THREADS={env} but the engine runs {wanted} torch threads "
            "(--threads wins on the engine thread; unset OMP_NUM_THREADS or make them agree)",
        )
    if wanted > cores:
        _warn(
            settings,
            f"--threads {wanted} is more than the {cores} cores this process may use: they will contend",
        )
    return check_threads(settings)


def check_threads(settings: ThreadSettings) -> ThreadSettings:
    """Compare torch's thread count on the calling thread (the engine thread) with the one asked
    for, e.g. after the model loaded (a library may have changed it); warn when they differ."""
    settings.torch_threads = torch.get_num_threads()
    if settings.torch_threads != settings.threads:
        _warn(
            settings,
            f"torch runs {settings.torch_threads} threads on the engine thread, not the "
            f"{settings.threads} asked for",
        )
    return settings
