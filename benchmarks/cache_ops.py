"""Cost of the cache manager's operations at 1e4, 1e5 and 1e6 cached blocks, and of a hot swap.

For each policy and size n, a manager over a ``"meta"`` pool of n blocks (no K/V memory) is
filled with n cached blocks: chains of `CHAIN` blocks (prompts of CHAIN * 16 tokens) with
caller-given block keys, as the simulator feeds Mooncake traces. Events are off (they cost
per evicted block, not per decision). Then, in steady state with the pool full of cache:

- ``evict(1)``: the manager's whole eviction path for one block (policy decision, cascade,
  pool free, metrics), timed alone; and the policy's share (the manager's own
  ``p50/p99_eviction_time_us``).
- alloc+free (miss): allocate a new CHAIN-block prompt (evicting exactly CHAIN blocks) and
  free it into the cache; blocks per second.
- alloc+free (hit): allocate a cached prompt (lock, touch) and free it; blocks per second.
- hot swap at the largest n: `swap_policy` time split into reading the old policy's entries
  (``entry_columns()``, the columns of ``entries()``) and building the new one
  (``from_entry_columns``, i.e. ``from_entries``), for a few policy pairs (target <= 0.5 s at
  1e6). Pairs timed later in one process run on a more fragmented heap and come out slower:
  time one pair per process (``--pairs``) to compare pairs.

The filled heap is moved out of the cyclic GC's way with `gc.freeze()`, as a serving engine
does after start-up.

    python benchmarks/cache_ops.py            # 1e4, 1e5, 1e6 (a few minutes)
    python benchmarks/cache_ops.py --quick    # 1e4, 1e5; swap at 1e5
    python benchmarks/cache_ops.py --sizes 1e6 --policies lru --json out.json
    python benchmarks/cache_ops.py --sizes 1e6 --swap-only --all-pairs   # the swaps alone
    python benchmarks/cache_ops.py --sizes 1e6 --swap-only --pairs lru:arc,priority:lru
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from sage_eviction import native
from sage_eviction.metrics import percentile

BLOCK_SIZE = 16
CHAIN = 8  # blocks per prompt
PROMPT_TOKENS = CHAIN * BLOCK_SIZE
POLICIES = ["lru", "arc", "s3fifo", "priority"]
SWAP_PAIRS = [("lru", "arc"), ("arc", "s3fifo"), ("s3fifo", "priority"), ("priority", "lru")]
MORE_SWAP_PAIRS = [("lru", "lfu"), ("lru", "sieve"), ("lru", "slru"), ("lru", "gdsf")]  # --all-pairs


@dataclass
class Row:
    policy: str
    cached_blocks: int
    fill_s: float
    evict_p50_us: float
    evict_p99_us: float
    decision_p50_us: float
    decision_p99_us: float
    miss_blocks_per_s: float
    hit_blocks_per_s: float


@dataclass
class SwapRow:
    old: str
    new: str
    cached_blocks: int
    swap_s: float
    entries_s: float
    from_entries_s: float


class KeySource:
    """Fresh chained block keys: prompt i has keys (i, 0) .. (i, CHAIN-1) as ints."""

    def __init__(self) -> None:
        self.next_prompt = 0

    def prompt(self) -> list[int]:
        i = self.next_prompt
        self.next_prompt += 1
        return [i * CHAIN + j for j in range(CHAIN)]


def build(policy: str, n: int, explain: bool = False) -> tuple[CacheManager, KeySource, list[list[int]]]:
    rng = random.Random(0)
    m = CacheManager(BlockAllocator(n, BLOCK_SIZE), policy=policy, record_events=False, explain=explain)
    keys = KeySource()
    cached: list[list[int]] = []
    for seq in range(n // CHAIN):
        prompt = keys.prompt()
        m.allocate(
            CacheRequest(
                seq,
                num_tokens=PROMPT_TOKENS,
                block_keys=prompt,
                priority=rng.randrange(3),
                recompute_last_token=False,
            )
        )
        m.free_sequence(seq)
        cached.append(prompt)
    return m, keys, cached


def measure(
    policy: str, n: int, samples: int, explain: bool = False
) -> tuple[Row, CacheManager, KeySource, list[list[int]]]:
    t0 = time.perf_counter()
    m, keys, cached = build(policy, n, explain)
    fill_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    seq = 10**9

    # steady-state misses: each allocate evicts exactly CHAIN blocks
    t0 = time.perf_counter()
    rounds = max(samples // CHAIN, 50)
    for _ in range(rounds):
        prompt = keys.prompt()
        m.allocate(CacheRequest(seq, num_tokens=PROMPT_TOKENS, block_keys=prompt, recompute_last_token=False))
        m.free_sequence(seq)
        cached.append(prompt)
        seq += 1
    miss_rate = rounds * CHAIN / (time.perf_counter() - t0)

    # hits on cached prompts (recent ones, which no policy has evicted)
    rng = random.Random(1)
    recent = cached[-min(len(cached), 1000) // 2 :]
    t0 = time.perf_counter()
    for _ in range(rounds):
        prompt = rng.choice(recent)
        m.allocate(CacheRequest(seq, num_tokens=PROMPT_TOKENS, block_keys=prompt, recompute_last_token=False))
        m.free_sequence(seq)
        seq += 1
    hit_rate = rounds * CHAIN / (time.perf_counter() - t0)

    # evict(1) timed alone, refilling in between so the cache stays at n blocks
    times: list[float] = []
    clock = time.perf_counter_ns
    decisions_before = m.eviction_calls
    while len(times) < samples:
        for _ in range(CHAIN):
            start = clock()
            m.evict(1)
            times.append((clock() - start) / 1e3)
        prompt = keys.prompt()
        m.allocate(CacheRequest(seq, num_tokens=PROMPT_TOKENS, block_keys=prompt, recompute_last_token=False))
        m.free_sequence(seq)
        seq += 1
    times.sort()
    stats = m.stats()
    assert m.eviction_calls > decisions_before
    gc.unfreeze()
    row = Row(
        policy=policy,
        cached_blocks=n,
        fill_s=fill_s,
        evict_p50_us=percentile(times, 0.5),
        evict_p99_us=percentile(times, 0.99),
        decision_p50_us=stats.p50_eviction_time_us,
        decision_p99_us=stats.p99_eviction_time_us,
        miss_blocks_per_s=miss_rate,
        hit_blocks_per_s=hit_rate,
    )
    return row, m, keys, cached


def swap_rows(n: int, pairs: list[tuple[str, str]], repeats: int) -> list[SwapRow]:
    rows: list[SwapRow] = []
    for old, new in pairs:
        m, _, _ = build(old, n)
        gc.collect()
        gc.freeze()
        cached = len(m.radix)
        results = []
        for i in range(repeats):
            back = m.swap_policy(new if i % 2 == 0 else old)
            results.append(back)
            gc.collect()
        firsts = results[0::2]  # old -> new swaps
        best = min(firsts, key=lambda r: r.swap_time_s)
        if len(m.radix) != cached:
            raise SystemExit(f"swap lost blocks: {cached} -> {len(m.radix)}")
        m.check_invariants() if n <= 100_000 else None
        rows.append(SwapRow(old, new, cached, statistics.median(r.swap_time_s for r in firsts),
                            best.entries_time_s, best.build_time_s))  # fmt: skip
        gc.unfreeze()
        del m
        gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1e4 and 1e5 only, fewer samples")
    parser.add_argument("--sizes", help="comma-separated cached-block counts, e.g. 1e4,1e6")
    parser.add_argument("--policies", help=f"comma-separated (default {','.join(POLICIES)})")
    parser.add_argument("--samples", type=int, help="evict(1) samples per cell")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--swap-only", action="store_true", help="skip the per-policy measurements")
    parser.add_argument("--all-pairs", action="store_true", help="time every swap pair, and a few more")
    parser.add_argument("--pairs", help="swap pairs to time, e.g. lru:arc,arc:s3fifo (overrides the rest)")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="with explained evictions (O(n) per victim: use small --sizes and --samples); no swaps",
    )
    args = parser.parse_args(argv)

    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else (
        [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000])  # fmt: skip
    policies = args.policies.split(",") if args.policies else POLICIES
    samples = args.samples or (2000 if args.quick else 10_000)

    print(f"machine: {machine_line()}")
    print(f"policies: {native.implementation(native.CORE)}")
    explained = ", explained evictions" if args.explain else ""
    print(f"block_size={BLOCK_SIZE}, {CHAIN}-block prompts, meta pool, events off{explained}\n")
    header = (f"{'policy':<9}{'cached':>9}{'fill s':>8}{'evict p50':>11}{'p99 us':>8}{'policy p50':>12}"
              f"{'p99 us':>8}{'miss blk/s':>12}{'hit blk/s':>12}")  # fmt: skip
    print(header)
    print("-" * len(header))
    rows: list[Row] = []
    for n in [] if args.swap_only else sizes:
        for policy in policies:
            row, m, _, _ = measure(policy, n, samples, args.explain)
            del m
            gc.collect()
            rows.append(row)
            print(f"{row.policy:<9}{row.cached_blocks:>9.0e}{row.fill_s:>8.1f}{row.evict_p50_us:>11.2f}"
                  f"{row.evict_p99_us:>8.2f}{row.decision_p50_us:>12.2f}{row.decision_p99_us:>8.2f}"
                  f"{row.miss_blocks_per_s:>12,.0f}{row.hit_blocks_per_s:>12,.0f}", flush=True)  # fmt: skip

    if args.explain:
        return 0
    n_swap = max(sizes)
    pairs = [(a, b) for a, b in SWAP_PAIRS if a in policies or b in policies] or SWAP_PAIRS[:2]
    if args.all_pairs:
        pairs = SWAP_PAIRS + MORE_SWAP_PAIRS
    if args.pairs:
        pairs = [(a, b) for a, _, b in (p.partition(":") for p in args.pairs.split(","))]
    print(f"\nhot swap at {n_swap:.0e} cached blocks (median of the old->new swaps; split of the best)")
    print(f"{'swap':<20}{'time s':>8}{'entries() s':>13}{'from_entries s':>16}{'target':>9}")
    swaps = swap_rows(n_swap, pairs, repeats=3)
    for s in swaps:
        ok = "ok" if s.swap_s <= 0.5 else "MISSED"
        print(f"{s.old + ' -> ' + s.new:<20}{s.swap_s:>8.3f}{s.entries_s:>13.3f}{s.from_entries_s:>16.3f}"
              f"{ok:>9}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "rows": [asdict(r) for r in rows],
                                         "swaps": [asdict(s) for s in swaps]}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
