"""Wall time of new `sage` processes: `sage llm eviction stats` against a running engine, and `sage --help`.

Starts a temporary engine (sage-tiny, CPU) on a private socket, sends it a few completions so
the stats are not empty, then times `--runs` fresh processes of each command.

    python benchmarks/cli_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_line

TARGET_STATS_S = 0.4


def _sage() -> list[str]:
    script = Path(sys.executable).with_name("sage")
    if script.exists():
        return [str(script)]
    found = shutil.which("sage")
    return [found] if found else [sys.executable, "-m", "sage_cli.app"]


def _time(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="sage-cli-", dir="/tmp"))
    socket = folder / "bench.sock"
    config = {
        "name": "clibench",
        "socket": str(socket),
        "log_dir": str(folder / "logs"),
        "device": "cpu",
        "num_blocks": 64,
        "block_size": 4,
    }
    log = (folder / "engine.log").open("wb")
    engine = subprocess.Popen(
        [sys.executable, "-m", "engine_adapter.serving.server", "--config-json", json.dumps(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sage = _sage()
    try:
        import httpx

        deadline = time.monotonic() + 120
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://sage") as http:
            while True:
                try:
                    http.get("/health").raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or engine.poll() is not None:
                        raise SystemExit(f"the engine did not start; see {folder / 'engine.log'}") from None
                    time.sleep(0.1)
            for i in range(8):
                http.post(
                    "/v1/completions",
                    json={"prompt": f"warm up the cache {i % 3}" * 3, "max_tokens": 4},
                    timeout=60,
                ).raise_for_status()
        stats = _time([*sage, "llm", "eviction", "stats", "--socket", str(socket)], args.runs)
        stats_json = _time([*sage, "llm", "eviction", "stats", "--json", "--socket", str(socket)], args.runs)
        helps = _time([*sage, "--help"], args.runs)
    finally:
        subprocess.run(
            [*sage, "llm", "engine", "stop", "--socket", str(socket)], capture_output=True, check=False
        )
        try:
            engine.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.kill()
        log.close()

    print(machine_line())
    print(f"{'command':<40} {'min s':>7} {'p50 s':>7} {'max s':>7}  target")
    for name, times, target in (
        ("sage llm eviction stats", stats, TARGET_STATS_S),
        ("sage llm eviction stats --json", stats_json, TARGET_STATS_S),
        ("sage --help", helps, None),
    ):
        p50 = statistics.median(times)
        verdict = "" if target is None else (f"<= {target} s: " + ("PASS" if p50 <= target else "MISS"))
        print(f"{name:<40} {min(times):>7.3f} {p50:>7.3f} {max(times):>7.3f}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
