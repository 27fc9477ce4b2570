"""Simulator throughput: block lookups per second of wall time, the whole simulation included.

The target (docs/architecture.md, "Targets"): >= 1M block lookups/s for LRU in the radix model. Runs
the Mooncake conversation trace (288,500 block lookups, 182,790 distinct blocks) through the
simulator at a few capacities (radix LRU through the `CacheManager`, the one cache the engine uses
too, and flat LRU) and the same block sequence through libCacheSim's LRU (C, when installed), and
prints the rates and the ratio to libCacheSim. Reading the trace is not timed; building the per-run
state is. Each figure is the best of `--repeat` runs (the machine is shared).

    python benchmarks/sim_throughput.py
    python benchmarks/sim_throughput.py --trace path/to/trace.jsonl --ratios 0.05,0.1 --repeat 3
    python benchmarks/sim_throughput.py --profile   # cProfile of one radix LRU run, top 20
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.workloads import Workload, read_mooncake, unique_blocks

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
)
TARGET = 1_000_000


def _libcachesim_lru(keys: list[int], capacity: int, folder: Path) -> tuple[float, int] | None:
    """Wall seconds and misses of libCacheSim's LRU over `keys` (unit-size objects)."""
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    path = folder / "trace.oracleGeneral.bin"
    if not path.exists():
        record = struct.Struct("<IQIq")
        path.write_bytes(b"".join(record.pack(i, key, 1, -1) for i, key in enumerate(keys)))
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = lcs.LRU(capacity)
    t0 = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return time.perf_counter() - t0, round(miss_ratio * len(keys))


def _best(workload: Workload, capacity: int, repeat: int, **options: Any) -> tuple[float, int, int]:
    best = float("inf")
    lookups = hits = 0
    for _ in range(repeat):
        result = simulate(workload, "lru", capacity, **options)
        best = min(best, result.wall_s)
        lookups, hits = result.block_lookups, result.block_hits
    return best, lookups, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake JSON-lines trace")
    parser.add_argument(
        "--ratios", default="0.01,0.05,0.1", help="capacities as fractions of distinct blocks"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--profile", action="store_true", help="cProfile one radix LRU run and exit")
    args = parser.parse_args()

    workload = read_mooncake(args.trace)
    keys = [key for r in workload.requests for key in r.block_hashes]
    unique = unique_blocks(workload.requests)
    ratios = [float(x) for x in args.ratios.split(",")]
    print(f"machine: {machine_line()}")
    print(
        f"trace: {args.trace} ({len(workload)} requests, {len(keys)} block lookups, {unique} distinct blocks)"
    )

    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        simulate(workload, "lru", max(1, int(unique * ratios[-1])))
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
        return

    rows = []
    header = (
        f"{'capacity':>9} {'radix':>12} {'flat':>10} "
        f"{'libCacheSim':>12} {'radix/libCS':>11} {'hit (radix)':>11} {'miss flat = lcs':>15}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for ratio in ratios:
            capacity = max(1, int(unique * ratio))
            radix_s, lookups, radix_hits = _best(workload, capacity, args.repeat)
            flat_s, flat_lookups, flat_hits = _best(workload, capacity, 1, cache_model="flat")
            lcs_result = _libcachesim_lru(keys, capacity, Path(tmp))
            lcs_rate = len(keys) / lcs_result[0] if lcs_result else None
            radix_rate = lookups / radix_s
            agree = "n/a" if lcs_result is None else str(flat_lookups - flat_hits == lcs_result[1])
            row = {
                "capacity_blocks": capacity,
                "ratio": ratio,
                "block_lookups": lookups,
                "radix_lookups_per_s": radix_rate,
                "flat_lookups_per_s": flat_lookups / flat_s,
                "libcachesim_lookups_per_s": lcs_rate,
                "radix_hit_blocks": radix_hits,
                "flat_misses_equal_libcachesim": agree,
            }
            rows.append(row)
            print(
                f"{capacity:>9} {radix_rate / 1e6:>10.3f}M "
                f"{flat_lookups / flat_s / 1e6:>8.3f}M "
                f"{(lcs_rate or 0) / 1e6:>10.2f}M {(radix_rate / lcs_rate if lcs_rate else 0):>11.3f} "
                f"{radix_hits / lookups:>11.3f} {agree:>15}"
            )
    best = max(row["radix_lookups_per_s"] for row in rows)
    verdict = "meets" if best >= TARGET else "misses"
    print(f"radix LRU: best {best / 1e6:.3f}M block lookups/s; {verdict} the target of {TARGET / 1e6:.0f}M/s")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
