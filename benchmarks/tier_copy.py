"""What the KV tiers' copies cost against what they save (issue 30), with a real model's block shape.

Three figures, each the median of `--repeats` runs after a warm-up:

1. Demote: `execute_moves` of N device blocks to the host pool, and of N host blocks to disk.
2. Load back a `--prefix-tokens` prefix (128 blocks of 16 tokens at 2k) from the host pool and
   from disk (disk -> host -> device, as the host tier sits between; the disk files read warm
   from the page cache, and cold: synced and dropped from it with posix_fadvise first), against
   the prefill of the same tokens through the model. Target: a load back under a tenth of the
   prefill.
3. Demotion during decode: a decode step of `--batch` running sequences of `--context` tokens,
   against the demotion of the blocks such a step can evict: batch / block_size of them on
   average (each sequence crosses a block boundary once every block_size steps), `--batch` at
   worst (every sequence at once). Target: <= 5 % of the step.

    python benchmarks/tier_copy.py                          # SmolLM2-135M on the CPU
    python benchmarks/tier_copy.py --model sage-tiny --prefix-tokens 512 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.model import ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.disk_store import DiskKVStore
from engine_adapter.model.host_pool import HostKVPool
from engine_adapter.model.tier_copy import execute_moves

D, H, K = Tier.DEVICE, Tier.HOST, Tier.DISK


def timed(run: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median seconds of `run` over `repeats` runs after one warm-up; `before` runs untimed first."""
    times = []
    for _ in range(repeats + 1):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def moves(src: Tier, srcs: range, dst: Tier, dsts: range) -> list[TierMove]:
    return [TierMove(src, s, dst, d, ("bench", i)) for i, (s, d) in enumerate(zip(srcs, dsts, strict=True))]


def drop_from_page_cache(directory: Path) -> None:
    """Write the files back and drop them from the page cache: the next read is from the disk."""
    os.sync()
    for entry in os.scandir(directory):
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def prefill_s(decoder: Decoder, tokens: int, block_size: int, repeats: int) -> float:
    """Median seconds of one prefill of `tokens` random tokens (one sequence)."""
    blocks = -(-tokens // block_size)
    pool = decoder.make_pool(num_blocks=blocks, block_size=block_size)
    table = list(range(blocks))
    prompt = torch.randint(0, min(decoder.config.vocab_size, 4096), (tokens,)).tolist()
    return timed(lambda: decoder(ForwardBatch([prompt], [0], [table]), pool), repeats)


def load_back(decoder: Decoder, args: argparse.Namespace, disk_dir: Path) -> dict[str, float]:
    """Demote a prefix's blocks and load them back, from host and from disk."""
    n = -(-args.prefix_tokens // args.block_size)
    pool = decoder.make_pool(num_blocks=2 * n, block_size=args.block_size)
    for t in pool.k_cache + pool.v_cache:
        t.normal_()
    host, disk = HostKVPool.like(pool, 2 * n), DiskKVStore.like(pool, disk_dir, n)
    first, second = range(n), range(n, 2 * n)
    demote = moves(D, first, H, first)
    to_disk = moves(H, first, K, first)
    from_host = moves(H, first, D, second)
    from_disk = moves(K, first, H, second) + moves(H, second, D, second)
    figures = {
        "blocks": n,
        "block_bytes": pool.bytes_per_block,
        "demote_to_host_ms": timed(lambda: execute_moves(demote, pool, host, disk), args.repeats) * 1e3,
        "demote_host_to_disk_ms": timed(lambda: execute_moves(to_disk, pool, host, disk), args.repeats) * 1e3,
        "load_from_host_ms": timed(lambda: execute_moves(from_host, pool, host, disk), args.repeats) * 1e3,
        "load_from_disk_warm_ms": timed(lambda: execute_moves(from_disk, pool, host, disk), args.repeats)
        * 1e3,
        "load_from_disk_cold_ms": timed(
            lambda: execute_moves(from_disk, pool, host, disk),
            args.repeats,
            before=lambda: drop_from_page_cache(disk_dir),
        )
        * 1e3,
    }
    assert all(torch.equal(t[: len(first)], t[len(first) :]) for t in pool.k_cache + pool.v_cache)
    return figures


def decode_step(decoder: Decoder, args: argparse.Namespace) -> dict[str, float]:
    """A decode step of `--batch` sequences against the demotion of the blocks it can evict."""
    per_seq = -(-(args.context + args.repeats + 2) // args.block_size)
    pool = decoder.make_pool(num_blocks=args.batch * per_seq + args.batch, block_size=args.block_size)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(args.batch)]
    prompts = torch.randint(0, min(decoder.config.vocab_size, 4096), (args.batch, args.context)).tolist()
    for i in range(args.batch):  # prefill one by one: a batch of 32 long prompts is slow to build
        decoder(ForwardBatch([prompts[i]], [0], [tables[i]]), pool)
    position = [args.context]

    def step() -> None:
        batch = ForwardBatch([[1]] * args.batch, [position[0]] * args.batch, tables)
        decoder(batch, pool).logits.argmax(-1).tolist()
        position[0] += 1

    step_s = timed(step, args.repeats)
    host = HostKVPool.like(pool, args.batch)
    spare = args.batch * per_seq
    average = max(1, args.batch // args.block_size)
    worst = moves(D, range(spare - args.batch, spare), H, range(args.batch))
    return {
        "batch": args.batch,
        "context": args.context,
        "step_ms": step_s * 1e3,
        "demote_average_blocks": average,
        "demote_average_ms": timed(lambda: execute_moves(worst[:average], pool, host, None), args.repeats)
        * 1e3,
        "demote_worst_blocks": args.batch,
        "demote_worst_ms": timed(lambda: execute_moves(worst, pool, host, None), args.repeats) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--disk-dir", type=Path, default=None, help="default: a temporary folder in $TMPDIR")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    decoder, _tokenizer, _config = load_model(args.model, device="cpu")
    with torch.inference_mode(), tempfile.TemporaryDirectory(dir=args.disk_dir) as tmp:
        prefill = prefill_s(decoder, args.prefix_tokens, args.block_size, max(1, args.repeats // 2))
        tiers = load_back(decoder, args, Path(tmp))
        step = decode_step(decoder, args)
    result: dict[str, Any] = {
        "machine": machine_line(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "model": args.model,
        "kv_dtype": str(decoder.dtype).removeprefix("torch."),
        "prefix_tokens": args.prefix_tokens,
        "prefill_ms": prefill * 1e3,
        **tiers,
        **{f"decode_{k}": v for k, v in step.items()},
    }
    result["load_from_host_over_prefill"] = tiers["load_from_host_ms"] / result["prefill_ms"]
    result["load_from_disk_cold_over_prefill"] = tiers["load_from_disk_cold_ms"] / result["prefill_ms"]
    result["demote_average_over_step"] = step["demote_average_ms"] / step["step_ms"]
    result["demote_worst_over_step"] = step["demote_worst_ms"] / step["step_ms"]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    _print(result)


def _print(r: dict[str, Any]) -> None:
    mib = r["blocks"] * r["block_bytes"] / 2**20
    print(f"machine: {r['machine']}, {r['torch_threads']} torch threads, load {r['loadavg_1m']}")
    blocks = f"{r['blocks']} blocks of {r['block_bytes']} bytes = {mib:.1f} MiB"
    print(f"model {r['model']} (KV {r['kv_dtype']}), {blocks}")
    print(f"prefill of {r['prefix_tokens']} tokens         {r['prefill_ms']:9.1f} ms")
    print(f"demote {r['blocks']} blocks device->host   {r['demote_to_host_ms']:9.1f} ms")
    print(f"demote {r['blocks']} blocks host->disk     {r['demote_host_to_disk_ms']:9.1f} ms")
    print(
        f"load back from host              {r['load_from_host_ms']:9.1f} ms  "
        f"({r['load_from_host_over_prefill']:.3f} of the prefill; target < 0.1)"
    )
    print(f"load back from disk, warm        {r['load_from_disk_warm_ms']:9.1f} ms")
    print(
        f"load back from disk, cold        {r['load_from_disk_cold_ms']:9.1f} ms  "
        f"({r['load_from_disk_cold_over_prefill']:.3f} of the prefill; target < 0.1)"
    )
    shape = f"{r['decode_batch']} sequences of {r['decode_context']} tokens"
    print(f"decode step, {shape}  {r['decode_step_ms']:9.1f} ms")
    print(
        f"demote {r['decode_demote_average_blocks']} blocks (average step)   "
        f"{r['decode_demote_average_ms']:9.2f} ms  "
        f"({100 * r['demote_average_over_step']:.2f} % of the step; target <= 5 %)"
    )
    print(
        f"demote {r['decode_demote_worst_blocks']} blocks (worst step)    "
        f"{r['decode_demote_worst_ms']:9.2f} ms  "
        f"({100 * r['demote_worst_over_step']:.2f} % of the step)"
    )


if __name__ == "__main__":
    main()
