"""`sage llm benchmark --mode engine --engine-url URL --engine-kind vllm`: A/B inside vLLM.

Replays a workload through a running vLLM OpenAI server over HTTP and measures it with vLLM's
own numbers: the prefix-cache hit rate is the change of `vllm:prefix_cache_hits` over
`vllm:prefix_cache_queries` (tokens) on its `/metrics`; TTFT, TPOT and throughput are wall
times of streamed completions. vLLM cannot switch its eviction policy at run time, so one run
measures the policy the server was started with (`SAGE_VLLM_GPU_POLICY`, or vLLM's own LRU):
restart the server with the next policy and run again. Prompts are the same token ids as the
sage engine's benchmark (`replay.prompt_tokens`), so the two are comparable.

The CLI imports no vLLM: only httpx and prometheus_client's text parser.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from sage_cli.benchmark.checks import BenchmarkPlan, parse_policies
from sage_cli.benchmark.options import BenchmarkArgs, EngineKind, Mode
from sage_cli.benchmark.replay import (
    EngineRun,
    engine_workload,
    latency_figures,
    prompt_tokens,
    read_stream,
    replay_requests,
)
from sage_cli.benchmark.table import save_and_show
from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.sse import StreamError, json_chunks

__all__ = [
    "VLLMBenchmarkError",
    "prefix_cache_counters",
    "run_on_vllm",
    "run_vllm_benchmark",
    "stream_http_completion",
    "vllm_policies",
]

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"


class VLLMBenchmarkError(RuntimeError):
    """The server at the URL is not a reachable vLLM OpenAI server, or its metrics lack a counter."""


def vllm_policies(args: BenchmarkArgs) -> list[str]:
    """The one policy the vLLM server runs (its label: a sage policy, or ``vllm`` for its own),
    after the options of a vLLM run are checked.

    Raises:
        CLIUsageError: Not engine mode, no or a bad ``--engine-url``, more than one policy, or a
            ``--capacity-*`` (the server's pool is its own).
    """
    label = (args.eviction_policies or "vllm").strip()
    if args.mode is not Mode.engine:
        raise CLIUsageError("--engine-url and --engine-kind vllm go with --mode engine")
    if args.engine_kind is not EngineKind.vllm:
        raise CLIUsageError("--engine-url is a vLLM server's: give --engine-kind vllm with it")
    url = args.engine_url
    if url is None:
        raise CLIUsageError("--engine-kind vllm needs --engine-url URL (the running vLLM OpenAI server)")
    if not url.startswith(("http://", "https://")):
        raise CLIUsageError(f"--engine-url {url!r}: give an http:// or https:// URL")
    if "," in label:
        raise CLIUsageError(
            "vLLM runs one eviction policy per server start: give the one it runs in --eviction-policies "
            "(a sage policy name, or 'vllm' for its own), then restart it with the next one "
            "(SAGE_VLLM_GPU_POLICY=name) and run again"
        )
    if args.capacity_blocks is not None or args.capacity_ratio is not None:
        raise CLIUsageError(
            "the vLLM server's pool is its own (--num-gpu-blocks-override): drop --capacity-*"
        )
    return [label] if label == "vllm" else parse_policies(label, args.mode.value)


def run_on_vllm(args: BenchmarkArgs, plan: BenchmarkPlan, url: str) -> None:
    """Replay the workload through the vLLM server at `url` (``--engine-url``); save and print its row."""
    from rich.progress import Progress

    built = engine_workload(plan.source)
    policy = plan.policies[0]
    with Progress(transient=True) as bar:
        task = bar.add_task(f"{policy} on vLLM", total=len(built.requests))
        try:
            result = run_vllm_benchmark(
                url=url,
                policy=policy,
                requests=built.requests,
                workload=built.describe(),
                tokens_per_block=16,
                max_output_tokens=args.max_output_tokens,
                time_scale=args.time_scale,
                concurrency=args.concurrency,
                tick=lambda: bar.advance(task),
            )
        except VLLMBenchmarkError as exc:
            raise CLIError(str(exc)) from None
    save_and_show(result, args.output, args.json_out)


def prefix_cache_counters(metrics_text: str) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over every engine and model label in `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {HITS: 0.0, QUERIES: 0.0}
    found: set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        if family.name in totals:
            found.add(family.name)
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    missing = sorted(set(totals) - found)
    if missing:
        raise VLLMBenchmarkError(f"vLLM's /metrics has no {', '.join(missing)}: is prefix caching enabled?")
    return totals[HITS], totals[QUERIES]


def _get(client: httpx.Client, path: str) -> httpx.Response:
    try:
        response = client.get(path)
    except httpx.HTTPError as exc:
        raise VLLMBenchmarkError(f"cannot reach vLLM at {client.base_url}: {exc}") from None
    if response.status_code != 200:
        raise VLLMBenchmarkError(f"vLLM at {client.base_url}{path}: HTTP {response.status_code}")
    return response


def stream_http_completion(
    client: httpx.Client, body: dict[str, Any], *, require_usage: bool = True
) -> EngineRun:
    """One streamed ``POST /v1/completions`` to an OpenAI server over HTTP (vLLM, or a peer of
    `benchmarks/peers.py`), read by `replay.read_stream`: TTFT, TPOT, text and usage. The run is
    ok when the stream ended, and, with `require_usage`, carried a usage chunk to count its
    tokens (without, the caller counts them: `EngineRun.count_tokens`)."""
    run = EngineRun()
    start = time.perf_counter()
    try:
        with client.stream("POST", "/v1/completions", json=body, timeout=600.0) as response:
            if response.status_code != 200:
                response.read()
                run.error = f"HTTP {response.status_code}: {response.text[:200]}"
                run.status = response.status_code
                return run
            read_stream(json_chunks(response.iter_lines()), start, run)
        run.ok = run.has_usage or not require_usage
        if not run.ok:
            run.error = "the stream carried no usage (stream_options.include_usage)"
    except (httpx.HTTPError, StreamError) as exc:  # an error event or a chunk that is no JSON object
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def run_vllm_benchmark(
    *,
    url: str,
    policy: str,
    requests: Sequence[Any],
    workload: dict[str, Any],
    tokens_per_block: int = 16,
    max_output_tokens: int = 16,
    time_scale: float = 0.0,
    concurrency: int = 8,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Replay `requests` through the vLLM server at `url`; one row for the policy it runs.

    Args:
        url: The server's base URL, e.g. http://127.0.0.1:8000.
        policy: The label of the policy the server was started with (for the row).
        requests: `SimRequest`s (arrival_s, block_hashes, output_len).
        workload: The workload's description for the JSON output.

    Raises:
        VLLMBenchmarkError: No vLLM server answers at `url`, or it reports no prefix-cache counters.
    """
    with httpx.Client(base_url=url.rstrip("/"), timeout=30.0) as client:
        models = _get(client, "/v1/models").json().get("data") or []
        if not models:
            raise VLLMBenchmarkError(f"vLLM at {url} serves no model")
        model = str(models[0]["id"])
        hits0, queries0 = prefix_cache_counters(_get(client, "/metrics").text)

        def send(req: Any) -> EngineRun:
            body = {
                "model": model,
                "prompt": prompt_tokens(req.block_hashes, tokens_per_block),
                "max_tokens": max(1, min(int(req.output_len), max_output_tokens)),
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            return stream_http_completion(client, body)

        runs, wall = replay_requests(
            requests, send, time_scale=time_scale, concurrency=concurrency, tick=tick
        )
        hits1, queries1 = prefix_cache_counters(_get(client, "/metrics").text)
    lookups = queries1 - queries0
    row = {
        "policy": policy,
        "engine": "vllm",
        "model": model,
        "hit_rate": (hits1 - hits0) / lookups if lookups else 0.0,
        "prefix_cache_queries_tokens": int(lookups),
        "prefix_cache_hits_tokens": int(hits1 - hits0),
        **latency_figures(runs, wall),
    }
    errors = sorted({r.error for r in runs if r.error})
    if errors:
        row["errors"] = errors[:5]
    return {"workload": workload, "mode": "engine", "engine": "vllm", "url": url, "results": [row]}
