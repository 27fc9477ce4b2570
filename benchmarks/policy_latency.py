"""Latency of the policy decisions, per online policy, against the targets of docs/architecture.md, "Targets".

- `evict(1)` in steady state at n evictable entries: fill n entries, then loop: evict(1),
  insert a new key, hit a few random live keys. Each evict is timed alone with
  `time.perf_counter_ns` (the timer's own overhead, measured once, is subtracted).
  Target (issue 16): p50 <= 1 us and p99 <= 5 us, flat in n; the learned `reuse` (a scan of
  its bucket heads per eviction) keeps its own issue's p50 <= 5 us at 1e6, the same p99: its
  row `reuse:follow=learned` times the learned ranking's path (the plain row follows LRU here).
- `select_victims` on the module spec's scenario: 1000 candidates of 10 blocks, priorities
  0-2, access counts 1-10, required_blocks=100. Target (issue 16): p50 <= 20 us.

The header says which implementation ran: the compiled core (sage_eviction/_core.pyx) or the
pure-Python reference (`SAGE_PURE_PYTHON=1` forces it, for a side-by-side run).

The heap of a filled policy is moved out of the cyclic GC's way with `gc.freeze()` (as a
serving engine does after start-up), so a full collection over a million entries does not
land inside a timed call; the GC stays on.

    python benchmarks/policy_latency.py                        # 1e3..1e6, a few minutes
    python benchmarks/policy_latency.py --quick                # 1e3..1e5, fewer samples
    python benchmarks/policy_latency.py --sizes 1e4,1e5 --policies lru,arc --json out.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if importlib.util.find_spec("sage_eviction") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from sage_eviction import (
    EntryMeta,
    EvictionCandidate,
    EvictionPolicy,
    available_policies,
    create_policy,
    get_policy_class,
    native,
)
from sage_eviction.metrics import percentile

EVICT_P50_US = 1.0
EVICT_P50_US_BY_POLICY = {"reuse:follow=learned": 5.0}  # rows with a target of their own
EVICT_P99_US = 5.0
SELECT_P50_US = 20.0


@dataclass(slots=True)
class EvictRow:
    policy: str
    n: int
    samples: int
    p50_us: float
    p99_us: float
    fill_s: float

    @property
    def passed(self) -> bool:
        p50 = EVICT_P50_US_BY_POLICY.get(self.policy, EVICT_P50_US)
        return self.p50_us <= p50 and self.p99_us <= EVICT_P99_US


@dataclass(slots=True)
class SelectRow:
    policy: str
    calls: int
    victims: int
    p50_us: float
    p99_us: float

    @property
    def passed(self) -> bool:
        return self.p50_us <= SELECT_P50_US


def timer_overhead_ns(trials: int = 20000) -> int:
    """The median cost of a back-to-back pair of `perf_counter_ns` calls."""
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(trials):
        t0 = clock()
        deltas.append(clock() - t0)
    deltas.sort()
    return deltas[len(deltas) // 2]


def _meta_pool(rng: random.Random, size: int = 4096) -> list[tuple[object, ...]]:
    """Field values of `size` varied metas (EntryMeta's field order); building a meta from one
    costs far less than drawing its fields, which keeps a fill of 1e6 entries short."""
    pool = []
    for _ in range(size):
        seq_len = rng.randint(16, 2048)
        pool.append(
            (
                16,  # size: tokens in a block
                float(rng.randint(16, 4096)),  # cost
                rng.randint(0, 2),  # priority
                rng.choice(("a", "b", "c")),  # tenant
                0.0,  # created_at
                0.0,  # last_access
                0,  # hits
                rng.choice((None, rng.uniform(0.1, 30.0))),  # estimated_lifetime
                seq_len,
                seq_len + rng.randint(0, 2048),  # max_len
                rng.choice((None, rng.uniform(0.5, 60.0))),  # deadline
                rng.randint(0, 63),  # depth
                rng.randint(-1, 40),  # pos_from_end: spreads `reuse` over its buckets
                rng.randint(1, 64),  # prompt_blocks
            )
        )
    return pool


def _quantiles_us(samples_ns: list[int], overhead_ns: int) -> tuple[float, float]:
    ordered = sorted(max(s - overhead_ns, 0) for s in samples_ns)
    return percentile(ordered, 0.5) / 1e3, percentile(ordered, 0.99) / 1e3


def bench_evict(name: str, n: int, samples: int, accesses: int, overhead_ns: int, seed: int = 0) -> EvictRow:
    """p50/p99 of `evict(1)` with `n` evictable entries held, in steady state."""
    rng = random.Random(seed)
    pool = _meta_pool(rng)
    mask = len(pool) - 1
    policy: EvictionPolicy = create_policy(name, capacity=n)
    live: list[Hashable] = []  # live keys, for random hits; swap-remove through `slot`
    slot: dict[Hashable, int] = {}
    started = time.perf_counter()
    for key in range(n):
        policy.insert(key, EntryMeta(*pool[key & mask]))
        slot[key] = key
        live.append(key)
    fill_s = time.perf_counter() - started
    gc.collect()
    gc.freeze()

    next_key = n
    clock = time.perf_counter_ns
    evict = policy.evict
    insert = policy.insert
    access = policy.access
    randrange = rng.randrange
    timings: list[int] = []
    warmup = min(samples, 2000)
    try:
        for i in range(warmup + samples):
            t0 = clock()
            victims = evict(1)
            elapsed = clock() - t0
            if i >= warmup:
                timings.append(elapsed)
            for victim in victims:
                index = slot.pop(victim)
                last = live.pop()
                if index < len(live):
                    live[index] = last
                    slot[last] = index
            now = float(i)
            meta = EntryMeta(*pool[next_key & mask])
            meta.created_at = meta.last_access = now
            insert(next_key, meta)
            slot[next_key] = len(live)
            live.append(next_key)
            next_key += 1
            for _ in range(accesses):
                access(live[randrange(len(live))], now)
    finally:
        gc.unfreeze()
    if len(policy) != n or policy.num_evictable != n:
        raise RuntimeError(f"{name}: steady state lost entries ({len(policy)} held, n={n})")
    p50, p99 = _quantiles_us(timings, overhead_ns)
    return EvictRow(name, n, samples, p50, p99, fill_s)


def spec_candidates(seed: int = 0) -> list[EvictionCandidate]:
    """The module spec's benchmark scenario ("Benchmark 场景" of the module spec)."""
    rng = random.Random(seed)
    return [
        EvictionCandidate(
            sequence_id=i,
            block_ids=list(range(i * 10, (i + 1) * 10)),
            last_access_time=time.time(),
            access_count=rng.randint(1, 10),
            priority=rng.randint(0, 2),
            is_pinned=False,
        )
        for i in range(1000)
    ]


def bench_select(name: str, calls: int, overhead_ns: int) -> SelectRow:
    """p50/p99 of `select_victims(1000 candidates, required_blocks=100)`."""
    policy = create_policy(name, capacity=1000)
    candidates = spec_candidates()
    clock = time.perf_counter_ns
    select = policy.select_victims
    victims: list[int] = []
    for _ in range(min(calls, 100)):  # warm-up
        select(candidates, 100)
    timings = []
    for _ in range(calls):
        t0 = clock()
        victims = select(candidates, 100)
        timings.append(clock() - t0)
    p50, p99 = _quantiles_us(timings, overhead_ns)
    return SelectRow(name, calls, len(victims), p50, p99)


def _print_tables(evicts: Sequence[EvictRow], selects: Sequence[SelectRow], header: str) -> None:
    evict_title = (
        f"evict(1) in steady state: target p50 <= {EVICT_P50_US:g} us (reuse:follow=learned: 5 us), "
        f"p99 <= {EVICT_P99_US:g} us"
    )
    select_title = f"select_victims, 1000 candidates, 100 blocks: target p50 <= {SELECT_P50_US:g} us"
    evict_rows = [
        (r.policy, f"{r.n:.0e}".replace("e+0", "e"), f"{r.p50_us:.2f}", f"{r.p99_us:.2f}", f"{r.fill_s:.2f}",
         "PASS" if r.passed else "MISS")
        for r in evicts
    ]  # fmt: skip
    select_rows = [
        (r.policy, str(r.victims), f"{r.p50_us:.1f}", f"{r.p99_us:.1f}", "PASS" if r.passed else "MISS")
        for r in selects
    ]
    evict_cols = ("policy", "n", "p50 us", "p99 us", "fill s", "result")
    select_cols = ("policy", "victims", "p50 us", "p99 us", "result")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(header)
        for title, cols, rows in (
            (evict_title, evict_cols, evict_rows),
            (select_title, select_cols, select_rows),
        ):
            if not rows:
                continue
            widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
            print(f"\n{title}")
            for row in (cols, *rows):
                print(
                    "  ".join(
                        cell.rjust(w) if i else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                    )
                )
        return
    console = Console()
    console.print(header)
    for title, cols, rows in (
        (evict_title, evict_cols, evict_rows),
        (select_title, select_cols, select_rows),
    ):
        if not rows:
            continue
        console.print(f"\n[bold]{title}[/bold]")
        table = Table()
        for i, col in enumerate(cols):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            style = "green" if row[-1] == "PASS" else "red"
            table.add_row(*row[:-1], f"[{style}]{row[-1]}[/{style}]")
        console.print(table)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: expected numbers like 1e3,1e4") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: expected positive sizes")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=_sizes, help="evictable entries, e.g. 1e3,1e4,1e5,1e6")
    parser.add_argument("--policies", help="comma-separated names (default: every online policy)")
    parser.add_argument("--samples", type=int, help="timed evictions per policy and size")
    parser.add_argument("--select-calls", type=int, help="timed select_victims calls per policy")
    parser.add_argument("--accesses", type=int, default=2, help="random hits per loop iteration")
    parser.add_argument("--quick", action="store_true", help="1e3..1e5 and fewer samples")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)

    sizes = args.sizes or ([1000, 10_000, 100_000] if args.quick else [1000, 10_000, 100_000, 1_000_000])
    samples = args.samples or (5000 if args.quick else 20_000)
    select_calls = args.select_calls or (500 if args.quick else 2000)
    online = available_policies(include_offline=False)
    names = [p.strip() for p in args.policies.split(",")] if args.policies else online
    if not args.policies and "reuse" in names:
        # its eviction path differs by mode: the plain row follows LRU here (random hits give
        # its miniatures nothing to choose), this one its learned ranking
        names.insert(names.index("reuse") + 1, "reuse:follow=learned")
    skipped = [n for n in names if get_policy_class(n.split(":", 1)[0]).offline]
    names = [n for n in names if n not in skipped]

    overhead = timer_overhead_ns()
    implementation = native.implementation(native.CORE)
    header = (
        f"machine: {machine_line()}\n"
        f"implementation: {implementation}\n"
        f"timer overhead {overhead} ns (subtracted); {samples} evictions per cell after "
        f"{min(samples, 2000)} warm-up, {args.accesses} hits per iteration; gc frozen after fill"
    )
    if skipped:
        header += f"\nskipped (offline, need the future): {', '.join(skipped)}"
    print(header, file=sys.stderr, flush=True)
    evicts: list[EvictRow] = []
    selects: list[SelectRow] = []
    for name in names:
        for n in sizes:
            evicts.append(bench_evict(name, n, samples, args.accesses, overhead))
            row = evicts[-1]
            print(
                f"  {name} n={n}: p50 {row.p50_us:.2f} us, p99 {row.p99_us:.2f} us",
                file=sys.stderr,
                flush=True,
            )
        selects.append(bench_select(name, select_calls, overhead))
    _print_tables(evicts, selects, header)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_line(),
                    "implementation": implementation,
                    "timer_overhead_ns": overhead,
                    "evict": [asdict(r) | {"passed": r.passed} for r in evicts],
                    "select_victims": [asdict(r) | {"passed": r.passed} for r in selects],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
