"""The cache manager's lock, which the engine loop hands over between steps.

The engine thread holds the cache lock for a whole scheduler step, releases it and takes it again
for the next. CPython's locks are not fair: a thread that releases a lock and asks for it again at
once almost always wins, so a control request (a hot swap, a stats read) could wait until the
batch drains. `HandoffLock` counts the threads that wait for it, and the engine loop calls
`yield_to_waiters` after each step: it returns as soon as every thread that waited has had its
turn (or after a short timeout), so a control request waits at most one step.
"""

from __future__ import annotations

import threading
from types import TracebackType

__all__ = ["HandoffLock"]


class HandoffLock:
    """A reentrant lock whose holder can wait for the threads queued behind it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._waiters = threading.Condition(threading.Lock())
        self._waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):  # free, or held by this thread (reentrant)
            return True
        if not blocking:
            return False
        with self._waiters:
            self._waiting += 1
        try:
            return self._lock.acquire(timeout=timeout)
        finally:
            with self._waiters:
                self._waiting -= 1
                self._waiters.notify_all()

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> HandoffLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @property
    def waiting(self) -> int:
        """Threads blocked in `acquire` now."""
        return self._waiting

    def yield_to_waiters(self, timeout: float = 0.05) -> None:
        """Called without the lock held: wait until no thread waits for it (each took its turn)."""
        with self._waiters:
            self._waiters.wait_for(lambda: self._waiting == 0, timeout)
