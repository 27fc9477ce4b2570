"""Decode step with the plain and the packed (oneDNN prepacked) linear weights, interleaved.

Two copies of the model in one process, one with ``packed_weights="on"``; B sequences of
`--context` random tokens each; rounds of `--steps` greedy decode steps alternate between the
two so that the machine's load falls on both alike. Prints the median and best step per batch
size, the ratio, and the machine.

    python benchmarks/packed_weights.py                          # SmolLM2, fp32, batch 1, 8, 32
    python benchmarks/packed_weights.py --threads 1 --batch-sizes 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line
from decode_profile import alternated_steps

from engine_adapter.model import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {
        mode: load_model(args.model, device="cpu", dtype=args.dtype, packed_weights=mode)[0]
        for mode in ("off", "on")
    }
    print(f"# {machine_line()}; torch threads {torch.get_num_threads()}")
    print(f"# {args.model} dtype={args.dtype} context={args.context}; ms per decode step")
    print("| batch | plain median (best) | packed median (best) | plain / packed |")
    print("| ---: | ---: | ---: | ---: |")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        times = alternated_steps(models, batch, args.context, args.rounds, args.steps)
        plain, packed = (statistics.median(times[m]) * 1e3 for m in ("off", "on"))
        best_plain, best_packed = (min(times[m]) * 1e3 for m in ("off", "on"))
        print(
            f"| {batch} | {plain:.1f} ({best_plain:.1f}) | {packed:.1f} ({best_packed:.1f}) "
            f"| {plain / packed:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
