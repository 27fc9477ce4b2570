"""The simulator's memory (issue 49): the `sage llm benchmark` command's peak, and a soak.

`--command N` (default): write a generated Mooncake trace of about N block lookups (sage's
synthetic generator, `sim_throughput.write_generated_trace`), then run, in a child process,

    sage llm benchmark --trace T --cache-model radix --capacity-ratio 0.05 \\
        --eviction-policies lru --jobs 1 --output OUT

(the lru row and the reference rows, Belady and unbounded), and print the child's own peak
resident memory (its `VmHWM`, written at its exit; not `os.wait4`'s ru_maxrss, which on Linux
carries a larger parent's peak, a pytest worker's, into the child across exec: that is the
fallback where there is no /proc), the trace's size, the rows' hit rates and the wall time.
Targets: under 1 GiB at 2 x 10^7 lookups, under 2 GiB at 10^8.

`--soak R`: one lru radix row (5 % of the distinct blocks) over R generated requests (the
synthetic generator's defaults), this process's RSS sampled about 50 times as the requests finish
(the row's progress callback), and a line fitted over the samples after the first 20 % of the
requests: its slope per 10,000 requests is what the row keeps per request served. It includes
the run's per-request arrays, which are the trace's and sized before the run (their pages are
touched as the requests go), so the bytes per request are printed beside it.

    python benchmarks/sim_memory.py --command 20000000
    python benchmarks/sim_memory.py --command 100000000   # minutes
    python benchmarks/sim_memory.py --soak 1000000
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line
from sim_throughput import write_generated_trace

_ROOT = str(Path(__file__).resolve().parents[1])
SOAK_WARMUP = 0.2
"""Fraction of the soak's requests left out of the fitted line (the cache fills meanwhile)."""


def _status_bytes(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM) in bytes; 0 where there is none."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


_CHILD = """
import atexit, runpy, sys
from pathlib import Path

def _peak(path=sys.argv[1]):
    status = Path("/proc/self/status").read_text().splitlines()
    Path(path).write_text(next((line.split()[1] for line in status if line.startswith("VmHWM:")), ""))

atexit.register(_peak)
sys.argv = ["sage", *sys.argv[2:]]
runpy.run_module("sage_cli", run_name="__main__", alter_sys=True)
"""
"""The child: the CLI as `python -m sage_cli` runs it, writing its own peak (VmHWM, kB) at exit."""


def command_peak(lookups: int, folder: Path, seed: int = 0) -> dict[str, Any]:
    """The `sage llm benchmark` command (module docstring) on a generated trace of about
    `lookups` block lookups written in `folder`: its exit status, peak RSS, rows and times."""
    trace, output = folder / "generated.jsonl", folder / "result.json"
    written = write_generated_trace(trace, lookups, seed)
    peak_file = folder / "peak.txt"
    command = [sys.executable, "-c", _CHILD, str(peak_file), "llm", "benchmark", "--trace", str(trace)]
    command += ["--cache-model", "radix", "--capacity-ratio", "0.05", "--eviction-policies", "lru"]
    command += ["--jobs", "1", "--output", str(output)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])),
        "SAGE_HOME": str(folder / "sage-home"),
    }
    parent_peak = _status_bytes("VmHWM")
    t0 = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    stderr = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    rows = json.loads(output.read_text())["results"] if code == 0 else []
    own = int(text) if peak_file.exists() and (text := peak_file.read_text().strip()) else 0
    return {
        "lookups_written": written,
        "file_bytes": trace.stat().st_size,
        "exit_status": code,
        "stderr_tail": stderr.strip().splitlines()[-1:] if code else [],
        "peak_rss_bytes": own * 1024 if own else usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024),
        "own_peak": bool(own),
        "parent_peak_rss_bytes": parent_peak,
        "wall_s": wall,
        "rows": [{"policy": r["policy"], "hit_rate": r["hit_rate"], "wall_s": r["wall_s"]} for r in rows],
    }


def soak(requests: int, seed: int = 0, ratio: float = 0.05, samples: int = 50) -> dict[str, Any]:
    """One lru radix row over `requests` generated requests, RSS sampled as they finish; the
    fitted slope after warm-up (module docstring)."""
    import numpy as np

    from engine_adapter.sim.capacity import min_capacity
    from engine_adapter.sim.simulator import Simulator
    from engine_adapter.sim.synthetic import synthetic
    from engine_adapter.sim.workloads import total_block_lookups, unique_blocks

    workload = synthetic(requests=requests, seed=seed)
    capacity = max(min_capacity(workload), int(unique_blocks(workload.requests) * ratio))
    points: list[tuple[int, int]] = []

    def sample(done: int) -> None:
        points.append((done, _status_bytes("VmRSS")))

    t0 = time.perf_counter()
    every = max(1, requests // samples)
    row = Simulator(workload, "lru", capacity, progress=sample, progress_every=every).run()
    wall = time.perf_counter() - t0
    after = [(done, rss) for done, rss in points if done >= SOAK_WARMUP * requests]
    done = np.array([d for d, _ in after], dtype=np.float64)
    rss = np.array([r for _, r in after], dtype=np.float64)
    slope = float(np.polyfit(done, rss, 1)[0]) if len(after) >= 2 else 0.0
    return {
        "requests": requests,
        "block_lookups": total_block_lookups(workload.requests),
        "capacity_blocks": capacity,
        "hit_rate": row.hit_rate,
        "evictions": row.evictions,
        "samples": len(points),
        "rss_first_bytes": points[0][1] if points else 0,
        "rss_last_bytes": points[-1][1] if points else 0,
        "slope_bytes_per_request": slope,
        "slope_mib_per_10k_requests": slope * 10_000 / 2**20,
        "wall_s": wall,
    }


def _print_command(figures: dict[str, Any]) -> None:
    rows = ", ".join(f"{r['policy']} hit {r['hit_rate']:.3f} ({r['wall_s']:.0f} s)" for r in figures["rows"])
    print(
        f"sage llm benchmark on {figures['lookups_written']:,} generated block lookups "
        f"({figures['file_bytes'] / 2**20:.0f} MiB of JSON lines): exit {figures['exit_status']}, "
        f"peak RSS {figures['peak_rss_bytes'] / 2**30:.3f} GiB "
        f"({'its own VmHWM' if figures['own_peak'] else 'ru_maxrss'}; this parent's peak "
        f"{figures['parent_peak_rss_bytes'] / 2**30:.3f} GiB), {figures['wall_s']:.0f} s; rows: {rows}"
        + (f"; {figures['stderr_tail'][0]}" if figures["stderr_tail"] else "")
    )


def _print_soak(figures: dict[str, Any]) -> None:
    print(
        f"soak: one lru radix row over {figures['requests']:,} generated requests "
        f"({figures['block_lookups']:,} block lookups, {figures['capacity_blocks']:,} blocks, "
        f"{figures['evictions']:,} evictions), {figures['samples']} RSS samples: "
        f"{figures['rss_first_bytes'] / 2**20:.0f} -> {figures['rss_last_bytes'] / 2**20:.0f} MiB; "
        f"fitted slope after the first {SOAK_WARMUP:.0%}: "
        f"{figures['slope_mib_per_10k_requests']:.3f} MiB per 10,000 requests "
        f"({figures['slope_bytes_per_request']:.1f} bytes a request), {figures['wall_s']:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--command", type=float, metavar="N", help="the command's peak at N block lookups")
    parser.add_argument("--soak", type=float, metavar="R", help="the soak over R generated requests")
    parser.add_argument("--seed", type=int, default=0, help="the generated trace's seed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    print(machine_line())
    figures: dict[str, Any] = {}
    if args.soak is not None:
        figures["soak"] = soak(int(args.soak), args.seed)
        _print_soak(figures["soak"])
    if args.command is not None or args.soak is None:
        with tempfile.TemporaryDirectory() as tmp:
            figures["command"] = command_peak(int(args.command or 2e7), Path(tmp), args.seed)
        _print_command(figures["command"])
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
