"""Memory of the learned `reuse` policy per held block, against `lru`, in steady state.

Fills a policy of capacity n with n blocks, then runs 3n requests over 2n keys (a hit when the
key is held, else an eviction and an insert), so that its open trials and miniature caches are
at their steady-state sizes, and reports the bytes tracemalloc attributes to the policy per held
block and per tracked key (held, or with an open trial, or in a miniature).

    python benchmarks/reuse_memory.py            # n = 100,000
    python benchmarks/reuse_memory.py --n 20000
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

if importlib.util.find_spec("sage_eviction") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from sage_eviction import EntryMeta, create_policy, get_policy_class


def measure(name: str, n: int, seed: int = 0) -> tuple[float, float, int]:
    """Bytes per held block, bytes per tracked key, and tracked keys, of `name` at capacity n."""
    rng = random.Random(seed)
    metas = [
        EntryMeta(pos_from_end=i % 7, prompt_blocks=8 + i % 9, depth=i % 5, prefix_idle=float(i % 13))
        for i in range(3 * n)
    ]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    needs = get_policy_class(name).needs_capacity
    policy = create_policy(name, capacity=n if needs else None)
    for i in range(3 * n):
        key = rng.randrange(2 * n)
        if key in policy:
            policy.access(key, float(i))
        else:
            if len(policy) >= n:
                policy.evict(1)
            policy.insert(key, metas[i])
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    tracked = len(policy) + int(getattr(policy, "tracked_keys", 0))
    return used / len(policy), used / tracked, tracked


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="capacity in blocks")
    args = parser.parse_args(argv)
    print(machine_line())
    print(f"{'policy':8} {'held':>8} {'tracked':>8} {'B/held':>8} {'B/tracked':>10}")
    for name in ("lru", "reuse"):
        per_held, per_tracked, tracked = measure(name, args.n)
        print(f"{name:8} {args.n:8d} {tracked:8d} {per_held:8.0f} {per_tracked:10.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
