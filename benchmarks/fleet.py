"""A real router in front of real sage engines: the fleet's prefix hit ratio by routing policy.

Starts N sage engines on 127.0.0.1 (TCP, no API key: loopback only), then for each router
(``sglang:cache_aware``, ``sglang:round_robin``, ``vllm:kv_aware`` ...) starts that router in
front of them, flushes every engine's prefix cache through it, replays the same multi-turn chats
through it (each turn sends the whole conversation so far, as a chat client does) and reads the
fleet's prefix hit ratio from the engines' own counters (their ``/metrics``: prompt tokens
served from cache / prompt tokens looked up, summed over the engines, by the arithmetic of
``sage llm benchmark --engine-url ROUTER --worker-url ...``). With ``--trace FILE`` it replays a
trace instead, through that command's own replay. Prints one row per router and the machine;
stops everything it started, also on Ctrl-C or an error.

The routers live in venvs of their own (scripts/integration_venvs.sh sglang-router|vllm-router):

    python benchmarks/fleet.py --engines 4 --chats 200
    python benchmarks/fleet.py --routers sglang:cache_aware,sglang:round_robin,vllm:kv_aware
    python benchmarks/fleet.py --engines 2 --trace mooncake:conversation --requests 200

``vllm:kv_aware`` is vLLM's router subscribed to the engines' KV events (``--kv-events-endpoint``);
on this machine it cannot use them (no tokenizer for the model: docs/routers.md says what it
routes on instead).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(REPO)]
from _machine import machine_line  # noqa: E402

from sage_cli.benchmark.options import EngineKind  # noqa: E402
from sage_cli.benchmark.remote import (  # noqa: E402
    EngineCounters,
    engine_counters,
    fleet_figures,
    run_remote_benchmark,
)

ROUTERS = ("sglang", "vllm")


def router_binary(kind: str) -> Path:
    """The router's program in its venv (scripts/integration_venvs.sh names the venv)."""
    script = REPO / "scripts" / "integration_venvs.sh"
    out = subprocess.run([str(script), f"{kind}-router", "--print-python"], capture_output=True, text=True)
    binary = Path(out.stdout.strip()).parent / f"{kind}-router"
    if out.returncode or not binary.exists():
        raise FileNotFoundError(f"{binary} is missing: run scripts/integration_venvs.sh {kind}-router")
    return binary


WORDS = [
    *[
        "cache",
        "block",
        "prefix",
        "router",
        "engine",
        "token",
        "policy",
        "fleet",
        "replica",
        "request",
        "model",
        "answer",
        "question",
    ],
    *[
        "memory",
        "latency",
        "queue",
        "batch",
        "prompt",
        "system",
        "user",
        "turn",
        "history",
        "context",
        "window",
        "eviction",
        "tier",
    ],
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(method: str, url: str, body: Any = None, timeout: float = 120.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def wait_until(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            if check():
                return
        time.sleep(0.5)
    raise TimeoutError(f"{what} was not ready within {timeout:.0f} s")


# ---- the chats -----------------------------------------------------------------------------------


def make_chats(n: int, turns: int, seed: int, first: int, later: int) -> list[list[str]]:
    """`n` conversations of `turns` user messages: a first message of `first` words unique to
    the chat (under one of 4 system prompts), then `later` words a turn."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    return [[words(first), *(words(later) for _ in range(turns - 1))] for _ in range(n)]


SYSTEMS = [f"You are assistant number {i}. " + " ".join(WORDS[i::4]) for i in range(4)]


def run_chat(url: str, model: str, index: int, messages: list[str], max_tokens: int) -> int:
    """One conversation, turn by turn, through the router; returns the turns answered."""
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEMS[index % len(SYSTEMS)]}]
    answered = 0
    for text in messages:
        history.append({"role": "user", "content": text})
        body = {"model": model, "messages": history, "max_tokens": max_tokens, "temperature": 0}
        out = http("POST", f"{url}/v1/chat/completions", body)
        reply = out["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": reply})
        answered += 1
    return answered


# ---- processes -----------------------------------------------------------------------------------


@dataclass
class Engine:
    port: int
    events_port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> tuple[int, int, int]:
        """(prompt tokens looked up, of which served from cache, requests finished), from the
        engine's JSON views: what the tests hold the Prometheus counters of `counters` against."""
        s = http("GET", f"{self.url}/v1/eviction/stats")
        info = http("GET", f"{self.url}/v1/engine")
        return s["prefix_cache_queries_tokens"], s["prefix_cache_hits_tokens"], info["requests"]["finished"]

    def counters(self) -> EngineCounters:
        """The engine's prefix-cache and finished-request counters from its /metrics, read as
        `sage llm benchmark --engine-url ROUTER --worker-url ...` reads them."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=60) as resp:
            return engine_counters(resp.read().decode(), EngineKind.sage, self.url)


class Fleet:
    """Every process this run started, stopped on exit whatever happens."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the router's workers too
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            with contextlib.suppress(ProcessLookupError):
                self.stop(proc)


def start_engines(fleet: Fleet, n: int, model: str, num_blocks: int | None, home: Path) -> list[Engine]:
    env = {**os.environ, "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    engines = []
    for i in range(n):
        port, events = free_port(), free_port()
        cmd = [sys.executable, "-m", "sage_cli", "llm", "engine", "start", model, "-n", f"fleet{i}"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--insecure-no-api-key"]
        cmd += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}"]
        if num_blocks is not None:
            cmd += ["--num-blocks", str(num_blocks)]
        engines.append(Engine(port, events, fleet.spawn(f"engine{i}", cmd, env)))
    for e in engines:
        wait_until(
            f"engine on port {e.port}",
            lambda e=e: http("GET", f"{e.url}/health")["status"] == "ok",
            600,
            e.proc,
        )
    return engines


def router_command(
    kind: str, policy: str, port: int, engines: list[Engine], block_size: int, model: str
) -> list[str]:
    binary = router_binary(kind)
    cmd = [str(binary), "launch"] if kind == "sglang" else [str(binary)]
    cmd += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--prometheus-port",
        str(free_port()),
    ]
    cmd += ["--worker-urls", *(e.url for e in engines)]
    if kind == "vllm" and policy == "kv_aware":
        for e in engines:
            cmd += ["--kv-event-source", f"{e.url}=tcp://127.0.0.1:{e.events_port}"]
        cmd += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
    return cmd


# ---- one row -------------------------------------------------------------------------------------


@dataclass
class Row:
    router: str
    requests: int
    hit_ratio: float
    served: list[int]
    spread: float
    seconds: float


def replay(
    fleet: Fleet, router: str, engines: list[Engine], chats: list[list[str]], args: argparse.Namespace
) -> Row:
    kind, _, policy = router.partition(":")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = fleet.spawn(
        f"router-{kind}-{policy}", router_command(kind, policy, port, engines, args.block_size, args.model)
    )
    try:
        wait_until(f"router {router}", lambda: len(http("GET", f"{url}/v1/models")["data"]) > 0, 120, proc)
        if args.trace is not None:
            return replay_trace(router, url, engines, args)
        for e in engines:  # every engine starts cold (the router's own /flush_cache is SGLang's only)
            http("POST", f"{e.url}/flush_cache")
        before = [e.counters() for e in engines]
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            futures = [
                pool.submit(run_chat, url, args.model, i, c, args.max_tokens) for i, c in enumerate(chats)
            ]
            answered = sum(f.result() for f in futures)
        seconds = time.perf_counter() - start
        after = [e.counters() for e in engines]
    finally:
        fleet.stop(proc)
    # The CLI's arithmetic (sage_cli.benchmark.remote): one implementation of the fleet's figures.
    figures = fleet_figures([e.url for e in engines], before, after)
    served = [w["requests_served"] for w in figures["workers"]]
    return Row(router, answered, figures["hit_rate"], served, figures["load_spread"] or 0.0, seconds)


def replay_trace(router: str, url: str, engines: list[Engine], args: argparse.Namespace) -> Row:
    """--trace: the trace through the router by `sage llm benchmark --mode engine --engine-url
    ROUTER --worker-url ...`'s own replay (every engine swapped to --policy and reset first)."""
    from engine_adapter.sim.benchmark import build_workload
    from engine_adapter.sim.shipped_traces import is_trace_name, shipped_trace

    trace, trace_format = args.trace, None
    if not trace.exists() and is_trace_name(str(trace)):  # mooncake:conversation ...
        trace, shipped = shipped_trace(str(trace))
        trace_format = shipped.trace_format
    built = build_workload(trace=trace, trace_format=trace_format, requests=args.requests)
    result = run_remote_benchmark(
        url=url,
        kind=EngineKind.sage,
        workers=[e.url for e in engines],
        policies=[args.policy],
        requests=built.requests,
        workload=built.describe(),
        max_output_tokens=args.max_tokens,
        concurrency=args.concurrency,
    )
    (row,) = result["results"]
    served = [w["requests_served"] for w in row["workers"]]
    answered = row["requests"] - row["failed"]
    return Row(router, answered, row["hit_rate"], served, row["load_spread"] or 0.0, row["wall_s"])


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    if args.trace is not None:
        first = f", its first {args.requests} requests" if args.requests else ""
        print(
            f"# {args.engines} x {args.model} engines, {args.trace.name}{first}, policy {args.policy}", end=""
        )
        print(f", max_tokens {args.max_tokens}")
    else:
        print(f"# {args.engines} x {args.model} engines, {args.chats} chats x {args.turns} turns", end="")
        print(f" ({args.first_words} then {args.turn_words} words), max_tokens {args.max_tokens}")
    print(f"{'router':<22} {'requests':>8} {'hit ratio':>9} {'spread':>6} {'seconds':>8}  served per engine")
    for r in rows:
        figures = f"{r.requests:>8} {r.hit_ratio:>9.3f} {r.spread:>6.2f} {r.seconds:>8.1f}"
        print(f"{r.router:<22} {figures}  {r.served}")
    base = next((r for r in rows if r.router.endswith("round_robin")), None)
    for r in rows:
        if base is not None and r is not base and base.hit_ratio:
            print(f"{r.router}: {r.hit_ratio / base.hit_ratio:.2f}x {base.router}'s hit ratio")
    print(machine_line())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--model", default="sage-tiny", help="sage-tiny or smollm2-135m")
    p.add_argument("--routers", default="sglang:cache_aware,sglang:round_robin")
    p.add_argument("--chats", type=int, default=200)
    p.add_argument("--turns", type=int, default=3)
    # sage-tiny's tokenizer is byte-level: a word is ~7 tokens
    p.add_argument("--first-words", type=int, default=30, help="the first message's words")
    p.add_argument("--turn-words", type=int, default=8, help="each later message's words")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument(
        "--num-blocks", type=int, default=None, help="each engine's KV pool (default: the engine's)"
    )
    p.add_argument("--block-size", type=int, default=16, help="the engines' (for the KV-event router)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="replay this trace (a file, or mooncake:conversation ...) instead of the chats",
    )
    p.add_argument("--requests", type=int, default=None, help="with --trace: its first N requests")
    p.add_argument("--policy", default="lru", help="with --trace: the engines' eviction policy")
    args = p.parse_args(argv)
    for name in ("engines", "chats", "turns", "max_tokens", "concurrency", "first_words", "turn_words"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.requests is not None and args.requests < 1:
        p.error("--requests must be at least 1")
    for router in args.routers.split(","):
        kind, _, policy = router.partition(":")
        if kind not in ROUTERS or not policy:
            p.error(f"--routers: {router!r} is not KIND:POLICY with KIND sglang or vllm")
    return args


@contextlib.contextmanager
def terminated_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the `finally` that stops the fleet runs."""

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chats = make_chats(args.chats, args.turns, args.seed, args.first_words, args.turn_words)
    work = Path(tempfile.mkdtemp(prefix="sage-fleet-"))
    fleet = Fleet(work)
    rows: list[Row] = []
    try:
        with terminated_on_sigterm():
            engines = start_engines(fleet, args.engines, args.model, args.num_blocks, work / "home")
            for router in args.routers.split(","):
                rows.append(replay(fleet, router, engines, chats, args))
                print(f"{router}: done in {rows[-1].seconds:.1f} s", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: stopping the fleet", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, FileNotFoundError, urllib.error.URLError) as exc:
        print(f"fleet.py: {exc} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        fleet.stop_all()
    print_table(rows, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
