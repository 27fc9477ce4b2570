"""Simulator throughput and memory: sage's radix and flat rows per policy beside libCacheSim.

On one trace (the Mooncake conversation trace by default), per policy at each capacity ratio
(default 0.05 of the distinct blocks), in the same run, each side timed `--repeat` times (default
5), the sides alternated run by run in this one process and the best run of each kept, so every
side gets the same number of runs at the same moments of the machine's load:
- radix / flat: block lookups per second of `engine_adapter.sim.sweep.run_row`, the exact code
  `sage llm benchmark --cache-model radix|flat` runs for a (policy, capacity) row; its timer holds
  the simulator built, its event loop (arrivals, scheduling, cost model) and the row's dict;
- cache: the flat cache alone (`sage_eviction.flat.FlatCache`, its policy's state in C) on the
  same block stream; its timer holds the cache built (Belady's next uses computed from its
  future) and the stream, a tuple of ints made before the timer, looked up in one call: the
  same work as libCacheSim's side, and the ratio cache / libCacheSim;
- libCacheSim: the same algorithm's `process_trace` on the same block stream (flat model, unit
  sizes; the next-request times written into the oracleGeneral file for its Belady); its timer
  holds the cache built and `process_trace` (reading each record from the mmap'ed file and
  replaying it); the reader is opened outside it, and Belady's next uses are in the file,
  computed outside it. The cache's hash table is sized to the cache
  (`lcs_hashpower`: 2^hashpower buckets >= 2 x capacity, at least 2^12), not the library's
  default of 2^24 buckets, whose first touches (page faults) cost more than the replay itself on
  a trace of this size. The ratio flat / libCacheSim (the CLI's row against the bare cache loop:
  not the same work) and whether the flat row's misses are libCacheSim's.
The machine and its load average (before and after the rows) are printed. Reading the trace is
not timed. libCacheSim (GPL) is a test oracle only: imported here and in the differential
tests, never by sage.

`--generated N`: the peak resident memory of one lru radix row on a generated trace of N block
lookups (a Mooncake JSON-lines file written from sage's synthetic generator), read and run in a
child process as `sage llm benchmark --trace FILE` would; the peak is that child's own `VmHWM`,
with the bytes of the trace's arrays (`RequestTable.nbytes`) beside it.
`--sweep` adds the --jobs figure of issue 16: rows per second of a `run_benchmark` sweep with
jobs=2 over jobs=1, beside what a pure CPU loop gets from 2 processes at the same time.

    python benchmarks/sim_throughput.py
    python benchmarks/sim_throughput.py --policies lru,fifo --ratios 0.01,0.05 --repeat 3
    python benchmarks/sim_throughput.py --models flat --repeat 12   # the flat side only, best of 12
    python benchmarks/sim_throughput.py --lcs-hashpower 24   # libCacheSim with its default table
    python benchmarks/sim_throughput.py --generated 20000000
    python benchmarks/sim_throughput.py --sweep
    python benchmarks/sim_throughput.py --profile   # cProfile of the CLI path (jobs=1), top 25
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.sim.benchmark import run_benchmark
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.sweep import RowSpec, SweepContext, run_row
from engine_adapter.sim.workloads import Workload, unique_blocks
from sage_eviction.flat import FlatCache
from sage_eviction.native import core_implementation

_ROOT = str(Path(__file__).resolve().parents[1])
DEFAULT_TRACE = shipped_trace("mooncake:conversation")[0]
"""The Mooncake conversation trace shipped in the package (gzipped; the reader takes it as it is)."""
DEFAULT_POLICIES = ("lru", "fifo", "sieve", "s3fifo", "arc", "gdsf", "belady")
JOBS_TARGET = 1.8
TIMERS = (
    "timers (wall, best of the runs): radix/s, flat/s = the CLI's row (sweep.run_row: simulator built, "
    "event loop, cost model, row dict);\n  cache/s = FlatCache built (Belady: next uses computed) + "
    "lookup of the stream (a tuple of ints made untimed);\n  libCS/s = libCacheSim cache built + "
    "process_trace (records read from the mmap'ed oracleGeneral file, written untimed,\n  Belady's next "
    "uses in it). cache/libCS compares the same work; flat/libCS compares the CLI's row with it."
)


LCS_CLASSES = {
    "lru": "LRU",
    "fifo": "FIFO",
    "lfu": "LFU",
    "sieve": "Sieve",
    "s3fifo": "S3FIFO",
    "arc": "ARC",
    "gdsf": "GDSF",
    "mq": "MQ",
    "slru": "SLRU",
    "belady": "Belady",
}
"""sage's policy -> libCacheSim's class of the same algorithm (unit-size objects)."""


def _write_oracle_general(keys: np.ndarray, path: Path) -> None:
    """`keys` as libCacheSim's oracleGeneral records (`<IQIq`: time, id, size 1, the position of
    the id's next request or -1), the next-request positions computed in one vectorised pass:
    its Belady reads them from the file."""
    n = len(keys)
    order = np.argsort(keys, kind="stable")  # each id's positions, ascending, one run per id
    next_access = np.full(n, -1, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    next_access[order[:-1][same]] = order[1:][same]
    records = np.zeros(n, dtype=[("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    records["t"] = np.arange(n, dtype=np.uint32)
    records["id"] = keys
    records["size"] = 1
    records["next"] = next_access
    path.write_bytes(records.tobytes())


def lcs_hashpower(capacity: int) -> int:
    """The libCacheSim hash table's size (log2 of its buckets) for a cache of `capacity` objects:
    at least two buckets an object, at least 2^12. The library's default, 24, is 16.8 M buckets
    (128 MiB of pointers) whatever the cache's size; on a 9,139-block cache its page faults made
    `process_trace` about 11x slower than the replay itself (issue 50, item 7)."""
    return max(12, math.ceil(math.log2(2 * max(capacity, 1))))


def _libcachesim(policy: str, path: Path, n: int, capacity: int, hashpower: int) -> tuple[float, int] | None:
    """Wall seconds of one libCacheSim run for `policy` over the trace file (the cache built with
    2^hashpower buckets, then `process_trace`) and its misses; None: libCacheSim is not installed
    or has no such policy. The reader is opened (the file mmap'ed) before the timer starts."""
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    name = LCS_CLASSES.get(policy)
    if name is None:
        return None
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    t0 = time.perf_counter()
    cache = getattr(lcs, name)(capacity, hashpower=hashpower)
    miss_ratio, _ = cache.process_trace(reader)
    seconds = time.perf_counter() - t0
    return seconds, round(miss_ratio * n)


def _row(context: SweepContext, policy: str, capacity: int) -> tuple[float, dict[str, Any], str]:
    """Wall seconds of one run of the CLI's row (`sweep.run_row`, the code `sage llm benchmark`
    runs for one (policy, capacity)), the row, and how the cache called the policy ("compiled":
    its C table; "python": its methods)."""
    t0 = time.perf_counter()
    outcome = run_row(context, RowSpec(0, policy, capacity))
    return time.perf_counter() - t0, outcome.row, outcome.policy_calls


def _flat_cache(stream: tuple[int, ...], policy: str, capacity: int) -> tuple[float, int]:
    """Wall seconds and hits of one run of the flat cache alone on the block stream: a
    `FlatCache` built (its policy's state in C; Belady handed its future) and the stream looked
    up in one call, no event loop around it: sage's counterpart of `process_trace`. The stream is
    a tuple of ints made before the timer, as libCacheSim's file is written before its timer."""
    t0 = time.perf_counter()
    cache = FlatCache(policy, capacity, future=stream, int_keys=True)
    hits, _ = cache.lookup(stream)
    return time.perf_counter() - t0, hits


def _best_runs(
    contexts: dict[str, SweepContext],
    stream: tuple[int, ...],
    path: Path,
    policy: str,
    capacity: int,
    args: Any,
) -> dict[str, Any]:
    """Every side of one (policy, capacity) run `args.repeat` times, the sides alternated run by
    run (radix, flat, cache, libCacheSim, radix, ...), the best wall time of each kept."""
    best: dict[str, float] = {}
    row: dict[str, Any] = {}
    for _ in range(args.repeat):
        for model, context in contexts.items():
            seconds, figures, calls = _row(context, policy, capacity)
            best[model] = min(best.get(model, math.inf), seconds)
            row[f"{model}_policy_calls"] = calls
            row[f"{model}_lookups"] = figures["block_lookups"]
            row[f"{model}_hit_blocks"] = figures["block_hits"]
        seconds, row["cache_hits"] = _flat_cache(stream, policy, capacity)
        best["cache"] = min(best.get("cache", math.inf), seconds)
        lcs = _libcachesim(policy, path, len(stream), capacity, args.lcs_hashpower or lcs_hashpower(capacity))
        if lcs is not None:
            best["libcachesim"] = min(best.get("libcachesim", math.inf), lcs[0])
            row["libcachesim_misses"] = lcs[1]
    for side, seconds in best.items():
        row[f"{side}_s"] = seconds
        lookups = row.get(f"{side}_lookups", len(stream))
        row[f"{side}_lookups_per_s"] = lookups / seconds
    return row


def _policy_rows(
    workload: Workload, keys: np.ndarray, ratio: float, policies: list[str], args: Any
) -> list[dict[str, Any]]:
    """Per policy at one capacity: lookups/s of the radix and flat rows, of the flat cache alone
    and of libCacheSim's `process_trace` on the same block stream (best of the same number of
    alternated runs each), the ratios cache/libCacheSim and flat/libCacheSim, and whether the flat
    row's misses are libCacheSim's."""
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unique = len(np.unique(keys))
    capacity = max(1, int(unique * ratio), *([min_capacity(workload)] if "radix" in models else []))
    contexts = {model: SweepContext(workload, model, CostModel()) for model in models}
    hashpower = args.lcs_hashpower or lcs_hashpower(capacity)
    print(
        f"\ncapacity {capacity} blocks ({ratio:g} of {unique} distinct blocks); best of {args.repeat} "
        f"runs per side, alternated; libCacheSim's hash table 2^{hashpower} buckets"
    )
    print(
        f"{'policy':>8} {'radix/s':>9} {'flat/s':>9} {'cache/s':>9} {'libCS/s':>9} {'cache/libCS':>11} "
        f"{'flat/libCS':>10} {'radix hit':>9} {'flat hit':>8} {'flat=lcs':>8}  policy calls (radix, flat)"
    )
    stream = tuple(keys.tolist())  # the block stream as the flat cache alone replays it
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.oracleGeneral.bin"
        _write_oracle_general(keys, path)
        for policy in policies:
            row = {"policy": policy, "capacity_blocks": capacity, "ratio": ratio, "repeat": args.repeat}
            row["libcachesim_hashpower"] = hashpower
            row |= _best_runs(contexts, stream, path, policy, capacity, args)
            lcs_rate = row.get("libcachesim_lookups_per_s")
            row["cache_over_libcachesim"] = row["cache_lookups_per_s"] / lcs_rate if lcs_rate else None
            flat_rate = row.get("flat_lookups_per_s")
            row["flat_over_libcachesim"] = flat_rate / lcs_rate if lcs_rate and flat_rate else None
            agree = None
            if lcs_rate and "flat" in contexts:
                agree = len(keys) - row["flat_hit_blocks"] == row["libcachesim_misses"]
            row["flat_misses_equal_libcachesim"] = agree
            rows.append(row)
            print(
                f"{policy:>8} {_rate(row.get('radix_lookups_per_s'))} {_rate(flat_rate)} "
                f"{_rate(row['cache_lookups_per_s'])} {_rate(lcs_rate)} "
                f"{_ratio(row['cache_over_libcachesim']):>11} {_ratio(row['flat_over_libcachesim']):>10} "
                f"{_hit(row.get('radix_hit_blocks'), len(keys))} "
                f"{_hit(row.get('flat_hit_blocks'), len(keys)):>8} "
                f"{'n/a' if agree is None else str(agree):>8}  "
                f"{', '.join(row.get(f'{model}_policy_calls', 'n/a') for model in ('radix', 'flat'))}"
            )
    return rows


def _rate(per_s: float | None) -> str:
    return f"{per_s / 1e6:>8.3f}M" if per_s else f"{'n/a':>9}"


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value else "n/a"


def _hit(hits: int | None, lookups: int) -> str:
    return f"{hits / lookups:>9.3f}" if hits is not None else f"{'n/a':>9}"


def _sweep(trace: Path, policies: list[str], ratios: list[float], jobs: int) -> tuple[float, int]:
    """Wall seconds and rows of the CLI's sweep (`run_benchmark`) with `jobs` processes."""
    t0 = time.perf_counter()
    result = run_benchmark(policies=policies, trace=trace, capacity_ratios=ratios, jobs=jobs)
    return time.perf_counter() - t0, len(result["results"])


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def _parallel_ceiling(n: int = 5_000_000, tasks: int = 4) -> float:
    """How much faster 2 processes run a pure CPU loop than 1, now: the most --jobs 2 can give on
    this machine at this moment (other work on it takes its share)."""
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    for _ in range(tasks):
        _spin(n)
    one = time.perf_counter() - t0
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_spin, [n] * 2))  # start the workers outside the timing
        t0 = time.perf_counter()
        list(pool.map(_spin, [n] * tasks))
        two = time.perf_counter() - t0
    return one / two


def _profile(trace: Path, ratio: float) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run_benchmark(policies=["lru"], trace=trace, capacity_ratios=[ratio], jobs=1)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def write_generated_trace(path: Path, lookups: int, seed: int = 0) -> int:
    """Write a Mooncake JSON-lines trace of about `lookups` block lookups (at least that many,
    stopping at the request that reaches it) from sage's synthetic generator (its default
    multi-turn conversations with shared system prompts): each generated block becomes a hash id
    of 512 tokens. Returns the block lookups written."""
    from engine_adapter.sim.synthetic import synthetic, synthetic_stream

    probe = synthetic(requests=2000, seed=seed)
    per_request = sum(len(r.block_hashes) for r in probe) / len(probe)
    requests = max(1, int(lookups / per_request * 1.02) + 1)
    written = 0
    with path.open("w", encoding="utf-8") as out:  # streamed: no list of the requests here either
        for r in synthetic_stream(requests=requests, seed=seed):
            if written >= lookups:
                break
            record = {
                "timestamp": round(r.arrival_s * 1000.0, 3),
                "input_length": len(r.block_hashes) * 512,
                "output_length": r.output_len,
                "hash_ids": list(r.block_hashes),
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
            written += len(r.block_hashes)
    return written


def _own_peak_rss() -> int | None:
    """This process's peak resident memory since its exec (Linux: /proc/self/status's VmHWM),
    or None elsewhere. Not ru_maxrss: Linux carries a forking parent's peak into the child's
    across exec, so a child of a large process (a pytest worker) would report the parent's."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    return None


def _child_row(path: Path, policy: str, ratio: float) -> None:
    """In the child process: read the trace as `sage llm benchmark --trace` does, run one radix
    row, and print its figures as one JSON line, with its own peak RSS where the system says."""
    t0 = time.perf_counter()
    workload = read_mooncake(path)
    read_s = time.perf_counter() - t0
    unique = unique_blocks(workload.requests)
    capacity = max(1, int(unique * ratio), min_capacity(workload))
    t0 = time.perf_counter()
    result = simulate(workload, policy, capacity)
    figures = {
        "requests": len(workload),
        "unique_blocks": unique,
        "capacity_blocks": capacity,
        "block_lookups": result.block_lookups,
        "block_hits": result.block_hits,
        "read_s": read_s,
        "row_s": time.perf_counter() - t0,
        "implementation": core_implementation(),
        "trace_array_bytes": nbytes() if (nbytes := getattr(workload.requests, "nbytes", None)) else None,
        "own_peak_rss_bytes": _own_peak_rss(),
    }
    print(json.dumps(figures))


def generated_row(lookups: int, policy: str = "lru", ratio: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """One radix row of `policy` on a generated trace of about `lookups` block lookups, run in a
    child process: its figures and its peak resident memory (the child's own VmHWM, so this
    process's memory does not count; `os.wait4`'s ru_maxrss where there is no /proc)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "generated.jsonl"
        written = write_generated_trace(path, lookups, seed)
        size = path.stat().st_size
        command = [sys.executable, __file__, "--child-row", str(path), "--child-policy", policy]
        command += ["--child-ratio", str(ratio)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])),
        }
        child = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True)
        assert child.stdout is not None
        out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"the child row failed with exit status {child.returncode}")
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    # the child's own peak (VmHWM) where it has one; else ru_maxrss (KiB on Linux, bytes on
    # macOS), which on Linux also counts this process's peak at the fork
    own = figures.pop("own_peak_rss_bytes")
    peak = own if own is not None else usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {
        "lookups_written": written,
        "file_bytes": size,
        "peak_rss_bytes": peak,
        "policy": policy,
        **figures,
    }


def _print_generated(figures: dict[str, Any]) -> None:
    hit = figures["block_hits"] / max(figures["block_lookups"], 1)
    mib = figures["file_bytes"] / 2**20
    print(
        f"generated trace: {figures['lookups_written']:,} block lookups ({figures['requests']:,} requests, "
        f"{figures['unique_blocks']:,} distinct blocks, {mib:.0f} MiB of JSON lines); "
        f"one {figures['policy']} radix row at {figures['capacity_blocks']:,} blocks: "
        f"hit {hit:.3f}, read {figures['read_s']:.1f} s, "
        f"row {figures['row_s']:.1f} s ({figures['block_lookups'] / figures['row_s'] / 1e6:.3f}M lookups/s); "
        f"peak RSS of the child {figures['peak_rss_bytes'] / 2**30:.3f} GiB"
        + (
            f" (the trace's arrays {arrays / 2**20:.0f} MiB)"
            if (arrays := figures.get("trace_array_bytes"))
            else ""
        )
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake JSON-lines trace")
    parser.add_argument("--ratios", default="0.05", help="capacities as fractions of distinct blocks")
    parser.add_argument(
        "--policies", default=",".join(DEFAULT_POLICIES), help="policies of the per-policy rows"
    )
    parser.add_argument("--models", default="radix,flat", help="sage's cache models to time (radix, flat)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="runs of every side per row, alternated; the best of each is kept",
    )
    parser.add_argument(
        "--lcs-hashpower",
        type=int,
        help="libCacheSim's hash table, log2 of its buckets (default: sized to the cache, lcs_hashpower; "
        "the library's own default is 24)",
    )
    parser.add_argument(
        "--sweep-policies", default="lru,lfu,arc", help="policies of the --jobs sweep (at every capacity)"
    )
    parser.add_argument(
        "--sweep-ratios", default="0.05,0.1", help="capacities of the --jobs sweep (fractions of blocks)"
    )
    parser.add_argument("--sweep", action="store_true", help="also time a --jobs 2 sweep against --jobs 1")
    parser.add_argument(
        "--generated",
        type=float,
        metavar="N",
        help="only the peak RSS of one lru radix row on a generated "
        "trace of N block lookups (e.g. 2e7), in a child process",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--profile", action="store_true", help="cProfile the CLI path (jobs=1) and exit")
    parser.add_argument("--child-row", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-policy", default="lru", help=argparse.SUPPRESS)
    parser.add_argument("--child-ratio", type=float, default=0.05, help=argparse.SUPPRESS)
    return parser.parse_args()


def _sweep_figures(args: argparse.Namespace) -> dict[str, Any]:
    policies = [p.strip() for p in args.sweep_policies.split(",") if p.strip()]
    ceiling_before = _parallel_ceiling()
    sweep_ratios = [float(x) for x in args.sweep_ratios.split(",")]
    one_s, n_rows = _sweep(args.trace, policies, sweep_ratios, 1)
    two_s, _ = _sweep(args.trace, policies, sweep_ratios, 2)
    ceiling = min(ceiling_before, _parallel_ceiling())
    speedup = one_s / two_s
    verdict = "meets" if speedup >= JOBS_TARGET else "misses"
    print(
        f"sweep of {n_rows} rows ({','.join(policies)} + belady + unbounded): --jobs 1 {one_s:.1f} s "
        f"({n_rows / one_s:.2f} rows/s), --jobs 2 {two_s:.1f} s ({n_rows / two_s:.2f} rows/s): "
        f"{speedup:.2f}x; {verdict} the target of {JOBS_TARGET}x "
        f"(a pure CPU loop in 2 processes: {ceiling:.2f}x on this machine now)"
    )
    return {
        "policies": policies,
        "ratios": sweep_ratios,
        "rows": n_rows,
        "jobs1_s": one_s,
        "jobs2_s": two_s,
        "speedup": speedup,
        "cpu_loop_speedup": ceiling,
    }


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def main() -> None:
    args = _arguments()
    if args.child_row is not None:
        _child_row(args.child_row, args.child_policy, args.child_ratio)
        return
    implementation = core_implementation()
    load = _load()
    print(f"machine: {machine_line()}; load average {load:.2f}")
    print(f"implementation: {implementation}")
    figures: dict[str, Any] = {
        "machine": machine_line(),
        "load_average": load,
        "implementation": implementation,
    }
    if args.generated is not None:
        figures["generated"] = generated_row(int(args.generated))
        _print_generated(figures["generated"])
    else:
        workload = read_mooncake(args.trace)
        keys = np.fromiter((key for r in workload.requests for key in r.block_hashes), dtype=np.int64)
        print(f"trace: {args.trace} ({len(workload)} requests, {len(keys)} block lookups)")
        if args.profile:
            _profile(args.trace, float(args.ratios.split(",")[-1]))
            return
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        print(TIMERS)
        figures["rows"] = [
            row
            for ratio in (float(x) for x in args.ratios.split(","))
            for row in _policy_rows(workload, keys, ratio, policies, args)
        ]
        figures["load_average_after"] = _load()
        print(f"load average after the rows {figures['load_average_after']:.2f}")
        figures["sweep"] = _sweep_figures(args) if args.sweep else None
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
