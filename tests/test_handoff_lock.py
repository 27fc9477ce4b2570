"""The cache lock the engine loop hands over between steps (a control request waits one step)."""

from __future__ import annotations

import threading

from engine_adapter.cache.handoff_lock import HandoffLock


def test_a_waiting_thread_takes_the_lock_between_two_steps() -> None:
    lock = HandoffLock()
    steps_when_taken: list[int] = []
    started = threading.Event()
    steps = 0

    def waiter() -> None:
        started.wait()
        with lock:
            steps_when_taken.append(steps)

    thread = threading.Thread(target=waiter)
    thread.start()
    # The engine loop's shape: hold the lock for a step, hand it over if anyone waits, go on.
    while not steps_when_taken and steps < 200_000:
        with lock:
            steps += 1
            if steps == 10:
                started.set()
        if lock.waiting:
            lock.yield_to_waiters(timeout=5.0)
    thread.join()
    assert steps_when_taken and steps_when_taken[0] < 200_000
    assert steps == steps_when_taken[0]  # the loop stopped at the step the waiter took its turn


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
