"""Prompt-cache retention (issue 51, item 7): agent-like sessions whose pauses turn the pool over.

Sessions share a system prompt; each turn sends the whole conversation back (system prompt, the
earlier turns' questions and answers, a new question), as coding agents do. Between two turns
of a session the other sessions run and fresh one-off requests ("filler", no lifetime) turn
the device pool over several times: the idle pause, in tokens rather than seconds. Four runs of
the same stream, one engine each, requests one at a time (so TTFT is the prefill's):

- ``lru``: no lifetime asked, no lower tier (today's cache);
- ``ttl-host``: ``ttl 1h`` on every session turn, a host tier (retention by demotion);
- ``ttl-device``: ``ttl 1h``, no lower tier (retention pins, `--max-retained-fraction`);
- ``explicit``: ``ttl 1h`` with a host tier, explicit writes up to the system prompt only.

Printed per run: the returning turns' (turn 2 on) TTFT p50/p90, the share of their cacheable
prefix (the previous turn's prompt, whole blocks) that hit, tokens hit from the device and from
host, tokens written, retention breaks, pool turnovers (device evictions / pool blocks), and
how many requests' usage did not add up (written + read > prompt: should be 0).

    python benchmarks/retention.py                      # SmolLM2 when installed, else sage-tiny
    python benchmarks/retention.py --model sage-tiny --sessions 16 --turns 4
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.cache.contract import CacheContract
from engine_adapter.model.builtin import smollm2_gguf_path
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine

HOUR = 3600.0
MODES = ("lru", "ttl-host", "ttl-device", "explicit")


@dataclass
class Request:
    """One request of the stream: its tokens, and for a session turn its session and turn."""

    tokens: list[int]
    session: int | None = None
    turn: int = 0
    cacheable: int = 0  # the previous turn's prompt, whole blocks: what a cache could serve


@dataclass
class Tally:
    ttft: list[float] = field(default_factory=list)
    hit: int = 0
    cacheable: int = 0
    cached: int = 0
    written: int = 0
    not_adding_up: int = 0


def _stream(args: argparse.Namespace, vocab: int) -> tuple[list[int], list[list[Request]]]:
    """The system prompt and the rounds of the stream: round t holds every session's turn t,
    each followed by `args.filler` one-off requests. A turn's tokens are filled in as it runs
    (it carries the previous answer)."""
    rng = random.Random(args.seed)
    draw = lambda n: [rng.randrange(10, vocab) for _ in range(n)]  # noqa: E731
    system = draw(args.system_tokens)
    rounds = []
    for turn in range(args.turns):
        batch: list[Request] = []
        for session in range(args.sessions):
            batch.append(Request(draw(args.question_tokens), session, turn))
            batch.extend(Request(draw(args.filler_tokens)) for _ in range(args.filler))
        rounds.append(batch)
    return system, rounds


def _engine(folder: str, mode: str, args: argparse.Namespace) -> Engine:
    config = EngineConfig(
        model=args.model,
        device="cpu",
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        threads=args.threads,
        host_kv_cache=None if mode in ("lru", "ttl-device") else f"{args.host_mib}MiB",  # type: ignore[arg-type]
        max_retained_fraction=args.max_retained_fraction,
        name=f"ret-{mode}",
        socket=os.path.join(folder, f"{mode}.sock"),
    )
    engine = Engine(EngineConfig.from_dict(config.to_dict()))
    engine.start()
    return engine


def _ask(engine: Engine, tokens: list[int], contract: CacheContract | None, max_tokens: int) -> tuple:
    """Submit, wait for the first token (TTFT) and the end; the final output and the TTFT."""
    start = time.perf_counter()
    handle = engine.submit(
        tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), cache_contract=contract
    )
    first = None
    for output in handle:
        if first is None and output.token_ids:
            first = time.perf_counter() - start
        if output.finished:
            break
    return handle.result(timeout=600), first if first is not None else time.perf_counter() - start


def run(mode: str, system: list[int], rounds: list[list[Request]], args: argparse.Namespace) -> None:
    bs = args.block_size
    history: dict[int, list[int]] = {}  # each session's conversation so far
    prompted: dict[int, int] = {}  # the length of each session's last prompt
    tally = Tally()
    with tempfile.TemporaryDirectory() as folder:
        engine = _engine(folder, mode, args)
        try:
            _ask(engine, [7] * 64, None, 2)  # warm up: the first forward pays one-off costs
            for batch in rounds:
                for req in batch:
                    contract = None
                    if req.session is None:
                        tokens = req.tokens
                    else:
                        before = history.get(req.session, system)
                        tokens = before + req.tokens
                        if mode != "lru":
                            write = len(system) if mode == "explicit" else None
                            contract = CacheContract(
                                session_key=f"s{req.session}", ttl_s=HOUR, write_tokens=write
                            )
                    out, ttft = _ask(engine, tokens, contract, args.max_tokens)
                    if out.written_tokens + out.cached_tokens > out.prompt_tokens:
                        tally.not_adding_up += 1
                    tally.cached += out.cached_tokens
                    tally.written += out.written_tokens
                    if req.session is not None:
                        if req.turn > 0:
                            cacheable = prompted[req.session] // bs * bs
                            tally.ttft.append(ttft)
                            tally.cacheable += cacheable
                            tally.hit += min(out.cached_tokens, cacheable)
                        history[req.session] = tokens + list(out.token_ids)
                        prompted[req.session] = len(tokens)
            stats = engine.eviction_stats()
        finally:
            engine.shutdown()
    host_hits = sum(t.hits for t in stats.tiers) * bs
    q = statistics.quantiles(tally.ttft, n=10) if len(tally.ttft) > 1 else [tally.ttft[0]] * 9
    print(
        f"| {mode} | {statistics.median(tally.ttft) * 1e3:.0f} | {q[8] * 1e3:.0f} | "
        f"{tally.hit / max(tally.cacheable, 1):.1%} | {tally.cached - host_hits} | {host_hits} | "
        f"{tally.written} | {stats.retention_broken_blocks} | "
        f"{stats.total_evictions / args.num_blocks:.1f} | "
        f"{stats.preemptions} | {stats.retention_refused_blocks} | {tally.not_adding_up} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m" if smollm2_gguf_path() is not None else "sage-tiny")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=256)
    parser.add_argument("--question-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--filler", type=int, default=2, help="one-off requests after each session turn")
    parser.add_argument("--filler-tokens", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--host-mib", type=int, default=256)
    parser.add_argument("--max-retained-fraction", type=float, default=0.25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=51)
    args = parser.parse_args()
    vocab = 250 if args.model == "sage-tiny" else 49000
    system, rounds = _stream(args, vocab)
    print(f"# {machine_line()}")
    print(
        f"# {args.model}; {args.sessions} sessions x {args.turns} turns, system prompt {args.system_tokens} "
        f"tokens, questions {args.question_tokens}, answers {args.max_tokens}; {args.filler} filler "
        f"request(s) of {args.filler_tokens} tokens after each turn; pool {args.num_blocks} x "
        f"{args.block_size}; host tier {args.host_mib} MiB where used"
    )
    print(
        "| mode | returning TTFT p50 ms | p90 ms | returning prefix hit | device hit tokens "
        "| host hit tokens | written tokens | breaks | pool turnovers | preemptions "
        "| retention refused (blocks) | usage not adding up |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    _warm_up(args, system, rounds)
    for mode in args.modes.split(","):
        run(mode, system, rounds, args)


def _warm_up(args: argparse.Namespace, system: list[int], rounds: list[list[Request]]) -> None:
    """The process's first engine pays one-off costs (kernels, allocator, thread pools) on its
    first prompts of each length: one throwaway engine serves the first round's shapes."""
    with tempfile.TemporaryDirectory() as folder:
        engine = _engine(folder, "lru", args)
        try:
            for req in rounds[0][: 2 + args.filler]:
                _ask(engine, system + req.tokens if req.session is not None else req.tokens, None, 2)
        finally:
            engine.shutdown()


if __name__ == "__main__":
    main()
