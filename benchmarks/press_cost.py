"""What a press's compression costs as a share of the prefill it follows, in wall and CPU time.

On a shared CPU the wall time of a prefill and of the compression after it see different loads
(benchmarks/token_quality.py's compress % moved by 10x between samples while other jobs ran);
the process's CPU time (one torch thread) counts only the work done. Per sample of a task cell
(the same seeded samples as token_quality.py): one prefill, then each press compresses a copy
of it at each ratio; printed per (press, ratio): the share of the prefill, median and range,
wall and CPU. No answers: token_quality.py scores those.

    python benchmarks/press_cost.py --tasks multikey --policies leverage,skim,kvzip --samples 6
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line
from token_quality import make_sample

from engine_adapter.model.decoder import AttentionObserver, ForwardBatch
from engine_adapter.model.loader import load_model
from engine_adapter.token_eviction.presses.base import kept_for_ratio
from engine_adapter.token_eviction.registry import token_policy_from_spec
from engine_adapter.token_eviction.sequence_kv import SequenceKV


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="multikey")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--ratios", default="0.5,0.75")
    parser.add_argument("--policies", default="leverage,skim")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ratios = [float(r) for r in args.ratios.split(",")]
    specs = args.policies.split(",")
    decoder, tokenizer, _cfg = load_model("smollm2-135m", device="cpu")
    assert tokenizer.chat_template is not None
    print(machine_line(), flush=True)
    shares: dict[tuple[str, str, float], list[tuple[float, float]]] = defaultdict(list)
    for task in args.tasks.split(","):
        rng = random.Random(f"{args.seed}:{task}:{args.length}")  # token_quality.py's samples
        for _ in range(args.samples):
            ids = make_sample(tokenizer, tokenizer.chat_template, args.length, rng, task).context_ids
            pool = decoder.make_pool(num_blocks=3 * (-(-len(ids) // 16)) + 16, block_size=16)
            table = pool.allocator.allocate(-(-len(ids) // 16))
            observer = AttentionObserver(window=1 << 30, track_positions=True, track_tokens=True)
            wall, cpu = _clocks()
            decoder(ForwardBatch([ids], [0], [table], observers=[observer]), pool)
            pre_wall, pre_cpu = time.perf_counter() - wall, time.process_time() - cpu
            base = SequenceKV(pool, table, len(ids), observer=observer)
            for spec in specs:
                for ratio in ratios:
                    kv, policy = base.clone(), token_policy_from_spec(spec)
                    wall, cpu = _clocks()
                    policy.evict(kv, kept_for_ratio(kv.length, ratio), ratio=ratio)
                    done_wall, done_cpu = time.perf_counter() - wall, time.process_time() - cpu
                    shares[(task, spec, ratio)].append((done_wall / pre_wall, done_cpu / pre_cpu))
                    # as it goes: a run cut short still says what it measured
                    print(f"    {spec} {ratio:g}: {100 * done_wall / pre_wall:.1f} % wall, "
                          f"{100 * done_cpu / pre_cpu:.1f} % CPU", flush=True)  # fmt: skip
                    pool.allocator.free(kv.block_table)
            pool.allocator.free(table)
            print(
                f"  {task}: {len(ids)} tokens, prefill {pre_wall:.1f} s wall, {pre_cpu:.1f} s CPU", flush=True
            )
    print("\n| task | press | ratio | wall % of prefill (median, range) | CPU % of prefill (median, range) |")
    print("| --- | --- | --- | --- | --- |")
    for (task, spec, ratio), values in shares.items():
        cells = []
        for column in (0, 1):
            pct = sorted(100 * v[column] for v in values)
            cells.append(f"{pct[len(pct) // 2]:.1f} ({pct[0]:.1f}-{pct[-1]:.1f})")
        print(f"| {task} | {spec} | {ratio:g} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
