"""Multi-turn chats through the engine with and without a host KV tier (issue 30's engine target).

Replays `--conversations` chats of `--turns` turns each on a real model (SmolLM2-135M by default)
with a small device pool (`--device-blocks`, 64) so that a conversation's history is evicted
before it returns: without a tier its next turn recomputes the whole history; with a host tier
(`--host-blocks`, 1024) the evicted blocks were demoted and are loaded back. Each turn of all
conversations is submitted at once (the engine runs `--concurrency` at a time, the rest queue,
which is when `--prefetch` loads their prefixes ahead). The turns' greedy outputs must be
identical in every mode (checked: exit 1 otherwise; they feed the next turn's history).

Modes: ``off`` (no host tier), ``host`` (host tier, no prefetch), ``host+prefetch``. Reported per
mode: TTFT p50/p99 of the returning turns (turn 2 on) and p50 of the first turns, wall time, host
hits, promotions, prefetched blocks and hits, the host tier's load time p50/p99, and the TTFT p50
ratio of ``off`` over each mode (the target: 2x). TTFT counts from submission: with a burst it
includes the wait in the queue behind the other conversations' decoding; with `--one-at-a-time`
it is the turn's own admission, load and prefill (and there is no queue to prefetch for).

    python benchmarks/tier_replay.py --threads 1
    python benchmarks/tier_replay.py --threads 1 --one-at-a-time --max-tokens 8 --modes off,host
    python benchmarks/tier_replay.py --conversations 4 --turns 2 --max-tokens 8   # quick
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if importlib.util.find_spec("engine_adapter") is None:  # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model.chat_template import ChatMessage
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.handles import RequestHandle

# fmt: off
WORDS = [
    "cache", "block", "memory", "host", "device", "tier", "prefix", "token", "model", "layer",
    "request", "queue", "policy", "latency", "prefill", "decode", "batch", "eviction", "radix",
    "tree", "page", "copy", "bandwidth", "disk", "chat", "history", "turn", "answer",
]
# fmt: on


@dataclass
class ModeResult:
    mode: str
    outputs: list[list[int]] = field(default_factory=list)  # turn-major, conversation-minor
    ttft_first: list[float] = field(default_factory=list)
    ttft_returning: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    tiers: list[dict[str, Any]] = field(default_factory=list)
    bytes_per_block: int = 0


def user_message(rng: random.Random, conversation: int, turn: int, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Conversation {conversation}, question {turn}: explain in one sentence: {body}."


def _watch(handle: RequestHandle, t0: float, out: dict[str, Any]) -> None:
    """The time of the request's first output (its first token) and its final output."""
    for item in handle:
        if "first" not in out:
            out["first"] = time.perf_counter() - t0
        if item.finished:
            out["final"] = item
            return


def run_mode(mode: str, args: argparse.Namespace, bytes_per_block: int) -> ModeResult:
    config = EngineConfig(
        model=args.model,
        device="cpu",
        name=f"tier-replay-{mode.replace('+', '-')}",
        socket="/tmp/sage-tier-replay-unused.sock",
        block_size=args.block_size,
        num_blocks=args.device_blocks,
        max_num_seqs=args.concurrency,
        threads=args.threads,
        host_kv_cache=None if mode == "off" else args.host_blocks * bytes_per_block,
        prefetch=mode == "host+prefetch",
    )
    engine = Engine(config)
    engine.start()
    result = ModeResult(mode, bytes_per_block=engine.pool.bytes_per_block)
    rng = random.Random(args.seed)
    histories: list[list[ChatMessage]] = [
        [ChatMessage("system", f"You are assistant number {c}. Answer briefly.")]
        for c in range(args.conversations)
    ]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    try:
        for turn in range(args.turns):
            watches: list[tuple[threading.Thread, dict[str, Any]]] = []
            for c, history in enumerate(histories):
                history.append(ChatMessage("user", user_message(rng, c, turn, args.words)))
                ids = engine.chat_prompt(history)
                out: dict[str, Any] = {}
                t0 = time.perf_counter()
                thread = threading.Thread(target=_watch, args=(engine.submit(ids, sampling), t0, out))
                thread.start()
                if args.one_at_a_time:  # TTFT is the turn's own load and prefill, no queue
                    thread.join(timeout=600)
                watches.append((thread, out))
            for (thread, out), history in zip(watches, histories, strict=True):
                thread.join(timeout=600)
                final = out["final"]
                result.outputs.append(list(final.token_ids))
                (result.ttft_returning if turn else result.ttft_first).append(out["first"])
                history.append(ChatMessage("assistant", final.text))
        result.wall_s = time.perf_counter() - start
        result.tiers = [dataclasses.asdict(t) for t in engine.cache.stats().tiers]
    finally:
        engine.shutdown()
    return result


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def report(results: list[ModeResult]) -> dict[str, Any]:
    base = statistics.median(results[0].ttft_returning)
    rows = []
    for r in results:
        host = r.tiers[0] if r.tiers else {}
        p50 = statistics.median(r.ttft_returning)
        rows.append(
            {
                "mode": r.mode,
                "ttft_returning_p50_s": p50,
                "ttft_returning_p99_s": _quantile(r.ttft_returning, 0.99),
                "ttft_first_p50_s": statistics.median(r.ttft_first),
                "wall_s": r.wall_s,
                "host_hits": host.get("hits", 0),
                "host_promotions": host.get("promotions", 0),
                "host_demotions": host.get("demotions", 0),
                "prefetched": host.get("prefetched_blocks", 0),
                "prefetch_hits": host.get("prefetch_hits", 0),
                "load_p50_ms": host.get("load_time_p50_ms", 0.0),
                "load_p99_ms": host.get("load_time_p99_ms", 0.0),
                "speedup_vs_off": base / p50 if p50 else 0.0,
                "outputs_equal_off": r.outputs == results[0].outputs,
            }
        )
    return {"machine": machine_line(), "rows": rows}


def print_report(rep: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"# {rep['machine']}")
    print(
        f"# {args.model}: {args.conversations} conversations x {args.turns} turns, {args.max_tokens} "
        f"tokens each, device pool {args.device_blocks} blocks of {args.block_size}, host tier "
        f"{args.host_blocks} blocks, {args.concurrency} running at a time, threads {args.threads}, "
        f"{'one request at a time' if args.one_at_a_time else 'each turn of all conversations at once'}"
    )
    head = (
        f"{'mode':14} {'TTFT ret p50':>12} {'p99':>8} {'first p50':>9} {'wall':>7} {'hits':>5} "
        f"{'promo':>5} {'demo':>5} {'pref':>5} {'pf hit':>6} {'load p50':>8} {'p99':>7} {'x off':>6} same"
    )
    print(head)
    for r in rep["rows"]:
        print(
            f"{r['mode']:14} {r['ttft_returning_p50_s']:11.3f}s {r['ttft_returning_p99_s']:7.3f}s "
            f"{r['ttft_first_p50_s']:8.3f}s {r['wall_s']:6.1f}s {r['host_hits']:5d} "
            f"{r['host_promotions']:5d} {r['host_demotions']:5d} {r['prefetched']:5d} "
            f"{r['prefetch_hits']:6d} {r['load_p50_ms']:6.2f}ms {r['load_p99_ms']:5.1f}ms "
            f"{r['speedup_vs_off']:5.2f}x {r['outputs_equal_off']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--words", type=int, default=60, help="random words per user message")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--device-blocks", type=int, default=64)
    parser.add_argument("--host-blocks", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=2, help="the engine's max_num_seqs")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="submit each turn alone and wait for it (TTFT without queueing; nothing to prefetch)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="off,host,host+prefetch")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if modes[0] != "off" or not set(modes) <= {"off", "host", "host+prefetch"}:
        parser.error("--modes: off first, then any of host, host+prefetch")
    results = [run_mode("off", args, 0)]
    bpb = results[0].bytes_per_block
    results += [run_mode(mode, args, bpb) for mode in modes[1:]]
    rep = report(results)
    print_report(rep, args)
    if args.json is not None:
        args.json.write_text(json.dumps(rep, indent=2))
    if not all(r["outputs_equal_off"] for r in rep["rows"]):
        print("greedy outputs differ between modes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
