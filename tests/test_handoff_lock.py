"""The cache lock the engine loop hands over between steps (a control request waits one step)."""

from __future__ import annotations

import threading
import time

from engine_adapter.cache.handoff_lock import HandoffLock


def test_a_waiting_thread_takes_the_lock_between_two_steps() -> None:
    lock = HandoffLock()
    steps_when_taken: list[int] = []
    steps = 0

    def waiter() -> None:
        with lock:
            steps_when_taken.append(steps)

    # The engine loop's shape: hold the lock for a step, hand it over if anyone waits, go on.
    # At step 10 the waiter is started and the step lasts until it is blocked on the lock.
    thread = threading.Thread(target=waiter)
    while not steps_when_taken and steps < 100_000:
        with lock:
            steps += 1
            if steps == 10:
                thread.start()
                while not lock.waiting:
                    time.sleep(0.001)
        if lock.waiting:
            lock.yield_to_waiters(timeout=5.0)
    thread.join()
    assert steps_when_taken == [10]  # its turn came right after the step it waited behind


def test_it_is_reentrant_and_counts_only_blocked_threads() -> None:
    lock = HandoffLock()
    with lock, lock:  # the holder takes it again without blocking
        assert lock.waiting == 0
        assert lock.acquire(blocking=False)
        lock.release()
    outside: list[bool] = []
    with lock:
        t = threading.Thread(target=lambda: outside.append(lock.acquire(blocking=False)))
        t.start()
        t.join()
    assert outside == [False] and lock.waiting == 0
