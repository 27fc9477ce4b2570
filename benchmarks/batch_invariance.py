"""Batch invariance (issue 47): what it guarantees and what it costs, in one command.

Exactness: two engines in this process in the default configuration, one whose pool is small
enough to evict and preempt (ARC; 40 blocks for sage-tiny, 60 for SmolLM2) and one unbounded
(LRU, 4,096 blocks), given the same 16 fresh random greedy prompts, eight at a time to the small
one and one at a time to the big one, then all at once to the big one: how many answers differ.

Speed: a decode step at batch 1, 8 and 32 (SmolLM2, default dtype, 2 threads) with invariance on
and off, two copies of the model in one process, rounds alternated so that the machine's load
falls on both alike: median and best ms per step, tokens/s, and on/off.

    python benchmarks/batch_invariance.py                  # both parts
    python benchmarks/batch_invariance.py --part speed --rounds 6
    python benchmarks/batch_invariance.py --part exactness --dtype bfloat16 --batch-invariant off
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line
from decode_profile import alternated_steps

from engine_adapter.model import load_model
from engine_adapter.model.builtin import smollm2_gguf_path
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine

WORDS = [
    "cache",
    "block",
    "token",
    "model",
    "memory",
    "eviction",
    "policy",
    "prefix",
    "answer",
    "question",
    "river",
    "stone",
    "light",
]


def _engine(folder: str, model: str, num_blocks: int, policy: str, args: argparse.Namespace) -> Engine:
    config = EngineConfig(
        model=model,
        device="cpu",
        num_blocks=num_blocks,
        eviction_policy=policy,
        dtype=args.dtype,
        batch_invariant=args.batch_invariant,
        threads=args.threads,
        name=f"inv-{policy}",
        socket=os.path.join(folder, f"{policy}.sock"),
    )
    engine = Engine(config)
    engine.start()
    return engine


def _answers(engine: Engine, prompts: list[str], width: int, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    with ThreadPoolExecutor(width) as pool:
        return list(pool.map(lambda p: engine.submit(p, params).result(timeout=3600).token_ids, prompts))


def exactness(model: str, small_blocks: int, words: tuple[int, int], args: argparse.Namespace) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(*words))) for _ in range(16)]
    with tempfile.TemporaryDirectory() as folder:
        small = _engine(folder, model, small_blocks, "arc", args)
        big = _engine(folder, model, 4096, "lru", args)
        try:
            info = big.info()
            reference = _answers(big, prompts, 1, args.max_tokens)
            together = _answers(big, prompts, 16, args.max_tokens)
            squeezed = _answers(small, prompts, 8, args.max_tokens)
            stats = small.eviction_stats()
        finally:
            small.shutdown()
            big.shutdown()
    differ = sum(a != b for a, b in zip(squeezed, reference, strict=True))
    batched = sum(a != b for a, b in zip(together, reference, strict=True))
    print(
        f"| {model} | {info.get('dtype')} | {info.get('batch_invariant')} | {small_blocks} | "
        f"{stats.total_evictions} | {stats.preemptions} | {differ} of 16 | {batched} of 16 | {seed} |",
        flush=True,
    )


def speed(args: argparse.Namespace) -> None:
    models = {
        mode: load_model(args.model, device="cpu", dtype=args.dtype, batch_invariant=mode)[0]
        for mode in ("on", "off")
    }
    print(f"# {args.model}, dtype {models['on'].dtype}, context {args.context}; ms per decode step")
    print(f"# invariant kernels: {models['on'].invariant_kernels}")
    print("| batch | on: median (best) | off: median (best) | on tok/s | off tok/s | on / off time |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        times = alternated_steps(models, batch, args.context, args.rounds, args.steps)
        on, off = (statistics.median(times[m]) * 1e3 for m in ("on", "off"))
        best_on, best_off = (min(times[m]) * 1e3 for m in ("on", "off"))
        print(
            f"| {batch} | {on:.1f} ({best_on:.1f}) | {off:.1f} ({best_off:.1f}) | {batch / on * 1e3:.0f} "
            f"| {batch / off * 1e3:.0f} | {on / off:.2f}x |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("exactness", "speed", "both"), default="both")
    parser.add_argument("--model", default="smollm2-135m", help="the model of the speed part")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-invariant", default="auto", help="of the exactness part's engines")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {machine_line()}; torch threads {torch.get_num_threads()}")
    if args.part in ("exactness", "both"):
        print(
            "| model | dtype | batch invariant | small pool | evictions | preemptions "
            "| small (8 at a time) vs big (1 at a time) | big, 16 at a time vs 1 | prompt seed |"
        )
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        exactness("sage-tiny", 40, (10, 60), args)  # a byte tokenizer: ~6 tokens a word
        if smollm2_gguf_path() is not None:
            exactness("smollm2-135m", 60, (50, 150), args)
    if args.part in ("speed", "both"):
        speed(args)


if __name__ == "__main__":
    main()
