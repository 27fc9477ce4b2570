"""Where a decode step of the bare decoder spends its time: torch.profiler at batch 1 and 8.

B sequences of `--context` random tokens are prefilled, then `--steps` decode steps run under
the profiler; the table lists the operators by self CPU time, with the step's median time. The
tables in docs/performance.md come from this script.

    python benchmarks/decode_profile.py                                # SmolLM2, fp32, batch 1 and 8
    python benchmarks/decode_profile.py --dtype bfloat16 --quantization int8 --compile
    python benchmarks/decode_profile.py --packed-weights on              # oneDNN's prepacked weights
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model import ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.kv_pool import PagedKVPool


def prefilled(
    decoder: Decoder, batch: int, context: int, *, kv_dtype: torch.dtype | None = None, seed: int = 0
) -> tuple[PagedKVPool, list[list[int]], list[int]]:
    """A pool holding `batch` sequences of `context` random tokens, their block tables and next tokens."""
    block_size = 16
    per_seq = -(-(context + 256) // block_size)
    pool = decoder.make_pool(num_blocks=batch * per_seq + 1, block_size=block_size, kv_dtype=kv_dtype)
    gen = torch.Generator().manual_seed(seed)
    tables = [pool.allocator.allocate(per_seq) for _ in range(batch)]
    prompts = [
        torch.randint(0, decoder.config.vocab_size, (context,), generator=gen).tolist() for _ in tables
    ]
    out = decoder(ForwardBatch(prompts, [0] * batch, tables), pool)
    return pool, tables, out.logits.argmax(-1).tolist()


def decode_steps(
    decoder: Decoder, pool: PagedKVPool, tables: list[list[int]], tokens: list[int], start: int, steps: int
) -> list[float]:
    """Run `steps` greedy decode steps from position `start`; each step's seconds."""
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        out = decoder(ForwardBatch([[t] for t in tokens], [start + i] * len(tokens), tables), pool)
        tokens = out.logits.argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
    return times


def alternated_steps(
    models: dict[str, Decoder], batch: int, context: int, rounds: int, steps: int
) -> dict[str, list[float]]:
    """Each model's decode-step seconds at `batch` over `context` random tokens, `rounds` of
    `steps` steps alternated between the models so that the machine's load falls on each alike.
    The first step of a round, which warms the caches after the other model ran, is dropped."""
    state = {mode: prefilled(decoder, batch, context) for mode, decoder in models.items()}
    times: dict[str, list[float]] = {mode: [] for mode in models}
    position = context
    for _ in range(rounds):
        for mode, decoder in models.items():
            pool, tables, tokens = state[mode]
            times[mode] += decode_steps(decoder, pool, tables, tokens, position, steps)[1:]
        position += steps
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--packed-weights", default="off", choices=("auto", "on", "off"))
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    decoder, _tok, _cfg = load_model(
        args.model,
        device="cpu",
        dtype=args.dtype,
        quantization=args.quantization,
        packed_weights=args.packed_weights,
    )
    if args.compile:
        decoder.compile_step()
    print(f"# {machine_line()}; torch threads {torch.get_num_threads()}")
    print(
        f"# {args.model} dtype={args.dtype} quantization={args.quantization} "
        f"packed_weights={args.packed_weights} compile={args.compile}"
    )
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        pool, tables, tokens = prefilled(decoder, batch, args.context)
        decode_steps(decoder, pool, tables, tokens, args.context, 5)  # warm-up (and compile)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            times = decode_steps(decoder, pool, tables, tokens, args.context + 5, args.steps)
        plain = decode_steps(decoder, pool, tables, tokens, args.context + 5 + args.steps, args.steps)
        print(
            f"\n## batch {batch}, context {args.context}: decode step median "
            f"{statistics.median(plain) * 1e3:.2f} ms unprofiled, "
            f"{statistics.median(times) * 1e3:.2f} ms profiled"
        )
        print(
            prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=40
            )
        )


if __name__ == "__main__":
    main()
