"""Compress, don't drop (issue 36 item 3): returning conversations against plain eviction.

SmolLM2-135M-Instruct on the CPU engine, a pool small enough that a conversation's cached prefix
is pushed out by the others before it returns. Each of N conversations first sends its context
(a RULER-style haystack of about --length tokens with one magic number at a random depth, the
single-needle task of `token_quality.py`) and gets one token; when all N have been sent, each
returns in order, continuing its own prompt with the question. The same requests run on two
fresh engines of the same pool size: plain eviction (the evicted prefix is gone, the returning
turn recomputes it) and ``--compress-on-evict PRESS:RATIO`` (the prefix was compacted in place
when evicted; the returning turn reuses it and prefills only the question). Greedy decoding.

Printed per engine: TTFT p50 / p90 of the returning turns (submit to first token, one request
at a time), the returning turns' cached tokens and how many came from a compressed prefix, the
needle answered (exact digits in the answer), and the machine. Target (issue 36): TTFT p50 of
the returning turn >= 2x better with compression, and the needle answered in >= 10 of 12.

    python benchmarks/compress_on_evict.py --conversations 12 --length 1024 --press leverage:0.75
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import machine_line
from token_quality import Sample, make_sample

from engine_adapter.model.builtin import SMOLLM2_NAME
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine

BLOCK = 16


def _engine(folder: str, num_blocks: int, compress: str, threads: int) -> Engine:
    engine = Engine(
        EngineConfig(
            model=SMOLLM2_NAME,
            device="cpu",
            block_size=BLOCK,
            num_blocks=num_blocks,
            name="coe-bench",
            socket=str(Path(folder) / "unused.sock"),
            threads=threads,
            compress_on_evict=compress,
            max_num_batched_tokens=2048,
        )
    )
    engine.start()
    return engine


def _timed(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[float, Any]:
    """Seconds from submit to the first token, and the final output."""
    t0 = time.perf_counter()
    handle = engine.submit(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=False))
    ttft = 0.0
    for out in handle:
        if out.token_ids and not ttft:
            ttft = time.perf_counter() - t0
        if out.finished:
            break
    return ttft, handle.result(60)


def run(samples: list[Sample], num_blocks: int, compress: str, threads: int) -> dict[str, Any]:
    """Every conversation's first turn, then every returning turn, on a fresh engine."""
    with tempfile.TemporaryDirectory(prefix="coe-", dir="/tmp") as folder:
        engine = _engine(folder, num_blocks, compress, threads)
        try:
            for sample in samples:
                engine.submit(sample.context_ids, SamplingParams(max_tokens=1)).result(600)
            ttfts, answers, cached, compressed = [], [], [], []
            for sample in samples:
                ttft, out = _timed(engine, sample.context_ids + sample.question_ids, 12)
                ttfts.append(ttft)
                answers.append(sample.value in out.text.replace(",", ""))
                cached.append(out.cached_tokens)
                compressed.append(out.compressed_cached_tokens)
            stats = engine.eviction_stats()
            engine.cache.check_invariants()
        finally:
            engine.shutdown()
    ttfts.sort()
    return {
        "compress_on_evict": compress or "off",
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
        "needle": sum(answers),
        "conversations": len(samples),
        "cached_tokens_mean": statistics.mean(cached),
        "compressed_cached_tokens_mean": statistics.mean(compressed),
        "evicted_blocks": stats.total_evictions,
        "compressions": stats.compressions,
        "compressed_hits": stats.compressed_hits,
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--length", type=int, default=1024, help="context tokens per conversation (about)")
    parser.add_argument("--press", default="leverage:0.75", help="compress-on-evict's PRESS:RATIO")
    parser.add_argument(
        "--pool-conversations", type=float, default=4.5, help="pool size, in contexts"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_adapter.model import load_model

    _decoder, tokenizer, _cfg = load_model(SMOLLM2_NAME, device="cpu")
    template = tokenizer.chat_template
    assert template is not None
    rng = random.Random(args.seed)
    n = args.conversations
    samples = [make_sample(tokenizer, template, args.length, rng, "single") for _ in range(n)]
    del _decoder  # the engines load their own
    context_blocks = statistics.mean(len(s.context_ids) for s in samples) / BLOCK
    num_blocks = int(args.pool_conversations * context_blocks)
    print(machine_line(), flush=True)
    print(
        f"{args.conversations} conversations, context ~{context_blocks * BLOCK:.0f} tokens "
        f"({context_blocks:.0f} blocks of {BLOCK}); pool {num_blocks} blocks; press {args.press}",
        flush=True,
    )
    rows = []
    for compress in ("", args.press):
        t = time.time()
        row = run(samples, num_blocks, compress, args.threads)
        row["wall_s"] = time.time() - t
        rows.append(row)
        print(
            f"  {row['compress_on_evict']:>16}: returning TTFT p50 {row['ttft_p50_s']:.3f} s, "
            f"p90 {row['ttft_p90_s']:.3f} s; needle {row['needle']}/{row['conversations']}; "
            f"cached {row['cached_tokens_mean']:.0f} tokens/turn ({row['compressed_cached_tokens_mean']:.0f} "
            f"from compressed prefixes); evicted {row['evicted_blocks']} blocks, "
            f"{row['compressions']} compressions ({row['wall_s']:.0f} s)",
            flush=True,
        )
    speedup = rows[0]["ttft_p50_s"] / rows[1]["ttft_p50_s"] if rows[1]["ttft_p50_s"] else float("inf")
    print(f"TTFT p50 of the returning turn: {speedup:.1f}x better with {args.press} (target >= 2x); "
          f"needle {rows[1]['needle']}/{args.conversations} (target >= 10 of 12)")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
