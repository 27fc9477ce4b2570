"""What the engine modes share: the workload they replay, prompts made of its blocks, the replay
from client threads, the latency figures of each row, and temporary engines.

Prompts are made from the workload's block ids: each block id becomes `tokens_per_block` token
ids drawn from a generator seeded with the id, so requests that share blocks share a token
prefix exactly as they share blocks in the trace. The sage engine (`engine`), a vLLM server
(`vllm`) and the colocation engines (`colocation_engine`) differ only in how one request is sent.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sage_cli.client import ControlClient, SageClientError
from sage_cli.spawn import TemporaryEngine
from sage_eviction.metrics import percentile

if TYPE_CHECKING:
    from sage_cli.benchmark.checks import WorkloadSource

__all__ = [
    "EngineRun",
    "engine_workload",
    "latency_figures",
    "prompt_tokens",
    "quantile",
    "read_stream",
    "replay_requests",
    "start_temporary_engine",
    "timed_completion",
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
    """One request's timings and token counts.

    `completion_tokens` and `prompt_tokens` come from the stream's `usage` chunk (or, for a
    server that sends none, from the tokenizer: `count_tokens`), never from its chunks: a chunk
    carries no token when the detokenizer holds back an incomplete character, and the last one
    carries only the usage.
    """

    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    status: int = 0  # the HTTP status of a refused request (429: colocation's admission)
    last_token_s: float | None = None  # from the request's start to its last chunk with text
    has_usage: bool = False  # the stream ended with a usage chunk
    text: str = ""  # the completion's text, for a tokenizer when the server sends no usage

    def count_tokens(self, completion_tokens: int) -> None:
        """Set the output tokens, and the time per output token after the first:
        (last token - first token) / (tokens - 1), as vLLM's serving benchmark defines TPOT."""
        self.completion_tokens = completion_tokens
        first, last = self.ttft_s, self.last_token_s
        if first is None or last is None or completion_tokens < 2:
            self.tpot_s = []
        else:
            self.tpot_s = [(last - first) / (completion_tokens - 1)]


def read_stream(chunks: Iterable[Mapping[str, Any]], start: float, run: EngineRun) -> None:
    """Fill `run` from the JSON chunks of one streamed completion begun at `start`
    (`time.perf_counter()`): TTFT at the first chunk with text, the time of the last, the text,
    and the token counts of the usage chunk (asked for with ``stream_options.include_usage``).

    The one reader of completion streams of the engine benchmarks (sage over its socket, vLLM
    and the peers of `benchmarks/peers.py` over HTTP); the caller catches its transport's errors.
    """
    parts: list[str] = []
    for chunk in chunks:
        usage = chunk.get("usage")
        if usage:
            run.has_usage = True
            run.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            run.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            run.cached_tokens = int(details.get("cached_tokens") or 0)
        for choice in chunk.get("choices") or ():
            text = choice.get("text")
            if text:
                now = time.perf_counter() - start
                if run.ttft_s is None:
                    run.ttft_s = now
                run.last_token_s = now
                parts.append(str(text))
    run.text = "".join(parts)
    run.count_tokens(run.completion_tokens)


def timed_completion(client: ControlClient, body: dict[str, Any]) -> EngineRun:
    """One streamed request to the engine behind `client`: its time to first token, time per
    output token and usage (`read_stream`); a stream without usage is a failed request.

    Callers ask for the usage (``"stream_options": {"include_usage": true}``): the engine's
    stream carries it only then.
    """
    run = EngineRun()
    try:
        read_stream(client.stream_completion(body, timeout=600.0), time.perf_counter(), run)
        run.ok = run.has_usage
        if not run.ok:
            run.error = "the stream carried no usage: ask for it with stream_options.include_usage"
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
        "output_tokens": tokens,
        "failed": len(runs) - len(ok),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "tpot_p50_s": quantile(tpots, 0.5),
        "tpot_p99_s": quantile(tpots, 0.99),
        "throughput_tok_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "wall_s": wall,
    }


def quantile(values: list[float], q: float) -> float | None:
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




def engine_workload(source: WorkloadSource) -> Any:
    """The workload an engine mode replays: the trace, or a generated one (64 requests unless
    --requests says otherwise, since every request is a real completion)."""
    from engine_adapter.sim.benchmark import build_workload

    requests = source.requests if source.requests is not None else (None if source.trace is not None else 64)
    return build_workload(
        trace=source.trace,
        trace_format=source.trace_format,
        workload=source.workload,
        requests=requests,
        tenants=source.tenants,
        seed=source.seed,
        duration=source.duration,
    )
