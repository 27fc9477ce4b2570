"""`sage llm benchmark --mode engine`: replay a workload through a live engine's completions API.

For each policy: switch the engine to it (`PUT /v1/eviction/policy`), drop the prefix cache
(`POST /v1/cache/reset`) so no run inherits another's blocks, replay the requests at their
arrival times (scaled by `time_scale`) from a pool of client threads with streamed completions,
and read the engine's counters before and after. TTFT, TPOT and throughput are real wall times.

Prompts are made from the workload's block ids: each block id becomes `tokens_per_block` token
ids drawn from a generator seeded with the id, so requests that share blocks share a token
prefix exactly as they share blocks in the trace.

With no engine on the socket, a temporary one is started for the run (and stopped after); it
also runs the unbounded-cache reference that `throughput_impact` is measured against.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sage_cli.client import ControlClient, SageClientError
from sage_cli.spawn import TemporaryEngine
from sage_eviction.metrics import percentile

__all__ = [
    "EngineRun",
    "latency_figures",
    "prompt_tokens",
    "replay_requests",
    "run_engine_benchmark",
    "start_temporary_engine",
]

TOKEN_ID_RANGE = 256  # byte ids: valid for sage-tiny and for any larger vocabulary


def prompt_tokens(block_keys: Sequence[Hashable], tokens_per_block: int) -> list[int]:
    """Token ids for a prompt made of these blocks; equal keys give equal tokens."""
    ids: list[int] = []
    for key in block_keys:
        rng = random.Random(f"sage-block-{key!r}")
        ids.extend(rng.randrange(TOKEN_ID_RANGE) for _ in range(tokens_per_block))
    return ids


@dataclass
class EngineRun:
    """One request's timings."""

    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    status: int = 0  # the HTTP status of a refused request (429: colocation's admission)


def _stream_completion(client: ControlClient, body: dict[str, Any]) -> EngineRun:
    """One streamed request: its time to first token, times between tokens and usage."""
    run = EngineRun()
    start = time.perf_counter()
    last: float | None = None
    try:
        for chunk in client.stream_completion(body, timeout=600.0):
            usage = chunk.get("usage")
            if usage:
                run.prompt_tokens = int(usage.get("prompt_tokens", 0))
                details = usage.get("prompt_tokens_details") or {}
                run.cached_tokens = int(details.get("cached_tokens", 0))
            for choice in chunk.get("choices", []):
                if choice.get("text") or choice.get("finish_reason") is None:
                    now = time.perf_counter()
                    if run.ttft_s is None:
                        run.ttft_s = now - start
                    elif last is not None:
                        run.tpot_s.append(now - last)
                    last = now
                    run.completion_tokens += 1
        run.ok = True
    except SageClientError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        run.status = int(getattr(exc, "status_code", 0) or 0)
    return run


def replay_requests(
    requests: Sequence[Any],
    send: Callable[[Any], EngineRun],
    *,
    time_scale: float,
    concurrency: int,
    tick: Callable[[], None],
) -> tuple[list[EngineRun], float]:
    """Send each request at its arrival time (`arrival_s` x `time_scale` after the start) from
    `concurrency` client threads; returns each request's run and the wall time of them all.

    Both engine modes replay through here: sage's engine over its socket and a vLLM server
    over HTTP differ only in `send`.
    """
    runs: list[EngineRun] = [EngineRun() for _ in requests]
    lock = threading.Lock()
    start = time.perf_counter()

    def one(i: int) -> None:
        req = requests[i]
        delay = req.arrival_s * time_scale - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        runs[i] = send(req)
        with lock:
            tick()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(len(requests))))
    return runs, time.perf_counter() - start


def latency_figures(runs: list[EngineRun], wall: float) -> dict[str, Any]:
    """What every engine-mode row reports of its requests: failures, TTFT and TPOT quantiles,
    throughput."""
    ok = [r for r in runs if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [t for r in ok for t in r.tpot_s]
    tokens = sum(r.completion_tokens for r in ok)
    return {
        "requests": len(runs),
        "failed": len(runs) - len(ok),
        "ttft_p50_s": _quantile(ttfts, 0.5),
        "ttft_p99_s": _quantile(ttfts, 0.99),
        "tpot_p50_s": _quantile(tpots, 0.5),
        "tpot_p99_s": _quantile(tpots, 0.99),
        "throughput_tok_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "wall_s": wall,
    }


def _replay(
    socket: Path,
    *,
    requests: Sequence[Any],
    tokens_per_block: int,
    max_output_tokens: int,
    time_scale: float,
    concurrency: int,
    tick: Callable[[], None],
) -> tuple[list[EngineRun], float]:
    with ControlClient(socket, timeout=60.0) as client:
        client.health()  # connect before the workers share the client

        def send(req: Any) -> EngineRun:
            body = {
                "prompt": prompt_tokens(req.block_hashes, tokens_per_block),
                "max_tokens": max(1, min(int(req.output_len), max_output_tokens)),
                "temperature": 0.0,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
                "priority": int(req.priority),
            }
            if req.tenant is not None:
                body["tenant"] = str(req.tenant)
            return _stream_completion(client, body)

        return replay_requests(requests, send, time_scale=time_scale, concurrency=concurrency, tick=tick)


def _row(
    policy: str, runs: list[EngineRun], wall: float, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    def delta(key: str) -> float:
        return float(after.get(key) or 0) - float(before.get(key) or 0)

    lookups = delta("prefix_cache_queries_tokens")
    evictions = delta("total_evictions")
    return {
        "policy": policy,
        "hit_rate": delta("prefix_cache_hits_tokens") / lookups if lookups else 0.0,
        "re_prefill_rate": delta("re_prefill_blocks") / evictions if evictions else 0.0,
        "evictions": int(evictions),
        "preemptions": int(delta("preemptions")),
        "fairness_score": after.get("fairness_score"),
        "memory_utilization": after.get("memory_utilization"),
        **latency_figures(runs, wall),
    }


def _quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (`sage_eviction.metrics.percentile`), or None when there are none."""
    return percentile(sorted(values), q) if values else None


def start_temporary_engine(config: dict[str, Any], timeout: float = 120.0) -> TemporaryEngine:
    """An engine on a private socket (`TemporaryEngine`), warmed up so that the first measured
    requests do not pay for torch's first calls."""
    engine = TemporaryEngine(config, timeout)
    try:
        with ControlClient(engine.socket, timeout=120.0) as client:
            for size in (8, 64, 8):
                client.complete({"prompt": [1] * size, "max_tokens": 4, "ignore_eos": True})
            client.reset_cache()
    except BaseException:
        engine.stop()
        raise
    return engine


def run_engine_benchmark(
    *,
    policies: list[str],
    requests: Sequence[Any],
    workload: dict[str, Any],
    socket: Path | None,
    tokens_per_block: int = 16,
    max_output_tokens: int = 16,
    time_scale: float = 0.0,
    concurrency: int = 8,
    num_blocks: int | None = None,
    progress: Callable[[int, int], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """Run every policy against a live engine; start a temporary one when `socket` has none.

    Args:
        policies: Registry names.
        requests: `SimRequest`s (arrival_s, block_hashes, output_len, tenant, priority).
        workload: The workload's description for the JSON output.
        socket: A running engine's socket; None (or nothing listening) starts a temporary engine.
        tokens_per_block: Tokens each workload block becomes (the engine's block size fits best).
        max_output_tokens: Cap on each request's output (a CPU engine is slow).
        time_scale: Seconds of wall time per second of trace time (0: send as fast as possible).
        concurrency: Client threads.
        num_blocks: Pool size of a temporary engine (default: a quarter of the workload's blocks).
        progress: Called with (policy index, total) to get a tick callback per request.

    Returns:
        ``{"workload": ..., "mode": "engine", "results": [row, ...]}``.
    """
    unique = {k for r in requests for k in r.block_hashes}
    replay = functools.partial(
        _replay,
        requests=requests,
        tokens_per_block=tokens_per_block,
        max_output_tokens=max_output_tokens,
        time_scale=time_scale,
        concurrency=concurrency,
    )
    if socket is not None and _answers(socket):
        return {
            "workload": workload,
            "mode": "engine",
            "results": _policy_rows(socket, policies, replay, progress),
        }
    # No engine: an unbounded one gives the reference row, then a bounded one runs the policies.
    blocks = _temporary_pool_blocks(requests, num_blocks, tokens_per_block, max_output_tokens, len(unique))
    base = {"block_size": tokens_per_block, "device": "cpu", "eviction_policy": policies[0]}
    with start_temporary_engine({**base, "num_blocks": 4 * len(unique) + 1024}) as unbounded:
        runs, wall = replay(unbounded.socket, tick=lambda: None)
        with ControlClient(unbounded.socket) as client:
            reference = _row("unbounded", runs, wall, {}, client.eviction_stats())
    with start_temporary_engine({**base, "num_blocks": blocks}) as bounded:
        rows = _policy_rows(bounded.socket, policies, replay, progress)
    ref = reference["throughput_tok_s"]
    for row in rows:
        row["throughput_impact"] = 1.0 - row["throughput_tok_s"] / ref if ref else None
    return {"workload": workload, "mode": "engine", "results": [*rows, reference]}


def _temporary_pool_blocks(
    requests: Sequence[Any],
    num_blocks: int | None,
    tokens_per_block: int,
    max_output_tokens: int,
    unique: int,
) -> int:
    """The pool of the temporary engine: `num_blocks`, else a quarter of the workload's blocks;
    never less than the largest request, which could otherwise never be served."""
    largest = max(len(r.block_hashes) + -(-max_output_tokens // tokens_per_block) + 1 for r in requests)
    if num_blocks is not None and num_blocks < largest:
        raise ValueError(
            f"a pool of {num_blocks} blocks cannot hold the workload's largest request "
            f"({largest} blocks of {tokens_per_block} tokens): give at least {largest}"
        )
    return num_blocks or max(largest, unique // 4)


def _policy_rows(
    socket: Path,
    policies: list[str],
    replay: Callable[..., tuple[list[EngineRun], float]],
    progress: Callable[[int, int], Callable[[], None]] | None,
) -> list[dict[str, Any]]:
    """Each policy in turn on the engine at `socket`: swap, reset the cache, replay, measure."""
    rows: list[dict[str, Any]] = []
    with ControlClient(socket, timeout=60.0) as client:
        for index, policy in enumerate(policies):
            swap = client.set_policy(policy)
            client.reset_cache()
            before = client.eviction_stats()
            tick = progress(index, len(policies)) if progress else (lambda: None)
            runs, wall = replay(socket, tick=tick)
            row = _row(policy, runs, wall, before, client.eviction_stats())
            row["swap_time_s"] = swap.get("swap_time_s")
            rows.append(row)
    return rows


def _answers(socket: Path) -> bool:
    """Whether an engine answers on `socket` (else the benchmark starts a temporary one)."""
    if not os.path.exists(socket):
        return False
    try:
        with ControlClient(socket, timeout=2.0) as client:
            client.health()
        return True
    except SageClientError:  # not running, not a socket, not answering, or not an engine
        return False
