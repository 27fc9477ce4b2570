"""`sage llm benchmark --mode engine --engine-url URL`: a workload through engines over HTTP.

One server (a sage engine on TCP, or a vLLM OpenAI server: ``--engine-kind sage|vllm``), or a
router in front of several (SGLang's or vLLM's router; ``--worker-url`` names each engine behind
it). Requests go to ``--engine-url``; the prefix-cache figures come from the engines themselves:
each worker's Prometheus ``/metrics`` is read before and after the replay, and the change of its
prefix-cache counters (tokens looked up, tokens served from cache) and of its finished requests
is summed over the fleet. A router keeps no such counters, so a router URL needs its workers.

Per kind, the counters each engine exports (`METRICS`): sage's ``sage:prefix_cache_*`` and
``sage:request_success`` (engine_adapter/serving/metrics.py), vLLM's ``vllm:prefix_cache_*`` and
``vllm:request_success``. A sage fleet runs each policy of ``--eviction-policies`` in turn: every
worker is hot-swapped to it and its prefix cache reset (as the socket engine mode does), so no
row inherits another's blocks. vLLM cannot switch its policy at run time: one run measures the
policy its servers were started with (``SAGE_VLLM_GPU_POLICY``, or vLLM's own LRU).

Prompts are the same token ids as the socket engine benchmark's (`replay.prompt_tokens`), so
the modes are comparable; through a router they go as text, one letter per token id
(`prompt_text`), because the routers forward a completion's prompt only as a string or strings
(SGLang's router refuses token ids with a 422) and route on its text. A byte-level tokenizer
(sage-tiny's) turns each letter back into one token, so prompts share as many tokens as the
workload's blocks give them (block edges move by the BOS token); a subword tokenizer keeps the
shared prefixes, not their lengths. The CLI imports no engine: only httpx and prometheus_client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    "METRICS",
    "EngineCounters",
    "RemoteBenchmarkError",
    "engine_counters",
    "fleet_figures",
    "prompt_text",
    "remote_policies",
    "run_on_remote",
    "run_remote_benchmark",
    "stream_http_completion",
]


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The Prometheus families (as the text parser names them: no ``_total``) an engine kind
    exports: prompt tokens looked up in its prefix cache, of those served from it, and requests
    finished."""

    queries: str
    hits: str
    served: str


# Both engines prefix their families with their own name (vLLM's habit, which sage follows).
METRICS: dict[EngineKind, MetricNames] = {
    kind: MetricNames(
        f"{kind.value}:prefix_cache_queries",
        f"{kind.value}:prefix_cache_hits",
        f"{kind.value}:request_success",
    )
    for kind in EngineKind
}
_LABEL = {EngineKind.sage: "the sage engine", EngineKind.vllm: "vLLM"}


class RemoteBenchmarkError(RuntimeError):
    """A URL does not answer as the engine (or router) it was named as, or its metrics lack a counter."""


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """One engine's cumulative counters at one moment (tokens, tokens, requests)."""

    queries: float
    hits: float
    served: float

    def __sub__(self, before: EngineCounters) -> EngineCounters:
        return EngineCounters(
            self.queries - before.queries, self.hits - before.hits, self.served - before.served
        )


def remote_policies(args: BenchmarkArgs) -> list[str]:
    """The policies of an ``--engine-url`` run, after its options are checked: for vLLM the one
    its servers run (a sage policy's name, or ``vllm`` for its own), for sage those to swap in.

    Raises:
        CLIUsageError: Not engine mode, a missing or non-HTTP URL, workers without a router URL,
            more than one vLLM policy, or a ``--capacity-*`` (the engines' pools are their own).
    """
    kind, url, workers = args.engine_kind, args.engine_url, args.worker_url or []
    if args.mode is not Mode.engine:
        raise CLIUsageError("--engine-url, --worker-url and --engine-kind vllm go with --mode engine")
    if url is None:
        if workers:
            raise CLIUsageError(
                "--worker-url names the engines behind a router: give the router's --engine-url"
            )
        raise CLIUsageError("--engine-kind vllm needs --engine-url URL (the running vLLM OpenAI server)")
    for flag, given in (("--engine-url", url), *(("--worker-url", w) for w in workers)):
        if not given.startswith(("http://", "https://")):
            raise CLIUsageError(f"{flag} {given!r}: give an http:// or https:// URL")
    if len(set(workers)) != len(workers):
        raise CLIUsageError("--worker-url: each engine once (a repeated one would count its counters twice)")
    if args.capacity_blocks is not None or args.capacity_ratio is not None:
        pool = "--num-gpu-blocks-override" if kind is EngineKind.vllm else "--num-blocks"
        raise CLIUsageError(f"the engines' pools are their own ({pool} at their start): drop --capacity-*")
    if kind is EngineKind.sage:
        text = "lru,lfu,arc" if args.eviction_policies is None else args.eviction_policies
        return parse_policies(text, args.mode.value)
    label = (args.eviction_policies or "vllm").strip()
    if "," in label:
        raise CLIUsageError(
            "vLLM runs one eviction policy per server start: give the one it runs in --eviction-policies "
            "(a sage policy name, or 'vllm' for its own), then restart it with the next one "
            "(SAGE_VLLM_GPU_POLICY=name) and run again"
        )
    return [label] if label == "vllm" else parse_policies(label, args.mode.value)


def run_on_remote(args: BenchmarkArgs, plan: BenchmarkPlan, url: str) -> None:
    """Replay the workload through ``--engine-url``, measured on ``--worker-url`` (or on the URL
    itself); save and print one row per policy."""
    from rich.progress import Progress

    built = engine_workload(plan.source)
    with Progress(transient=True) as bar:

        def progress(policy: str) -> Callable[[], None]:
            task = bar.add_task(f"{policy} via {url}", total=len(built.requests))
            return lambda: bar.advance(task)

        try:
            result = run_remote_benchmark(
                url=url,
                kind=args.engine_kind,
                workers=list(args.worker_url or []),
                policies=plan.policies,
                requests=built.requests,
                workload=built.describe(),
                max_output_tokens=args.max_output_tokens,
                time_scale=args.time_scale,
                concurrency=args.concurrency,
                progress=progress,
            )
        except RemoteBenchmarkError as exc:
            raise CLIError(str(exc)) from None
    save_and_show(result, args.output, args.json_out)


def engine_counters(metrics_text: str, kind: EngineKind, where: str = "the engine") -> EngineCounters:
    """An engine's prefix-cache and finished-request counters from its ``/metrics`` text, summed
    over every label (vLLM labels by engine and model, sage and vLLM by finish reason).

    Raises:
        RemoteBenchmarkError: The text has no prefix-cache counters of that kind (`where` names
            the URL in the message: a router, or an engine of the other kind, answers so).
    """
    from prometheus_client.parser import text_string_to_metric_families

    names = METRICS[kind]
    totals = {names.queries: 0.0, names.hits: 0.0, names.served: 0.0}
    found: set[str] = set()
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:  # an HTML or JSON page: not Prometheus text
        families = []
    for family in families:
        if family.name in totals:
            found.add(family.name)
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    missing = [n for n in (names.queries, names.hits) if n not in found]
    if missing:
        raise RemoteBenchmarkError(
            f"{where}'s /metrics has no {' or '.join(missing)}: not a {kind.value} engine with prefix "
            "caching (--engine-kind names the engines' kind; a router's URL needs --worker-url for each)"
        )
    return EngineCounters(totals[names.queries], totals[names.hits], totals[names.served])


def fleet_figures(
    workers: Sequence[str], before: Sequence[EngineCounters], after: Sequence[EngineCounters]
) -> dict[str, Any]:
    """The fleet's prefix hit ratio (tokens served from cache / tokens looked up, summed over the
    engines), each engine's counts and share of the requests served, and the load spread (the
    busiest engine's requests over the mean: 1.0 is an even spread)."""
    deltas = [a - b for a, b in zip(after, before, strict=True)]
    queries = sum(d.queries for d in deltas)
    hits = sum(d.hits for d in deltas)
    served = sum(d.served for d in deltas)
    mean = served / len(deltas) if deltas else 0.0
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_queries_tokens": int(queries),
        "prefix_cache_hits_tokens": int(hits),
        "replicas": len(deltas),
        "load_spread": max(d.served for d in deltas) / mean if mean else None,
        "served": "/".join(str(int(d.served)) for d in deltas),
        "workers": [
            {
                "url": url,
                "requests_served": int(d.served),
                "served_share": d.served / served if served else 0.0,
                "prefix_cache_queries_tokens": int(d.queries),
                "prefix_cache_hits_tokens": int(d.hits),
            }
            for url, d in zip(workers, deltas, strict=True)
        ],
    }


def _get(client: httpx.Client, path: str, what: str) -> httpx.Response:
    try:
        response = client.get(path)
    except httpx.HTTPError as exc:
        raise RemoteBenchmarkError(f"cannot reach {what} at {client.base_url}: {exc}") from None
    if response.status_code != 200:
        raise RemoteBenchmarkError(f"{what} at {client.base_url}{path}: HTTP {response.status_code}")
    return response


def _read_counters(client: httpx.Client, kind: EngineKind, what: str) -> EngineCounters:
    """An engine's counters from its ``/metrics``; a page that is not there is named as what it
    most likely is (a router, which serves none on its API port)."""
    try:
        response = client.get("/metrics")
    except httpx.HTTPError as exc:
        raise RemoteBenchmarkError(f"cannot reach {what} at {client.base_url}: {exc}") from None
    where = str(client.base_url).rstrip("/")
    if response.status_code != 200:
        raise RemoteBenchmarkError(
            f"{where}/metrics: HTTP {response.status_code}: not a {kind.value} engine's metrics "
            "(a router's URL needs --worker-url for each engine behind it)"
        )
    return engine_counters(response.text, kind, where)


def _served_model(client: httpx.Client, what: str) -> str:
    """The first model ``GET /v1/models`` lists (each request names it: the routers want one)."""
    models = _get(client, "/v1/models", what).json().get("data") or []
    if not models:
        raise RemoteBenchmarkError(f"{what} at {client.base_url} serves no model")
    return str(models[0]["id"])


def _swap_and_reset(engines: Sequence[httpx.Client], policy: str) -> None:
    """Every sage worker to `policy`, its prefix cache emptied: the row starts cold everywhere."""
    for engine in engines:
        _send(engine, "PUT", "/v1/eviction/policy", {"policy": policy})
        _send(engine, "POST", "/v1/cache/reset")


def _send(client: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None) -> None:
    """A control call on a sage worker (swap, reset); its refusal is the benchmark's error."""
    try:
        response = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise RemoteBenchmarkError(f"cannot reach the sage engine at {client.base_url}: {exc}") from None
    if response.status_code != 200:
        raise RemoteBenchmarkError(
            f"the sage engine at {client.base_url}{path}: HTTP {response.status_code} {response.text[:200]}"
        )


def stream_http_completion(
    client: httpx.Client, body: dict[str, Any], *, require_usage: bool = True
) -> EngineRun:
    """One streamed ``POST /v1/completions`` to an OpenAI server over HTTP (a sage or vLLM engine,
    a router, or a peer of `benchmarks/peers.py`), read by `replay.read_stream`: TTFT, TPOT, text
    and usage. The run is ok when the stream ended, and, with `require_usage`, carried a usage
    chunk to count its tokens (without, the caller counts them: `EngineRun.count_tokens`)."""
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


def run_remote_benchmark(
    *,
    url: str,
    kind: EngineKind,
    workers: Sequence[str],
    policies: Sequence[str],
    requests: Sequence[Any],
    workload: dict[str, Any],
    tokens_per_block: int = 16,
    max_output_tokens: int = 16,
    time_scale: float = 0.0,
    concurrency: int = 8,
    progress: Callable[[str], Callable[[], None]] = lambda policy: lambda: None,
) -> dict[str, Any]:
    """Replay `requests` through `url` once per policy; one row each, measured on `workers`.

    Args:
        url: Where requests go: an engine, or a router in front of `workers`.
        kind: What the engines are (which counters they export; sage's can be swapped and reset).
        workers: The engines behind a router; empty when `url` is itself the engine.
        policies: For sage, each swapped into every worker in turn; for vLLM, the one label.
        requests: `SimRequest`s (arrival_s, block_hashes, output_len).
        workload: The workload's description for the JSON output.
        progress: Called with each policy to get a tick callback per request.

    Raises:
        RemoteBenchmarkError: A URL does not answer, serves no model, or lacks `kind`'s counters.
    """
    targets = list(workers) or [url]
    what = _LABEL[kind] if not workers else "the router"
    with httpx.Client(base_url=url.rstrip("/"), timeout=30.0) as client:
        model = _served_model(client, what)
        engines = [httpx.Client(base_url=t.rstrip("/"), timeout=60.0) for t in targets]
        try:
            label = "a worker" if workers else _LABEL[kind]

            def read() -> list[EngineCounters]:
                return [_read_counters(e, kind, label) for e in engines]

            read()  # every engine answers with its counters before anything is swapped or sent

            def send(req: Any) -> EngineRun:
                body = _completion_body(req, model, tokens_per_block, max_output_tokens, text=bool(workers))
                return stream_http_completion(client, body)

            rows = []
            for policy in policies:
                if kind is EngineKind.sage:
                    _swap_and_reset(engines, policy)
                before = read()
                runs, wall = replay_requests(
                    requests, send, time_scale=time_scale, concurrency=concurrency, tick=progress(policy)
                )
                rows.append(
                    _row(policy, kind, model, url, runs, wall, fleet_figures(targets, before, read()))
                )
        finally:
            for engine in engines:
                engine.close()
    return {"workload": workload, "mode": "engine", "engine": kind.value, "url": url, "results": rows}


def prompt_text(block_keys: Sequence[Any], tokens_per_block: int) -> str:
    """The prompt of `prompt_tokens` as text, one lowercase letter per token id: what a router
    forwards. Equal keys give equal text, so prompts share a text prefix as they share blocks."""
    return "".join(chr(ord("a") + token % 26) for token in prompt_tokens(block_keys, tokens_per_block))


def _completion_body(
    req: Any, model: str, tokens_per_block: int, max_output_tokens: int, *, text: bool
) -> dict[str, Any]:
    make_prompt = prompt_text if text else prompt_tokens
    return {
        "model": model,
        "prompt": make_prompt(req.block_hashes, tokens_per_block),
        "max_tokens": max(1, min(int(req.output_len), max_output_tokens)),
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _row(
    policy: str,
    kind: EngineKind,
    model: str,
    url: str,
    runs: list[EngineRun],
    wall: float,
    fleet: dict[str, Any],
) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": policy, "engine": kind.value, "model": model}
    if fleet["replicas"] > 1 or fleet["workers"][0]["url"] != url:
        row["router"] = url  # the fleet table: routed rows side by side
    row.update(fleet)
    row.update(latency_figures(runs, wall))
    errors = sorted({r.error for r in runs if r.error})
    if errors:
        row["errors"] = errors[:5]
    return row
