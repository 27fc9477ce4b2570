"""``sage llm benchmark --mode engine``: replay a workload through a live engine's completions API.

For each policy: switch the engine to it (`PUT /v1/eviction/policy`), drop the prefix cache
(`POST /v1/cache/reset`) so no run inherits another's blocks, replay the requests at their
arrival times (scaled by `time_scale`) from a pool of client threads with streamed completions,
and read the engine's counters before and after. TTFT, TPOT and throughput are real wall times.
Output tokens are each stream's ``usage`` (asked for with ``stream_options.include_usage``),
never its chunks: a chunk may hold several tokens or none (`replay.read_stream`).

With no engine on the socket, a temporary one is started for the run (and stopped after); it
also runs the unbounded-cache reference that `throughput_impact` is measured against.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sage_cli.benchmark.checks import BenchmarkPlan
from sage_cli.benchmark.options import BenchmarkArgs
from sage_cli.benchmark.replay import (
    EngineRun,
    engine_workload,
    latency_figures,
    prompt_tokens,
    replay_requests,
    start_temporary_engine,
    timed_completion,
)
from sage_cli.benchmark.table import save_and_show
from sage_cli.client import ControlClient, SageClientError
from sage_cli.errors import CLIError, CLIUsageError

__all__ = ["run_engine_benchmark", "run_on_engine"]


def run_on_engine(args: BenchmarkArgs, plan: BenchmarkPlan) -> None:
    """Check what engine mode takes, replay the workload through the engine on ``--socket`` or
    ``--name`` (a temporary one when none answers), save and print the rows."""
    if args.adaptive_batch:
        raise CLIUsageError("--adaptive-batch compares in sim mode; start an engine with it for engine mode")
    blocks = plan.capacity_blocks
    if plan.capacity_ratios is not None or (blocks is not None and len(blocks) > 1):
        raise CLIUsageError(
            "engine mode runs one pool size: give --capacity-blocks N (a temporary engine's pool)"
        )
    built = engine_workload(plan.source)
    result = _replay_with_progress(args, plan.policies, built, blocks[0] if blocks else None)
    save_and_show(result, args.output, args.json_out)


def _replay_with_progress(
    args: BenchmarkArgs, policies: list[str], built: Any, num_blocks: int | None
) -> dict[str, Any]:
    """`run_engine_benchmark` behind a progress bar per policy; its errors as the CLI's."""
    from rich.progress import Progress

    from sage_cli.paths import resolve_socket

    try:
        target = resolve_socket(args.socket, args.name)
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    with Progress(transient=True) as bar:

        def progress(index: int, total: int) -> Callable[[], None]:
            task = bar.add_task(f"{policies[index]} ({index + 1}/{total})", total=len(built.requests))
            return lambda: bar.advance(task)

        try:
            return run_engine_benchmark(
                policies=policies,
                requests=built.requests,
                workload=built.describe(),
                socket=target,
                tokens_per_block=16,
                max_output_tokens=args.max_output_tokens,
                time_scale=args.time_scale,
                concurrency=args.concurrency,
                num_blocks=num_blocks,
                progress=progress,
            )
        except RuntimeError as exc:
            raise CLIError(str(exc)) from None
        except ValueError as exc:
            raise CLIUsageError(str(exc)) from None


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
                "stream_options": {"include_usage": True},  # the tokens are counted from it
                "ignore_eos": True,
                "priority": int(req.priority),
            }
            if req.tenant is not None:
                body["tenant"] = str(req.tenant)
            return timed_completion(client, body)

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
