"""Soak test of a real engine process: concurrent clients, malformed requests, hot swaps, resets.

For ``--duration`` seconds, ``--clients`` threads send a mix of requests over the engine's Unix
socket: good ones (completions, streamed or not, chat when the model has a chat template,
eviction stats and logs, metrics, health), malformed ones (bad JSON, wrong types, sampling
values out of range, 5000-digit integers, JSON nested 10,000 deep, a lone UTF-16 surrogate, an
empty body, a prompt larger than the pool, unknown policies) and, from client 0 every
``--admin-interval`` seconds, a policy hot swap or a cache reset. Every request has a timeout.

A good request must answer 200 with a whole answer; a malformed one a 4xx with a JSON error
body, never a 5xx and never a hang; nothing may be lost (a dropped connection, a stream cut
short). Decoding is greedy or seeded, so the same prompt must give the same text all run long,
whatever policy is active. The engine's RSS and open file descriptors are sampled from warm-up to
the end, and their drift is judged against stated thresholds (`drift`): the resident memory may
grow at most ``--max-rss-growth-mib`` (default 32 MiB) from the end of the warm-up window (the
first ``--warm-up-share`` of the run, default 20 %: allocator pools, caches and the pool's pages
fill there) to the end of the run, each end the median of its samples; and the open descriptors,
counted with no client connected, at most ``--max-fd-growth`` (default 2) above their count at
the start. A leak of a few KiB a request, or one descriptor a connection, fails the run. Exit code
0 when all of that holds and the engine still answers ``/health``, else 1.

    python benchmarks/soak.py                                  # 10 minutes, 8 clients, sage-tiny
    python benchmarks/soak.py --duration 120 --model smollm2-135m
    python benchmarks/soak.py --duration 5 --clients 4 --json

With ``--unique-prompts`` it is the other soak, where every request is a new prompt and the
verdict is the fitted RSS slope per 10,000 requests after warm-up, for the engine or a policy
bridge's event replay (benchmarks/soak_unique.py says the rest):

    python benchmarks/soak.py --unique-prompts --requests 100000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from sage_cli.spawn import TemporaryEngine

BASE_URL = "http://sage"
GOOD, MALFORMED, ADMIN = "good", "malformed", "admin"

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "A haiku about the sea:",
    "The quick brown fox",
    "In 1969, the first person to walk on the Moon was",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "Dear diary, today I",
    "SELECT name FROM users WHERE",
]
QUESTIONS = ["What is the capital of France?", "Name a colour.", "What is 2 + 2?", "Say hello."]
SALTS = [None, None, "tenant-a", "tenant-b"]
# Seeded sampling is as reproducible as greedy decoding: both are checked for the same text.
SAMPLINGS: list[dict[str, Any]] = [{}, {"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}]


# --------------------------------------------------------------------------------------------
# The requests


@dataclass(slots=True)
class Call:
    """One request to send, what group it belongs to, and its determinism key (good completions)."""

    kind: str
    group: str
    method: str
    path: str
    body: bytes | None = None
    stream: bool = False
    key: str | None = None


def _json_call(kind: str, group: str, method: str, path: str, value: Any, *, key: bool = False) -> Call:
    body = json.dumps(value).encode()
    stream = isinstance(value, dict) and value.get("stream") is True
    if key:  # streamed and whole answers, salted or not, must agree too
        fixed = {k: v for k, v in value.items() if k not in ("stream", "cache_salt")}
        return Call(kind, group, method, path, body, stream, f"{path} {json.dumps(fixed, sort_keys=True)}")
    return Call(kind, group, method, path, body, stream)


def good_call(rng: random.Random, chat: bool) -> Call:
    """A request the engine must serve with 200."""
    roll = rng.random()
    if roll < 0.55:
        stream = rng.random() < 0.4
        if chat and rng.random() < 0.35:
            messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
            body: dict[str, Any] = {"messages": messages, "max_tokens": rng.choice([4, 8])}
            path, kind = "/v1/chat/completions", "chat"
        else:
            body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.choice([4, 8])}
            path, kind = "/v1/completions", "completion"
        body.update(rng.choice(SAMPLINGS))
        salt = rng.choice(SALTS)
        if salt is not None:
            body["cache_salt"] = salt
        if stream:
            body["stream"] = True
        return _json_call(kind + ("_stream" if stream else ""), GOOD, "POST", path, body, key=True)
    reads = [
        ("stats", "/v1/eviction/stats"),
        ("logs", "/v1/eviction/logs?tail=5"),
        ("metrics", "/metrics"),
        ("health", "/health"),
        ("policies", "/v1/eviction/policies"),
    ]
    kind, path = rng.choice(reads)
    return Call(kind, GOOD, "GET", path)


def _raw(kind: str, path: str, body: bytes, method: str = "POST") -> Call:
    return Call(kind, MALFORMED, method, path, body)


def malformed_call(rng: random.Random) -> Call:
    """A request the engine must refuse with a 4xx and a JSON error body."""
    prompt = rng.choice(PROMPTS)
    builders = [
        lambda: _raw("bad_json", "/v1/completions", b'{"prompt": "x", "max_tokens": 4'),
        lambda: _raw("bad_json", "/v1/chat/completions", b'{"messages": [}'),
        lambda: _json_call("wrong_type", MALFORMED, "POST", "/v1/completions", {"prompt": 5}),
        lambda: _json_call(
            "wrong_type", MALFORMED, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": "8"}
        ),
        lambda: _json_call("wrong_type", MALFORMED, "POST", "/v1/chat/completions", {"messages": "hi"}),
        lambda: _json_call("wrong_type", MALFORMED, "PUT", "/v1/eviction/policy", {"policy": 3}),
        lambda: _json_call(
            "bad_sampling", MALFORMED, "POST", "/v1/completions", {"prompt": prompt, "temperature": -1}
        ),
        lambda: _json_call(
            "bad_sampling", MALFORMED, "POST", "/v1/completions", {"prompt": prompt, "top_p": 0}
        ),
        lambda: _raw("huge_int", "/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"),
        lambda: _json_call(
            "unknown_policy", MALFORMED, "PUT", "/v1/eviction/policy", {"policy": "belady-ish", "params": {}}
        ),
        lambda: _raw("deep_json", "/v1/completions", b"[" * 10_000 + b"]" * 10_000),
        lambda: _raw("lone_surrogate", "/v1/completions", b'{"prompt": "x", "cache_salt": "\\ud800"}'),
        lambda: _raw("empty_body", "/v1/completions", b""),
        lambda: _json_call(
            "huge_prompt", MALFORMED, "POST", "/v1/completions", {"prompt": "word " * 40_000, "max_tokens": 1}
        ),
        lambda: _raw("bad_logs_query", "/v1/eviction/logs?tail=-1", b"", method="GET"),
    ]
    return rng.choice(builders)()


def admin_call(rng: random.Random, policies: list[str]) -> Call:
    """A hot swap to a random online policy (two in three) or a cache reset."""
    if rng.random() < 2 / 3:
        body = {"policy": rng.choice(policies), "params": {}}
        return _json_call("swap", ADMIN, "PUT", "/v1/eviction/policy", body)
    return Call("reset", ADMIN, "POST", "/v1/cache/reset")


# --------------------------------------------------------------------------------------------
# Sending and judging one request


@dataclass(slots=True)
class Outcome:
    """What came back: the status (None without an answer), the failure when any, the text."""

    call: Call
    status: int | None
    seconds: float
    failure: str | None = None
    text: str | None = None


def _sse_text(lines: list[str], chat: bool) -> tuple[str | None, str | None]:
    """The text of a server-sent completion stream and the failure, if it broke off or erred."""
    pieces: list[str] = []
    finished = done = False
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            return None, "stream_error"
        for choice in event.get("choices", []):
            pieces.append(choice["delta"].get("content", "") if chat else choice["text"])
            finished = finished or choice.get("finish_reason") is not None
    if not (done and finished):
        return None, "lost"  # the stream ended without its finish reason and [DONE]
    return "".join(pieces), None


def _answer_text(call: Call, payload: Any) -> str | None:
    if call.key is None:
        return None
    choice = payload["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


def _judge(call: Call, status: int, raw: bytes, lines: list[str] | None) -> tuple[str | None, str | None]:
    """(failure, text) of an answer: None when the answer is what `call.group` expects."""
    if call.group == MALFORMED:
        if status >= 500:
            return "5xx", None
        if not 400 <= status < 500:
            return "not_4xx", None
        try:
            error = json.loads(raw)["error"]
            ok = isinstance(error["type"], str) and isinstance(error["message"], str)
        except (ValueError, KeyError, TypeError):
            ok = False
        return (None, None) if ok else ("bad_error_body", None)
    if status != 200:
        return f"status_{status}", None
    if lines is not None:
        text, failure = _sse_text(lines, chat="chat" in call.kind)
        return failure, text
    if call.path == "/metrics":
        return None, None
    try:
        return None, _answer_text(call, json.loads(raw))
    except (ValueError, KeyError, IndexError, TypeError):
        return "bad_body", None


def send(http: httpx.Client, call: Call, timeout: float) -> Outcome:
    """Send `call`; a timeout and a lost answer are outcomes, not exceptions."""
    start = time.perf_counter()
    headers = {"content-type": "application/json"} if call.body is not None else {}
    try:
        request = http.build_request(call.method, call.path, content=call.body, headers=headers)
        answer = http.send(request, stream=True)
        try:
            if call.stream and answer.status_code == 200:
                lines = []
                for line in answer.iter_lines():
                    lines.append(line)
                    if time.perf_counter() - start > timeout:  # chunks keep coming but never end
                        raise httpx.ReadTimeout("stream outlasted the timeout")
                failure, text = _judge(call, 200, b"", lines)
            else:
                failure, text = _judge(call, answer.status_code, answer.read(), None)
        finally:
            answer.close()
    except httpx.TimeoutException:
        return Outcome(call, None, time.perf_counter() - start, "timeout")
    except httpx.TransportError:
        return Outcome(call, None, time.perf_counter() - start, "lost")
    return Outcome(call, answer.status_code, time.perf_counter() - start, failure, text)


# --------------------------------------------------------------------------------------------
# Tallies


@dataclass
class KindTally:
    group: str
    sent: int = 0
    as_expected: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)


class Tally:
    """Every outcome, by kind, and the first text of each determinism key (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.kinds: dict[str, KindTally] = {}
        self.texts: dict[str, tuple[str, str]] = {}  # key -> (text, kind that gave it first)
        self.checked: Counter[str] = Counter()
        self.mismatches: list[dict[str, Any]] = []

    def record(self, outcome: Outcome) -> None:
        call = outcome.call
        with self._lock:
            tally = self.kinds.setdefault(call.kind, KindTally(call.group))
            tally.sent += 1
            tally.seconds.append(outcome.seconds)
            answered = str(outcome.status) if outcome.status is not None else None
            tally.statuses[answered or outcome.failure or "none"] += 1
            if outcome.failure is None:
                tally.as_expected += 1
            else:
                tally.failures[outcome.failure] += 1
            if call.key is not None and outcome.text is not None:
                self._check(call, outcome.text)

    def _check(self, call: Call, text: str) -> None:
        self.checked[call.key or ""] += 1
        first = self.texts.setdefault(call.key or "", (text, call.kind))
        if first[0] != text and len(self.mismatches) < 20:
            example = {"request": call.key, "first": first[0], "first_kind": first[1]}
            self.mismatches.append({**example, "now": text, "kind": call.kind})

    def summary(self) -> dict[str, Any]:
        with self._lock:
            kinds = {
                name: {
                    "group": k.group,
                    "sent": k.sent,
                    "as_expected": k.as_expected,
                    "statuses": dict(sorted(k.statuses.items())),
                    "failures": dict(sorted(k.failures.items())),
                    "p50_ms": round(statistics.median(k.seconds) * 1e3, 1) if k.seconds else None,
                    "max_ms": round(max(k.seconds) * 1e3, 1) if k.seconds else None,
                }
                for name, k in sorted(self.kinds.items())
            }
            groups: dict[str, Counter[str]] = defaultdict(Counter)
            for k in self.kinds.values():
                groups[k.group].update(sent=k.sent, as_expected=k.as_expected)
                groups[k.group].update(k.failures)
            determinism = {
                "requests_checked": sum(self.checked.values()),
                "distinct_requests": len(self.checked),
                "mismatches": len(self.mismatches),
                "examples": self.mismatches[:5],
            }
        return {"kinds": kinds, "groups": {g: dict(c) for g, c in groups.items()}, "determinism": determinism}


# --------------------------------------------------------------------------------------------
# The engine's resources


def resources(pid: int) -> dict[str, int]:
    """The process's resident memory (KiB, VmRSS) and its open file descriptors."""
    rss = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"rss_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Sampler(threading.Thread):
    """Samples the engine's `resources` every `interval` seconds until `stop` is set."""

    def __init__(self, process: subprocess.Popen[bytes], interval: float, start: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.process, self.pid, self.interval, self.t0 = process, process.pid, interval, start
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()
        self.engine_gone = threading.Event()  # the clients stop early rather than spin on refusals

    def sample(self) -> dict[str, float]:
        if self.process.poll() is not None:  # a dead child keeps its /proc entry until reaped
            raise ProcessLookupError(f"the engine (pid {self.pid}) exited with {self.process.returncode}")
        row: dict[str, float] = {"t_s": round(time.monotonic() - self.t0, 1), **resources(self.pid)}
        self.samples.append(row)
        return row

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.sample()
            except OSError:  # the engine is gone: the end check reports it
                self.engine_gone.set()
                return


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Plan:
    """What every client needs: where to send, for how long, which mix."""

    socket: str
    deadline: float
    timeout: float
    seed: int
    chat: bool
    policies: list[str]
    admin_interval: float
    malformed_share: float
    tally: Tally
    engine_gone: threading.Event


def _http(socket: str, timeout: float) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url=BASE_URL, timeout=timeout)


def run_client(index: int, plan: Plan) -> None:
    """One client's loop until the deadline; client 0 also swaps policies and resets the cache."""
    rng = random.Random(plan.seed * 1000 + index)
    next_admin = time.monotonic() + plan.admin_interval
    with _http(plan.socket, plan.timeout) as http:
        while time.monotonic() < plan.deadline and not plan.engine_gone.is_set():
            if index == 0 and time.monotonic() >= next_admin:
                call = admin_call(rng, plan.policies)
                next_admin += plan.admin_interval
            elif rng.random() < plan.malformed_share:
                call = malformed_call(rng)
            else:
                call = good_call(rng, plan.chat)
            plan.tally.record(send(http, call, plan.timeout))


def warm_up(socket: str, timeout: float) -> tuple[bool, list[str]]:
    """A few requests before the clock starts; whether chat is served, and the online policies."""
    with _http(socket, timeout) as http:
        for prompt in PROMPTS[:3]:
            http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}).raise_for_status()
        chat = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        )
        if chat.status_code not in (200, 400):
            chat.raise_for_status()
        listed = http.get("/v1/eviction/policies").json()["policies"]
    return chat.status_code == 200, [p["name"] for p in listed if not p["offline"]]


def _settled_sample(sampler: Sampler) -> dict[str, float]:
    """A sample with no client connected; the last one taken when the engine is gone."""
    time.sleep(0.5)  # closed connections' descriptors are released by the engine's loop
    try:
        return sampler.sample()
    except OSError:
        sampler.engine_gone.set()
        return sampler.samples[-1]


def _engine_errors(log_path: Path) -> list[str]:
    """The engine log's error lines and tracebacks (the log uses structlog's console format)."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if "[error" in line or "[critical" in line or line.startswith("Traceback")]


def _health(socket: str, pid: int) -> bool:
    try:
        with _http(socket, 10.0) as http:
            answer = http.get("/health")
            return answer.status_code == 200 and answer.json().get("pid") == pid
    except (httpx.HTTPError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class DriftLimits:
    """How far the engine's resources may drift in a run before the soak fails."""

    max_rss_growth_mib: float = 32.0
    max_fd_growth: int = 2
    warm_up_share: float = 0.2


def drift(samples: list[dict[str, float]], settled_first: dict[str, float], settled_last: dict[str, float],
          limits: DriftLimits) -> dict[str, Any]:  # fmt: skip
    """The run's resource drift and whether it is within `limits`.

    RSS: the median of the samples taken in the warm-up window's last tenth of the run (from
    `warm_up_share` to `warm_up_share` + 0.1) against the median of the last tenth, so that one
    sample's noise does not decide. Descriptors: the settled samples (no client connected) at the
    end and at the start.
    """
    start_t, end_t = samples[0]["t_s"], samples[-1]["t_s"]
    span = max(end_t - start_t, 1e-9)

    def window(lo: float, hi: float) -> list[float]:
        chosen = [s["rss_kib"] for s in samples if lo <= (s["t_s"] - start_t) / span <= hi]
        return chosen or [samples[-1]["rss_kib"]]

    after_warm_up = statistics.median(window(limits.warm_up_share, limits.warm_up_share + 0.1))
    at_end = statistics.median(window(0.9, 1.0))
    rss_growth_mib = (at_end - after_warm_up) / 1024
    fd_growth = int(settled_last["fds"] - settled_first["fds"])
    return {
        "rss_after_warm_up_kib": after_warm_up,
        "rss_at_end_kib": at_end,
        "rss_growth_mib": round(rss_growth_mib, 2),
        "fd_growth": fd_growth,
        "limits": dataclasses.asdict(limits),
        "rss_within": rss_growth_mib <= limits.max_rss_growth_mib,
        "fds_within": fd_growth <= limits.max_fd_growth,
    }


def _engine_report(sampler: Sampler, first: dict[str, float], last: dict[str, float]) -> dict[str, Any]:
    return {
        "pid": sampler.pid,
        "start": first,
        "end": last,
        "peak_rss_kib": max(s["rss_kib"] for s in sampler.samples),
        "rss_drift_kib": last["rss_kib"] - first["rss_kib"],
        "fd_drift": last["fds"] - first["fds"],
        "samples": sampler.samples,
        "gone": sampler.engine_gone.is_set(),
    }


def _load(plan: Plan, clients: int, sampler: Sampler) -> float:
    """Run `clients` clients until the deadline while `sampler` samples; the seconds it took."""
    sampler.start()
    threads = [threading.Thread(target=run_client, args=(i, plan), name=f"soak-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sampler.stop.set()
    sampler.join()
    return time.monotonic() - sampler.t0


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine, run the clients for `args.duration` seconds, and gather the report."""
    config = {"model": args.model, "device": args.device, "num_blocks": args.num_blocks, "seed": args.seed}
    started = time.monotonic()
    with TemporaryEngine(config, timeout=args.start_timeout) as engine:
        pid, socket = engine.engine.process.pid, str(engine.socket)
        startup_s = time.monotonic() - started
        chat, policies = warm_up(socket, args.timeout)
        sampler = Sampler(engine.engine.process, args.sample_interval, time.monotonic())
        first = _settled_sample(sampler)
        tally = Tally()
        plan = Plan(
            socket, time.monotonic() + args.duration, args.timeout, args.seed, chat, policies,
            args.admin_interval, args.malformed_share, tally, sampler.engine_gone,
        )  # fmt: skip
        elapsed = _load(plan, args.clients, sampler)
        last = _settled_sample(sampler)
        resources_report = _engine_report(sampler, first, last)
        limits = DriftLimits(args.max_rss_growth_mib, args.max_fd_growth, args.warm_up_share)
        resources_report["drift"] = drift(sampler.samples, first, last, limits)
        resources_report["healthy_at_end"] = _health(socket, pid)
        errors = _engine_errors(engine.engine.log_path)
    setup = {
        "model": args.model, "device": args.device, "num_blocks": args.num_blocks, "clients": args.clients,
        "duration_s": args.duration, "timeout_s": args.timeout, "seed": args.seed, "chat": chat,
        "policies": policies, "startup_s": round(startup_s, 2), "elapsed_s": round(elapsed, 1),
    }  # fmt: skip
    resources_report.update(
        exit_code=engine.engine.process.returncode, log_errors=len(errors), log_error_examples=errors[:5]
    )
    return {
        "machine": machine_line(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "setup": setup,
        **tally.summary(),
        "engine": resources_report,
    }


def verdict(report: dict[str, Any]) -> list[str]:
    """Why the soak failed; empty when it passed."""
    reasons = []
    for group, counts in report["groups"].items():
        for failure, count in counts.items():
            if failure not in ("sent", "as_expected"):
                kinds = [
                    name
                    for name, kind in report["kinds"].items()
                    if kind["group"] == group and kind["failures"].get(failure)
                ]
                reasons.append(f"{count} {group} request(s) {failure} ({', '.join(kinds)})")
    good = report["groups"].get(GOOD, {})
    if not good.get("as_expected"):
        reasons.append("no good request was served")
    mismatches = report["determinism"]["mismatches"]
    if mismatches:
        reasons.append(f"{mismatches} answer(s) differ from the first answer to the same request")
    engine = report["engine"]
    if engine["gone"]:
        reasons.append("the engine process died during the run")
    if not engine["healthy_at_end"]:
        reasons.append("the engine no longer answers /health")
    if engine["exit_code"] not in (0, None):
        reasons.append(f"the engine exited with code {engine['exit_code']} on shutdown")
    reasons += drift_reasons(engine["drift"])
    return reasons


def drift_reasons(judged: dict[str, Any]) -> list[str]:
    """Why a `drift` judgement fails the run; empty when it is within its limits."""
    limits, reasons = judged["limits"], []
    if not judged["rss_within"]:
        reasons.append(
            f"the engine's RSS grew {judged['rss_growth_mib']:.1f} MiB after warm-up "
            f"(limit {limits['max_rss_growth_mib']:g} MiB)"
        )
    if not judged["fds_within"]:
        reasons.append(
            f"the engine holds {judged['fd_growth']} more open file descriptors than at the start "
            f"(limit {limits['max_fd_growth']})"
        )
    return reasons


# --------------------------------------------------------------------------------------------
# Output


def print_report(report: dict[str, Any]) -> None:
    """The report as Rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    setup = report["setup"]
    console.print(f"machine: {report['machine']}; loadavg_1m={report['loadavg_1m']}")
    console.print("setup:   " + ", ".join(f"{k}={v}" for k, v in setup.items() if k != "policies"))
    table = Table(title="requests by kind")
    numbers = ("sent", "as expected", "p50 ms", "max ms")
    for column in ("kind", "group", "sent", "as expected", "statuses", "failures", "p50 ms", "max ms"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for name, kind in report["kinds"].items():
        statuses = " ".join(f"{s}:{n}" for s, n in kind["statuses"].items())
        failures = " ".join(f"{f}:{n}" for f, n in kind["failures"].items()) or "-"
        table.add_row(
            name, kind["group"], str(kind["sent"]), str(kind["as_expected"]), statuses, failures,
            str(kind["p50_ms"]), str(kind["max_ms"]),
        )  # fmt: skip
    console.print(table)
    for group, counts in report["groups"].items():
        console.print(f"{group}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    det = report["determinism"]
    console.print(
        f"determinism: {det['requests_checked']} answers to {det['distinct_requests']} distinct requests, "
        f"{det['mismatches']} mismatches"
    )
    for example in det["examples"]:
        console.print(f"  {example}", markup=False)
    engine = report["engine"]
    start, end = engine["start"], engine["end"]
    console.print(
        f"engine pid {engine['pid']}: RSS {start['rss_kib'] / 1024:.1f} -> {end['rss_kib'] / 1024:.1f} MiB "
        f"(drift {engine['rss_drift_kib'] / 1024:+.1f} MiB, peak {engine['peak_rss_kib'] / 1024:.1f} MiB), "
        f"fds {start['fds']} -> {end['fds']} (drift {engine['fd_drift']:+d}), "
        f"{len(engine['samples'])} samples; healthy at end: {engine['healthy_at_end']}; "
        f"exit code {engine['exit_code']}; {engine['log_errors']} error lines in its log"
    )
    judged, limits = engine["drift"], engine["drift"]["limits"]
    console.print(
        f"drift after warm-up: RSS {judged['rss_growth_mib']:+.1f} MiB "
        f"(limit {limits['max_rss_growth_mib']:g}), "
        f"fds {judged['fd_growth']:+d} (limit {limits['max_fd_growth']})"
    )
    for line in engine["log_error_examples"]:
        console.print(f"  {line}", markup=False)
    reasons = report["failed"]
    console.print("PASS" if not reasons else "FAIL: " + "; ".join(reasons), markup=False)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--model", default="sage-tiny", help="sage-tiny or smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-blocks", type=int, default=96, help="KV pool blocks: small, so it evicts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request before a hang")
    parser.add_argument("--admin-interval", type=float, default=3.0, help="seconds between swaps/resets")
    parser.add_argument("--malformed-share", type=float, default=0.3, help="share of malformed requests")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds between RSS/fd samples")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for the engine to start")
    parser.add_argument("--max-rss-growth-mib", type=float, default=32.0,
                        help="RSS growth allowed after warm-up (default 32 MiB)")  # fmt: skip
    parser.add_argument("--max-fd-growth", type=int, default=2,
                        help="open descriptors allowed above the start (default 2)")  # fmt: skip
    parser.add_argument("--warm-up-share", type=float, default=0.2,
                        help="share of the run that is warm-up, not drift (default 0.2)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if "--unique-prompts" in (sys.argv[1:] if argv is None else argv):
        from soak_unique import main as unique_prompts_main

        return unique_prompts_main(argv)
    args = _arguments(argv)
    report = soak(args)
    report["failed"] = verdict(report)
    report["passed"] = not report["failed"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
