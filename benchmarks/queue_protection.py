"""Queue-aware protection in the simulator, under a load where requests queue.

A multi-turn workload from the project's synthetic generator, with Mooncake-sized blocks (512
tokens), long prompts and arrivals fast enough that requests wait for room in the radix cache
(so queued requests' cached prefixes are at risk while they wait). Each policy runs at 5 % and
10 % of the distinct blocks without protection and with `--protect-queued` 0.1 and 0.25; the
table shows the block hit ratio, preemptions and TTFT.

    python benchmarks/queue_protection.py
    python benchmarks/queue_protection.py --policies lru,reuse --rate 2 --requests 6000 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload, unique_blocks


def workload(requests: int, rate: float, seed: int) -> Workload:
    """Long multi-turn conversations over shared system prompts, in 512-token blocks."""
    return synthetic(
        requests=requests,
        rate=rate,
        seed=seed,
        block_size=512,
        input_tokens=3000.0,
        turn_tokens=600.0,
        output_tokens=300.0,
        sessions=3000,
        turns=5.0,
        system_prompts=6,
        system_prompt_tokens=2048,
        max_input_tokens=60000,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="lru,reuse")
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--rate", type=float, default=2.0, help="arrivals per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fractions", default="0,0.1,0.25", help="--protect-queued values")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    built = workload(args.requests, args.rate, args.seed)
    unique = unique_blocks(built.requests)
    print(machine_line())
    print(f"synthetic: {len(built.requests)} requests at {args.rate}/s, seed {args.seed}, ", end="")
    print(f"{unique} distinct blocks")
    print(f"{'policy':8} {'blocks':>7} {'protect':>7} {'block hit':>9} {'preempt':>8} {'ttft p50 s':>10}")
    rows = []
    for ratio in (0.05, 0.10):
        capacity = int(unique * ratio)
        for policy in args.policies.split(","):
            for fraction in (float(f) for f in args.fractions.split(",")):
                r = simulate(built, policy, capacity, protect_queued=fraction)
                hit = r.block_hits / r.block_lookups
                print(f"{policy:8} {capacity:7d} {fraction:7.2f} {hit:9.4f}", end=" ")
                print(f"{r.preemptions:8d} {r.ttft_p50_s:10.2f}")
                rows.append({"protect_queued": fraction, **r.to_dict()})
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
