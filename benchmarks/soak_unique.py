"""The unique-prompt soak (`benchmarks/soak.py --unique-prompts`): memory must not grow with the
requests served.

Every request is a new prompt (mixed lengths; a share of them are turns of multi-turn sessions
that end after a few turns), so every request brings new block keys: a structure that keeps one
record per request, sequence, prompt or block (issue 49) grows here, where the classic soak,
cycling a fixed set of prompts, cannot see it. The RSS is sampled every ``--sample-every``
requests and a least-squares line is fitted over the samples after the warm-up: the first
``--warm-up-share`` of the requests (default 20 %) or the first ``--warm-up-min`` (default 10,000
requests for the engine, 0 keys for a bridge), whichever is more: the pool's pages, allocator
arenas and the bounded windows fill there. For the engine it also lasts until the engine has
evicted as many blocks as its fullest eviction-keyed window holds (the event ring of 10,000
events, the re-prefill window of 8,192 keys or more), read from its own `/v1/eviction/stats` at
each sample: those windows fill by evictions, not requests, and a model whose tokenizer packs more
text per token (SmolLM2's against sage-tiny's bytes) evicts fewer blocks per request. A run that
never gets there is not judged (it FAILS and says why); ``--long-share`` and ``--long-words``
make its prompts longer. The verdict says which ended the warm-up. It FAILS when its slope
reaches ``--max-slope-mib`` MiB per 10,000 requests (default 1.0). A fitted slope, not a
before/after pair: one late spike or one early dip does not decide it.

Two targets:
- the engine (`--target engine`, default): a real engine process (`sage-tiny`, or
  ``--model smollm2-135m``), ``--clients`` concurrent clients over its Unix socket, ``--threads``
  torch threads; its RSS is read from /proc;
- a policy bridge (`--target lmcache` or `--target vllm`): the integration's class (LMCache's
  in-process `CachePolicy`, vLLM's KV-offload `CachePolicy`) driven in this process by its own
  event replay (puts of new chunk keys, hits on recent ones, evictions when full), ``--keys``
  unique keys (10^7 for the stated target); this process's RSS is sampled every
  ``--sample-every`` keys and the slope is in MiB per 10^6 keys (limit 1.0: an unbounded set of
  evicted keys costs 16 to 80 MiB per 10^6).

    python benchmarks/soak.py --unique-prompts --requests 100000          # sage-tiny, 2 threads
    python benchmarks/soak.py --unique-prompts --requests 10000 --model smollm2-135m \
        --warm-up-min 4096 --long-share 0.5 --long-words 32,96
    python benchmarks/soak.py --unique-prompts --target lmcache --keys 10000000
    python benchmarks/soak.py --unique-prompts --target vllm --keys 10000000
    python benchmarks/soak.py --unique-prompts --requests 2000 --json     # a quick look
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from _machine import machine_line

# The engine's warm-up at least: the event ring (10,000 events) and the re-prefill window
# (max(8192, 4 x pool blocks) keys) fill within it; a 32,000-request run's RSS was on its plateau
# by 10,000 requests (docs/benchmarks/scripts.md).
ENGINE_WARM_UP_MIN = 10_000

# The engine's eviction-event ring (engine_adapter/serving/engine.py, `ring_size`): one event per
# evicted block, so it is full once the engine has evicted this many blocks.
EVENT_RING = 10_000

WORDS = [
    *("river", "stone", "cloud", "ember", "lantern", "orchard", "harbor", "meadow", "signal", "copper"),
    *("violet", "thunder", "canyon", "falcon", "glacier", "ribbon", "saffron", "timber", "quartz", "willow"),
]


def rss_mib(pid: int) -> float:
    """A process's resident memory in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"no VmRSS for pid {pid}")


def fitted_slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x (0.0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def judge(
    samples: list[tuple[int, float]],
    total: int,
    share: float,
    limit: float,
    per: int,
    minimum: int = 0,
    filled_at: int | None = 0,
) -> dict[str, Any]:
    """The verdict over `samples` ((count, RSS MiB)): the slope after the warm-up, in MiB per
    `per` counted (requests or keys), against `limit`. The warm-up ends at the latest of the
    first `share` of `total`, the first `minimum` counted and `filled_at`, the count at which the
    engine's stated windows had filled (None: they were still filling at the end, so nothing is
    fitted and the run is not judged within)."""
    ends = {f"share {share:g}": share * total, f"minimum {minimum:,}": minimum}
    if filled_at is None:
        ends["windows still filling at the end"] = total + 1
    elif filled_at:
        ends[f"windows filled at {filled_at:,}"] = filled_at
    warm_up_by, warm_up_end = max(ends.items(), key=lambda item: item[1])
    after = [(x, y) for x, y in samples if x >= warm_up_end]
    slope = fitted_slope(after) * per
    return {
        "warm_up_end": round(min(warm_up_end, total)),
        "warm_up_by": warm_up_by,
        "samples_fitted": len(after),
        "per": per,
        "slope_mib": round(slope, 3),
        "max_slope_mib": limit,
        "rss_after_warm_up_mib": round(after[0][1], 1) if after else None,
        "rss_end_mib": round(samples[-1][1], 1) if samples else None,
        "within": len(after) >= 3 and slope < limit,
    }


def windows_filled_at(evictions: list[tuple[int, int]], window: int) -> int | None:
    """The first sampled count at which the engine had evicted `window` blocks (its event ring
    and its re-prefill window then hold all they ever will), or None when it never did."""
    return next((count for count, evicted in evictions if evicted >= window), None)


# --------------------------------------------------------------------------------------------
# The engine


Turn = tuple[int, int] | None
"""A request's session and the turns it has left after this one (None: a one-off prompt)."""


@dataclass
class Prompts:
    """Unique prompts: fresh ones of mixed length (mostly short: 1 to 3 words, 20 % 4 to 24),
    and turns of sessions that end.

    A session keeps its transcript on the client only while it lasts (2 to 5 turns), so this
    side holds at most `max_sessions` transcripts, whatever the number of requests."""

    rng: random.Random
    session_share: float = 0.3
    max_sessions: int = 16
    long_share: float = 0.2
    long_words: tuple[int, int] = (4, 24)
    sessions: dict[int, tuple[str, int]] = field(default_factory=dict)  # id -> (transcript, turns left)
    counter: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _text(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def next(self) -> tuple[str, Turn]:
        """A new prompt and its session's turn."""
        with self.lock:
            self.counter += 1
            n = self.counter
            if self.sessions and self.rng.random() < self.session_share:
                sid = self.rng.choice(list(self.sessions))
                transcript, left = self.sessions.pop(sid)  # one turn at a time per session
                return f"{transcript}\nuser {n}: {self._text(1, 4)}", (sid, left - 1)
            long = self.rng.random() < self.long_share
            prompt = f"request {n}: {self._text(*self.long_words) if long else self._text(1, 3)}"
            if len(self.sessions) < self.max_sessions and self.rng.random() < self.session_share:
                return prompt, (n, self.rng.randint(1, 4))  # a session's first turn
            return prompt, None

    def answered(self, prompt: str, answer: str, turn: Turn) -> None:
        """The session goes on with the answer in its transcript; its last turn ends it."""
        if turn is not None and turn[1] > 0:
            with self.lock:
                self.sessions[turn[0]] = (f"{prompt}\nassistant: {answer}", turn[1])


@dataclass
class EngineRun:
    """The shared state of the clients of one engine run."""

    socket: str
    pid: int
    total: int
    sample_every: int
    prompts: Prompts
    timeout: float
    done: int = 0
    failures: list[str] = field(default_factory=list)
    samples: list[tuple[int, float]] = field(default_factory=list)
    evictions: list[tuple[int, int]] = field(default_factory=list)  # (requests, blocks evicted)
    eviction_calls: list[tuple[int, int]] = field(default_factory=list)  # (requests, decisions)
    re_prefill_window: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        """Claim one request of the total; False when all are claimed or a failure stopped it."""
        with self.lock:
            if self.done >= self.total or len(self.failures) >= 5:
                return False
            self.done += 1
            if self.done % self.sample_every == 0:
                self.sample()
            return True

    def sample(self) -> None:
        """The engine's RSS and how much it has evicted (its windows fill by evictions)."""
        self.samples.append((self.done, rss_mib(self.pid)))
        transport = httpx.HTTPTransport(uds=self.socket)
        with httpx.Client(transport=transport, base_url="http://sage", timeout=self.timeout) as http:
            stats = http.get("/v1/eviction/stats").json()
        self.evictions.append((self.done, stats["total_evictions"]))
        self.eviction_calls.append((self.done, stats["eviction_calls"]))
        self.re_prefill_window = stats["re_prefill_window"]
        line = f"{self.done} requests: RSS {self.samples[-1][1]:.1f} MiB, {stats['total_evictions']} evicted"
        print(line, file=sys.stderr, flush=True)


def _client(run: EngineRun, seed: int) -> None:
    rng = random.Random(seed)
    transport = httpx.HTTPTransport(uds=run.socket)
    with httpx.Client(transport=transport, base_url="http://sage", timeout=run.timeout) as http:
        while run.take():
            prompt, turn = run.prompts.next()
            body = {"prompt": prompt, "max_tokens": rng.randint(1, 4), "temperature": 0}
            try:
                reply = http.post("/v1/completions", json=body)
            except httpx.HTTPError as exc:
                run.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if reply.status_code != 200:
                run.failures.append(f"{reply.status_code}: {reply.text[:200]}")
                continue
            run.prompts.answered(prompt, reply.json()["choices"][0]["text"], turn)


def engine_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Start an engine, send `args.requests` unique-prompt requests, sample its RSS."""
    from sage_cli.spawn import TemporaryEngine

    config = dict(model=args.model, device=args.device, num_blocks=args.num_blocks, threads=args.threads)
    engine = TemporaryEngine(config, timeout=args.start_timeout)
    try:
        pid = engine.engine.process.pid
        prompts = Prompts(random.Random(args.seed), long_share=args.long_share, long_words=args.long_words)
        run = EngineRun(str(engine.socket), pid, args.requests, args.sample_every, prompts, args.timeout)
        start = time.monotonic()
        clients = [
            threading.Thread(target=_client, args=(run, args.seed * 1000 + i), daemon=True)
            for i in range(args.clients)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        seconds = time.monotonic() - start
    finally:
        engine.stop()
    return {
        "target": "engine",
        "setup": {k: config[k] for k in config}
        | {"clients": args.clients, "requests": args.requests, "long_share": args.long_share}
        | {"long_words": list(args.long_words)},
        "completed": run.done - len(run.failures),
        "failures": run.failures[:5],
        "seconds": round(seconds, 1),
        "samples": run.samples,
        "evictions": run.evictions,
        "eviction_calls": run.eviction_calls,
        "windows": {"event_ring": EVENT_RING, "re_prefill_window": run.re_prefill_window},
        "filled_at": windows_filled_at(run.evictions, max(EVENT_RING, run.re_prefill_window)),
        "unit": "requests",
    }


# --------------------------------------------------------------------------------------------
# The bridges' replays


class _Chunk:
    """What LMCache's and vLLM's caches hold per key, as far as their policies look."""

    __slots__ = ("can_evict", "ref_cnt")

    def __init__(self) -> None:
        self.can_evict = True
        self.ref_cnt = 0


class _OffloadBase:
    """vLLM's `CachePolicy` ABC as far as the mixin calls it (`__init__(cache_capacity)`)."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity


def _lmcache_replay(policy_spec: str, capacity: int) -> tuple[Any, Any]:
    """LMCache's in-process policy and a step that puts one new key (evicting when full)."""
    from sage_eviction.integrations.lmcache import _SageCachePolicy

    policy = type("ReplayLMCachePolicy", (_SageCachePolicy,), {"sage_spec": policy_spec})()
    cache: dict[Any, _Chunk] = policy.init_mutable_mapping()
    recent: list[Any] = []

    def put(key: Any, rng: random.Random) -> None:
        if recent and rng.random() < 0.3:  # a hit on a recent key, as a returning prefix
            hit = recent[rng.randrange(len(recent))]
            if hit in cache:
                policy.update_on_hit(hit, cache)
        while len(cache) >= capacity:
            for victim in policy.get_evict_candidates(cache, 1):
                del cache[victim]
        cache[key] = _Chunk()
        policy.update_on_put(key)
        recent.append(key) if len(recent) < 64 else recent.__setitem__(rng.randrange(64), key)

    return policy, put


def _vllm_replay(policy_spec: str, capacity: int) -> tuple[Any, Any]:
    """vLLM's KV-offload policy and a step that stores one new chunk (evicting when full)."""
    from sage_eviction.integrations.vllm import _SageCachePolicy

    cls = type("ReplayOffloadPolicy", (_SageCachePolicy, _OffloadBase), {"sage_spec": policy_spec})
    policy = cls(capacity)
    recent: list[Any] = []

    def put(key: Any, rng: random.Random) -> None:
        if recent and rng.random() < 0.3:
            hit = recent[rng.randrange(len(recent))]
            if policy.get(hit) is not None:
                policy.touch([hit])
        policy.on_store_miss([key])
        if len(policy.chunks) >= capacity and policy.evict(1, set()) is None:
            raise RuntimeError("the offload policy could not evict a chunk")
        policy.insert(key, _Chunk())
        recent.append(key) if len(recent) < 64 else recent.__setitem__(rng.randrange(64), key)

    return policy, put


def bridge_soak(args: argparse.Namespace) -> dict[str, Any]:
    """Replay `args.keys` unique keys through a bridge; sample this process's RSS."""
    build = _lmcache_replay if args.target == "lmcache" else _vllm_replay
    policy, put = build(args.policy, args.bridge_capacity)
    rng = random.Random(args.seed)
    pid = os.getpid()
    samples: list[tuple[int, float]] = []
    start = time.monotonic()
    for n in range(1, args.keys + 1):
        put(rng.getrandbits(63), rng)  # a new chunk hash each time, as unique prompts bring
        if n % args.sample_every == 0:
            gc.collect(0)
            samples.append((n, rss_mib(pid)))
    held = policy.sage.policy._evicted  # the policy's evicted keys not requested since
    return {
        "target": args.target,
        "setup": {"policy": args.policy, "capacity": args.bridge_capacity, "keys": args.keys},
        "completed": args.keys,
        "failures": [],
        "seconds": round(time.monotonic() - start, 1),
        "samples": samples,
        "unit": "keys",
        "evicted": policy.sage.policy._evictions,
        "evicted_keys_held": None if held is None else len(held),
        "evicted_keys_window": getattr(held, "window", None),
    }


# --------------------------------------------------------------------------------------------
# The command


def _word_range(text: str) -> tuple[int, int]:
    """`LO,HI` with 1 <= LO <= HI."""
    try:
        lo, hi = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LO,HI (two integers)") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= LO <= HI")
    return lo, hi


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--unique-prompts", action="store_true", help="this soak (benchmarks/soak.py's flag)")
    parser.add_argument("--target", choices=("engine", "lmcache", "vllm"), default="engine")
    parser.add_argument("--requests", type=int, default=100_000, help="engine: requests (default 100,000)")
    parser.add_argument("--keys", type=int, default=10_000_000, help="bridge: unique keys (default 10^7)")
    parser.add_argument("--clients", type=int, default=4, help="engine: concurrent clients (default 4)")
    parser.add_argument("--model", default="sage-tiny", help="sage-tiny or smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="engine: torch threads (default 2)")
    parser.add_argument("--num-blocks", type=int, default=256, help="engine: KV pool blocks (default 256)")
    parser.add_argument("--policy", default="lru", help="bridge: the sage policy spec (default lru)")
    parser.add_argument("--bridge-capacity", type=int, default=4096, help="bridge: entries (default 4096)")
    parser.add_argument("--sample-every", type=int, default=0,
                        help="requests (keys) between RSS samples (default: 1/100 of the run)")  # fmt: skip
    parser.add_argument("--warm-up-share", type=float, default=0.2, help="share not fitted (default 0.2)")
    parser.add_argument("--warm-up-min", type=int, default=None,
                        help="requests (keys) not fitted at least, whatever the share (default: 10,000 "
                             "requests for the engine, 0 keys for a bridge)")  # fmt: skip
    parser.add_argument("--max-slope-mib", type=float, default=1.0,
                        help="RSS slope allowed after warm-up, MiB per 10,000 requests or per 10^6 keys "
                             "(default 1.0)")  # fmt: skip
    parser.add_argument("--long-share", type=float, default=0.2,
                        help="engine: share of fresh prompts drawn long (default 0.2)")  # fmt: skip
    parser.add_argument("--long-words", type=_word_range, default=(4, 24),
                        help="engine: LO,HI words of a long prompt (default 4,24): a model with "
                             "a wider tokenizer evicts fewer blocks per request")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="engine: seconds per request")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="engine: seconds to start")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    total = args.requests if args.target == "engine" else args.keys
    if not 0 <= args.long_share <= 1:
        parser.error("--long-share must be within 0 and 1")
    if total <= 0 or args.sample_every < 0 or (args.warm_up_min or 0) < 0:
        parser.error("--requests/--keys must be positive and --sample-every and --warm-up-min not negative")
    if args.warm_up_min is None:
        args.warm_up_min = ENGINE_WARM_UP_MIN if args.target == "engine" else 0
    args.sample_every = args.sample_every or max(1, total // 100)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    report = engine_soak(args) if args.target == "engine" else bridge_soak(args)
    total, per = (args.requests, 10_000) if args.target == "engine" else (args.keys, 1_000_000)
    report["machine"] = machine_line()
    verdict = report["verdict"] = judge(
        report["samples"], total, args.warm_up_share, args.max_slope_mib, per, args.warm_up_min,
        report.get("filled_at", 0),
    )  # fmt: skip
    reasons = [f"{len(report['failures'])}+ requests failed"] if report["failures"] else []
    if report.get("filled_at", 0) is None:
        evicted = report["evictions"][-1][1] if report["evictions"] else 0
        reasons.append(
            f"not judged: the engine's windows ({report['windows']}) were still filling at the end "
            f"({evicted:,} blocks evicted); run longer or with longer prompts (--long-share, --long-words)"
        )
    elif not verdict["within"]:
        reasons.append(
            f"RSS grows {verdict['slope_mib']:.3f} MiB per {per:,} {report['unit']} after warm-up "
            f"(limit {args.max_slope_mib:g}; {verdict['samples_fitted']} samples fitted after "
            f"{verdict['warm_up_end']:,}, the warm-up's {verdict['warm_up_by']})"
        )
    report["failed"] = reasons
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"machine: {report['machine']}")
        done, samples = f"{report['completed']} {report['unit']} in {report['seconds']} s", report["samples"]
        print(f"{report['target']}: {report['setup']}; {done}")
        print(f"RSS samples ({report['unit']}, MiB): {samples[:: max(1, len(samples) // 10)]}")
        print(f"verdict: {report['verdict']}")
        print("PASS" if not reasons else "FAIL: " + "; ".join(reasons))
    return 0 if not reasons else 1
