"""The cost of issue 32's observability with everything on, as a share of step time at 32 running
sequences: block ages at hit and eviction, reuse distances, the regret ghost set, the thrashing
watch and the per-lookup JSONL log (``--lookup-log``).

Requests go through the real `Scheduler` and `CacheManager` over the model's paged pool (a
third too small, so that admissions evict): `--waves` waves of `--batch` requests, each wave's
prompts extending the previous wave's (multi-turn: the second turn hits, misses and regrets),
`--decode-steps` tokens each. Two figures:

- the time spent inside the accounting (`CacheAccounting.on_lookup` and `on_evict`, the lookup
  log's writes included), timed around each call, over the steps' total time (forward and
  bookkeeping), overall and on the decode-only steps;
- the same run with the accounting replaced by no-ops: mean step time of each (noisy on a
  shared machine; the first figure is the one to read).

    python benchmarks/accounting_overhead.py                         # smollm2-135m when installed
    python benchmarks/accounting_overhead.py --model sage-tiny --batch 32 --json
    python benchmarks/accounting_overhead.py --simulator             # the simulator's share instead

``--simulator`` times the same accounting inside the trace simulator (a seeded synthetic
workload of 2,000 multi-turn requests, LRU, 2,000 blocks), where every block looked up is
accounted for and nothing else is as slow as a forward: its share of the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.cache.accounting import CacheAccounting
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.lookup_log import LookupLog
from engine_adapter.model import load_model
from engine_adapter.model.builtin import SMOLLM2_NAME, smollm2_gguf_path
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.model.tokenizer import IncrementalDetokenizer
from engine_adapter.serving.scheduler import Scheduler
from engine_adapter.serving.sequence import SchedulerLimits, Sequence

REAL = (CacheAccounting.on_lookup, CacheAccounting.on_evict)


def _timed(spent: list[float]) -> None:
    """Wrap the accounting's two entry points so that their time adds up in `spent[0]`."""

    def wrap(method: Callable[..., None]) -> Callable[..., None]:
        def timed(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            method(*args, **kwargs)
            spent[0] += time.perf_counter() - start

        return timed

    CacheAccounting.on_lookup = wrap(REAL[0])  # type: ignore[method-assign]
    CacheAccounting.on_evict = wrap(REAL[1])  # type: ignore[method-assign]


def _off() -> None:
    CacheAccounting.on_lookup = lambda self, *a, **k: None  # type: ignore[method-assign]
    CacheAccounting.on_evict = lambda self, *a, **k: None  # type: ignore[method-assign]


def run(args: argparse.Namespace, decoder: Any, tokenizer: Any, folder: Path) -> dict[str, float]:
    """One replay; returns its step times, and the accounting's time when it is timed."""
    bs, batch = args.block_size, args.batch
    per_seq = -(-(args.prompt_len * args.waves + args.decode_steps * args.waves) // bs)
    pool = decoder.make_pool(num_blocks=max(per_seq + 1, batch * per_seq * 2 // 3), block_size=bs)
    log = LookupLog(folder / f"lookups-{time.monotonic_ns()}.jsonl")
    cache = CacheManager(pool.allocator, policy=args.policy, lookup_log=log)
    scheduler = Scheduler(
        cache, decoder, pool, tokenizer, SchedulerLimits(max_num_seqs=batch, max_num_batched_tokens=8192)
    )
    generator = torch.Generator().manual_seed(32)
    prompts = [torch.randint(0, 256, (args.prompt_len,), generator=generator).tolist() for _ in range(batch)]
    total = decode = 0.0
    steps = decode_steps = 0
    for wave in range(args.waves):
        for i, ids in enumerate(prompts):
            scheduler.add(
                Sequence(
                    seq_id=scheduler.new_seq_id(),
                    request_id=f"w{wave}-r{i}",
                    prompt_ids=list(ids),
                    sampling=SamplingParams(max_tokens=args.decode_steps, ignore_eos=True),
                    detokenizer=IncrementalDetokenizer(tokenizer, ids),
                    emit=lambda _out: None,
                )
            )
        while scheduler.has_work():
            stats = scheduler.step()
            took = stats.forward_s + stats.bookkeeping_s
            total += took
            steps += 1
            if stats.prefill_tokens == 0:
                decode += took
                decode_steps += 1
        prompts = [
            p + torch.randint(0, 256, (args.prompt_len,), generator=generator).tolist() for p in prompts
        ]
    log.close()
    stats = cache.stats()
    return {
        "step_s": total,
        "steps": steps,
        "decode_s": decode,
        "decode_steps": decode_steps,
        "evictions": stats.total_evictions,
        "regrets": stats.regrets,
        "lookup_records": log.records,
    }


def simulator_share() -> dict[str, Any]:
    """The accounting's share of a simulated run's wall time (timed around its calls)."""
    from engine_adapter.sim.simulator import simulate
    from engine_adapter.sim.synthetic import synthetic

    workload = synthetic(requests=2000, seed=3, input_tokens=1024.0, output_tokens=16.0)
    spent = [0.0]
    _timed(spent)
    start = time.perf_counter()
    row = simulate(workload, "lru", 2000)
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "accounting_s": spent[0],
        "share": spent[0] / wall,
        "block_lookups": row.block_lookups,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = SMOLLM2_NAME if smollm2_gguf_path() is not None else "sage-tiny"
    parser.add_argument("--model", default=default)
    parser.add_argument("--batch", type=int, default=32, help="running sequences")
    parser.add_argument("--prompt-len", type=int, default=64, help="new prompt tokens per turn")
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--waves", type=int, default=3, help="turns of each conversation")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--simulator", action="store_true", help="the simulator's share instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.simulator:
        sim = {"machine": machine_line(), **simulator_share()}
        text = (
            f"{sim['machine']}\nsimulator: accounting {sim['accounting_s']:.2f} s of {sim['wall_s']:.2f} s "
            f"({sim['share']:.0%}) over {sim['block_lookups']} block lookups"
        )
        print(json.dumps(sim, indent=2) if args.json else text)
        return 0
    decoder, tokenizer, _ = load_model(args.model, device="cpu")
    with tempfile.TemporaryDirectory(prefix="sage-acct-") as root:
        spent = [0.0]
        _off()
        run(args, decoder, tokenizer, Path(root))  # warm-up (first forwards are slower)
        off = run(args, decoder, tokenizer, Path(root))
        _timed(spent)
        on = run(args, decoder, tokenizer, Path(root))
    report = {
        "machine": machine_line(),
        "model": args.model,
        "batch": args.batch,
        "accounting_s": spent[0],
        "share_of_step_time": spent[0] / on["step_s"],
        "mean_step_ms_on": on["step_s"] / on["steps"] * 1e3,
        "mean_step_ms_off": off["step_s"] / off["steps"] * 1e3,
        "mean_decode_step_ms_on": on["decode_s"] / max(1, on["decode_steps"]) * 1e3,
        "mean_decode_step_ms_off": off["decode_s"] / max(1, off["decode_steps"]) * 1e3,
        "on": on,
        "off": off,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(report["machine"])
    print(f"{args.model}, {args.batch} running sequences, {args.waves} turns, policy {args.policy}")
    print(
        f"accounting: {spent[0] * 1e3:.1f} ms over {on['steps']} steps = "
        f"{report['share_of_step_time']:.2%} of step time (target <= 3 %); "
        f"{on['evictions']} evictions, {on['regrets']} regrets, {on['lookup_records']} lookup records"
    )
    print(
        f"mean step {report['mean_step_ms_on']:.1f} ms on / {report['mean_step_ms_off']:.1f} ms off; "
        f"decode step {report['mean_decode_step_ms_on']:.1f} / {report['mean_decode_step_ms_off']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
