"""``sage llm engine status``: a running engine's model, device, policy, KV cache and requests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sage_cli.options import ApiKeyOpt, JsonOpt, NameOpt, SocketOpt, UrlOpt, client_for
from sage_cli.output import Output

__all__ = ["render_status", "status"]


def _duration(seconds: Any) -> str:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{s}s")
    return " ".join(parts)


def _batch_invariance(engine: dict[str, Any]) -> str:
    """"on (kernels)": answers never depend on batching; "off": they may (an older engine: "?")."""
    mode = engine.get("batch_invariant")
    if mode == "on":
        return f"on ({engine.get('batch_invariant_kernels')})"
    if mode == "off":
        return "off: outputs may depend on batching (--batch-invariant off, or no invariant kernels here)"
    return "?"


def _threads(engine: dict[str, Any]) -> str:
    """``2 (2 cores)``, and each warning of the engine's threads after it."""
    threads = engine.get("threads")
    if not isinstance(threads, dict):
        return "?"
    text = f"{threads.get('torch_threads', '?')} ({threads.get('cores', '?')} cores)"
    warnings = threads.get("warnings")
    if isinstance(warnings, list) and warnings:
        text += "; warning: " + "; ".join(str(w) for w in warnings)
    return text


def render_status(engine: dict[str, Any], *, tz: dt.tzinfo | None = None) -> str:
    """``GET /v1/engine`` for people: one aligned ``key: value`` line per fact."""
    policy = engine.get("policy")
    if isinstance(policy, dict):
        params = policy.get("params")
        policy_text = str(policy.get("name", "?"))
        if isinstance(params, dict) and params:
            policy_text += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    else:
        policy_text = "?" if policy is None else str(policy)
    started = engine.get("started_at")
    started_text = "?"
    if isinstance(started, int | float) and not isinstance(started, bool):
        started_text = dt.datetime.fromtimestamp(
            started, tz=tz or dt.datetime.now().astimezone().tzinfo
        ).strftime("%Y-%m-%d %H:%M:%S")
    requests = engine.get("requests")
    if not isinstance(requests, dict):
        requests = {}

    def get(key: str) -> str:
        value = engine.get(key)
        return "?" if value is None else str(value)

    rows = [
        ("Name", get("name")),
        ("Model", get("model")),
        ("PID", get("pid")),
        ("Socket", get("socket")),
        ("Device", get("device")),
        (
            "Precision",
            f"{get('dtype')}, KV cache {get('kv_dtype')}, quantization {get('quantization')}, "
            f"packed weights {engine.get('packed_weights') or 'no'}, "
            f"compile {engine.get('compile') or 'off'}",
        ),
        ("Exactness", _batch_invariance(engine)),
        ("Implementation", get("implementation")),
        ("Threads", _threads(engine)),
        ("Started", f"{started_text} (up {_duration(engine.get('uptime_s'))})"),
        ("Eviction Policy", policy_text),
        ("KV Cache", f"{get('num_blocks')} blocks x {get('block_size')} tokens"),
        (
            "Requests",
            f"{requests.get('running', '?')} running, {requests.get('waiting', '?')} waiting, "
            f"{requests.get('finished', '?')} finished",
        ),
    ]
    width = max(len(key) for key, _ in rows) + 1
    return "\n".join(["Engine Status:"] + [f"  {key + ':':<{width}} {value}" for key, value in rows])


def status(
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a running engine: model, device, policy, KV cache and requests."""
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.engine()
    out.result(answer, lambda: render_status(answer))
