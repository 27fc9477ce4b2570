"""Measure the quick loop (`pytest -m "not slow"`) and leave its slowest tests to the full run.

The house keeps the quick loop under a minute on 2 cores. Tests that nobody marked `slow` but
that take a while anyway (a subprocess of the CLI, a model load, a long hypothesis run) are
measured here and listed in tests/slow_measured.txt; tests/conftest.py marks every listed test
`slow`, so the quick loop skips it and the full run (CI's, `pytest` with no `-m`) still runs it.

    python scripts/quick_loop.py                  # measure, add the tests over 0.1 s to the list
    python scripts/quick_loop.py --reset          # measure every test not marked slow in code, rewrite
    python scripts/quick_loop.py --threshold 0.3
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LISTED = ROOT / "tests" / "slow_measured.txt"
DURATION = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(.+?)\s*$")
HEADER = """\
# Tests the quick loop (pytest -m "not slow") leaves to the full run: each took at least the
# threshold (seconds, setup + call + teardown) when scripts/quick_loop.py measured it.
# tests/conftest.py marks them slow. Regenerate: python scripts/quick_loop.py [--reset].
"""


def read_listed() -> dict[str, float]:
    """The listed tests and their measured seconds."""
    if not LISTED.exists():
        return {}
    out: dict[str, float] = {}
    for line in LISTED.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, _, node = line.partition("\t")
            out[node] = float(seconds)
    return out


def measure(reset: bool) -> dict[str, float]:
    """Seconds per test of one quick-loop run (the list ignored with `reset`)."""
    env = {**os.environ, **({"SAGE_QUICK_LIST": "off"} if reset else {})}
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"]
    command += ["--durations=0", "--durations-min=0.01"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if run.returncode not in (0, 1):
        raise SystemExit(f"quick_loop.py: pytest exited {run.returncode}:\n{run.stdout[-2000:]}")
    seconds: collections.Counter[str] = collections.Counter()
    for line in run.stdout.splitlines():
        match = DURATION.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    print(run.stdout.strip().splitlines()[-1])
    return dict(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threshold", type=float, default=0.1, help="seconds (default 0.1)")
    parser.add_argument("--reset", action="store_true", help="measure every test again and rewrite")
    args = parser.parse_args()
    listed = {} if args.reset else read_listed()
    measured = measure(args.reset)
    listed.update({node: s for node, s in measured.items() if s >= args.threshold})
    rows = sorted(listed.items(), key=lambda kv: (-kv[1], kv[0]))
    LISTED.write_text(HEADER + "".join(f"{s:.2f}\t{node}\n" for node, s in rows), encoding="utf-8")
    print(f"{len(rows)} tests listed in {LISTED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
