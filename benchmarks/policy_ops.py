"""A policy's operations through its C table (`PolicyOpsCaller`, what the compiled radix core
calls) against its Python methods, per built-in policy with a table (issue 34, item 1).

One call sequence per policy, recorded once with a seeded generator and the policy itself: a
skewed stream of lookups over a cache of 1,024 blocks (a hit is `access`, a miss `evict(1)` when
full and then `insert`), with set_evictable toggles (a lookup pins its block with probability
0.2; the ninth pin releases the oldest). Both paths replay the same calls on a fresh policy (an
offline policy is given the lookups as its future), so they do the same work and return the same
victims (checked); the figure is the best of three replays.

    python benchmarks/policy_ops.py                          # every policy with a table, 200,000 calls
    python benchmarks/policy_ops.py --policies gdsf,belady --ops 50000
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

if importlib.util.find_spec("sage_eviction") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from sage_eviction import EntryMeta, EvictionPolicy, create_policy, native

CAPACITY = 1024
KEYS = 8 * CAPACITY
ALPHA = 0.3  # the Pareto shape of the key stream: about half the lookups hit
PIN = 0.2
PINS = 8

Call = tuple[str, tuple[Any, ...]]


def lookups_of(ops: int, seed: int) -> list[tuple[int, float]]:
    """Enough lookups for `ops` calls: a skewed key and a draw for pinning, each."""
    rng = random.Random(seed)
    return [(int(rng.paretovariate(ALPHA)) % KEYS, rng.random()) for _ in range(ops)]


def record(name: str, ops: int, lookups: list[tuple[int, float]]) -> list[Call]:
    """The calls, by driving a Python `name` policy along `lookups`."""
    policy = _fresh(name, lookups)
    calls: list[Call] = []
    pinned: list[Hashable] = []
    for position, (key, draw) in enumerate(lookups):
        if len(calls) >= ops:
            break
        if key in policy:
            calls.append(("access", (key, float(position))))
            policy.access(key, float(position))
        else:
            if len(policy) >= CAPACITY and policy.num_evictable:
                calls.append(("evict", (1,)))
                policy.evict(1)
            calls.append(("insert", (key, float(key % 7 + 1))))
            policy.insert(key, EntryMeta(cost=float(key % 7 + 1)))
        if draw < PIN and key not in pinned:
            pinned.append(key)
            calls.append(("set_evictable", (key, False)))
            policy.set_evictable(key, False)
            if len(pinned) > PINS:
                released = pinned.pop(0)
                calls.append(("set_evictable", (released, True)))
                policy.set_evictable(released, True)
    return calls


def _fresh(name: str, lookups: list[tuple[int, float]]) -> EvictionPolicy:
    policy = create_policy(name, capacity=CAPACITY)
    if policy.offline:
        policy.set_future([key for key, _ in lookups])  # type: ignore[attr-defined]
    return policy


def replay(target: Any, calls: list[Call]) -> tuple[float, list[Hashable]]:
    """Seconds to make `calls` on `target` (the policy or its caller), and the victims."""
    victims: list[Hashable] = []
    methods = ("insert", "access", "set_evictable")
    bound: dict[str, Callable[..., Any]] = {m: getattr(target, m) for m in methods}
    evict = target.evict
    # the metas are built before the clock starts: they are the cache's, not the policy's, work
    prepared = [(m, (a[0], EntryMeta(cost=a[1]))) if m == "insert" else (m, a) for m, a in calls]
    start = time.perf_counter()
    for method, args in prepared:
        if method == "evict":
            victims += evict(*args)
        elif method == "insert":
            bound["insert"](args[0], args[1], evictable=True)
        else:
            bound[method](*args)
    return time.perf_counter() - start, victims


def measure(name: str, ops: int, seed: int) -> tuple[float, float]:
    """Best-of-three seconds through the Python methods and through the C table."""
    core = native.load(native.CORE)
    assert core is not None, "the compiled core is not built (python setup.py build_ext --inplace)"
    lookups = lookups_of(ops, seed)
    calls = record(name, ops, lookups)
    best = {"python": float("inf"), "c": float("inf")}
    victims: dict[str, list[Hashable]] = {}
    for _ in range(3):
        for path in best:
            policy = _fresh(name, lookups)
            target = policy if path == "python" else core.PolicyOpsCaller(policy)
            seconds, victims[path] = replay(target, calls)
            best[path] = min(best[path], seconds)
    assert victims["python"] == victims["c"], f"{name}: the two paths chose different victims"
    return best["python"], best["c"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", help="comma-separated names (default: every policy with a table)")
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    core = native.load(native.CORE)
    if core is None:
        sys.exit("no compiled core: build it (python setup.py build_ext --inplace), unset SAGE_PURE_PYTHON")
    names = args.policies.split(",") if args.policies else sorted(set(core.compiled_policies()))
    print(machine_line())
    print(f"{args.ops:,} calls per policy (seed {args.seed}), best of 3")
    print(f"{'policy':<12} {'python s':>9} {'C table s':>9} {'speedup':>8} {'M calls/s (C)':>14}")
    for name in names:
        python_s, c_s = measure(name, args.ops, args.seed)
        print(f"{name:<12} {python_s:9.3f} {c_s:9.3f} {python_s / c_s:7.2f}x {args.ops / c_s / 1e6:14.2f}")


if __name__ == "__main__":
    main()
