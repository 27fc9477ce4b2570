"""The control API (`engine_adapter.serving.app.build_app`) over a real engine, in process.

A real `Engine` (sage-tiny on the CPU, a pool of 16 blocks so that a few prompts evict) behind
Starlette's TestClient: every endpoint of docs/architecture.md, "Control API", and every error answered as
``{"error": {"type", "message"}}``. The server as a process (socket, signals, follow streams)
is tested in test_server_process.py.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import app_client, running_engine
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from structlog.testing import capture_logs

from engine_adapter.cache.stats import CacheStats
from engine_adapter.serving.app import build_app
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from sage_eviction.native import core_implementation

NUM_BLOCKS = 16
BLOCK_SIZE = 16
SHARED = "The quick brown fox jumps over the lazy dog while the cat watches. "  # > 4 blocks


def _config(root: Path) -> EngineConfig:
    return EngineConfig(
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        device="cpu",
        socket=str(root / "t.sock"),
        log_dir=str(root / "logs"),
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(_config, "sage-app-") as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return app_client(engine)


def _complete(client: TestClient, prompt: str | list[int], **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _assert_error(r: Any, status: int, type_: str, *needles: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == type_, body
    message: str = body["error"]["message"]
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


# ---- the read-only endpoints -------------------------------------------------------------------


def test_health(client: TestClient, engine: Engine) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["name"] == engine.name and isinstance(body["pid"], int)


def test_engine_info_adds_socket_and_pid(client: TestClient, engine: Engine) -> None:
    body = client.get("/v1/engine").json()
    for key in ("name", "model", "pid", "socket", "device", "started_at", "uptime_s", "policy"):
        assert key in body, key
    assert body["socket"] == engine.config.socket
    assert body["model"] == "sage-tiny" and body["device"] == "cpu"
    assert body["num_blocks"] == NUM_BLOCKS and body["block_size"] == BLOCK_SIZE
    assert set(body["policy"]) == {"name", "params"}
    assert set(body["requests"]) >= {"running", "waiting", "finished"}
    # which implementation of the core this engine process loaded (sage_eviction.native)
    assert body["implementation"] == core_implementation()
    assert body["implementation"] == "compiled" or body["implementation"].startswith("pure-python (")


def test_stats_have_the_api_keys(client: TestClient) -> None:
    body = client.get("/v1/eviction/stats").json()
    assert list(body) == [*(f.name for f in dataclasses.fields(CacheStats)), "token_eviction"]
    assert body["token_eviction"]["policy"] == "none" and body["token_eviction"]["compressions"] == 0
    assert body["strategy"] == body["policy"].upper()
    assert body["total_blocks"] == NUM_BLOCKS


def test_policies_list_the_online_policies(client: TestClient) -> None:
    body = client.get("/v1/eviction/policies").json()
    names = [p["name"] for p in body["policies"]]
    assert body["active"] in names
    assert {"lru", "arc", "s3fifo"} <= set(names)
    for p in body["policies"]:
        assert set(p) >= {"name", "strategy", "paper", "offline", "params"}
        assert p["offline"] is False


# ---- completions -------------------------------------------------------------------------------


def test_completion_answers_the_openai_shape_and_counts_cached_tokens(client: TestClient) -> None:
    prompt = SHARED + "First question?"
    first = _complete(client, prompt, user="alice")
    assert first["object"] == "text_completion" and first["id"].startswith("cmpl-")
    assert first["model"] == "sage-tiny" and isinstance(first["created"], int)
    (choice,) = first["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str)
    usage = first["usage"]
    assert usage["completion_tokens"] <= 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    second = _complete(client, prompt)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] <= second["usage"]["prompt_tokens"]


def test_completion_takes_token_ids_and_sage_extensions(client: TestClient) -> None:
    body = _complete(
        client,
        [5, 6, 7, 8, 9, 10],
        temperature=0.8,
        top_p=0.9,
        top_k=-1,
        seed=7,
        stop=["\n"],
        priority=1,
        tenant="t1",
        cache_salt="s1",
        model="sage-tiny",
        n=1,
    )
    assert body["usage"]["prompt_tokens"] == 6


def test_streamed_text_equals_the_whole_answer(client: TestClient) -> None:
    prompt = SHARED + "Stream it."
    whole = _complete(client, prompt, max_tokens=6)
    r = client.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in r.text.split("\n\n") if line]
    assert all(line for line in events)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["id"] == chunks[0]["id"] and c["object"] == "text_completion" for c in chunks)
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finish) == 1
    assert finish[0]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"]
    usage_only = chunks[-1]  # include_usage: a last chunk with no choices, only the usage
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] > 0
    assert usage_only["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prompt was just served


# ---- eviction: logs, stats, swap ------------------------------------------------------------------


def _fill_until_evictions(client: TestClient) -> None:
    for i in range(12):
        _complete(client, f"{i:03d} distinct prompt number {i} " * 3, max_tokens=2)
        if client.get("/v1/eviction/stats").json()["total_evictions"] > 0:
            return
    pytest.fail("no eviction after 12 distinct prompts on a 16-block pool")


def test_logs_tail_returns_evict_and_freed_events(client: TestClient) -> None:
    _fill_until_evictions(client)
    events = client.get("/v1/eviction/logs").json()["events"]  # default tail 100
    kinds = {e["event"] for e in events}
    assert {"evict", "freed"} <= kinds
    evict = next(e for e in events if e["event"] == "evict")
    assert {"ts", "block", "block_id", "policy", "reason", "last_access"} <= set(evict)
    freed = next(e for e in events if e["event"] == "freed")
    assert {"ts", "policy", "reason", "blocks_freed", "total_freed", "duration_us"} <= set(freed)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)  # oldest first
    tail = client.get("/v1/eviction/logs", params={"tail": 2}).json()["events"]
    assert tail == events[-2:]
    assert client.get("/v1/eviction/logs", params={"tail": 0}).json() == {"events": []}


def test_set_policy_swaps_and_keeps_the_cached_blocks(client: TestClient, engine: Engine) -> None:
    _complete(client, SHARED + "before the swap")
    before = client.get("/v1/eviction/stats").json()
    r = client.put("/v1/eviction/policy", json={"policy": "arc", "params": {}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["old"]["name"] == before["policy"] and body["new"] == {"name": "arc", "params": {}}
    assert isinstance(body["swap_time_s"], float) and body["swap_time_s"] >= 0
    assert body["entries"] == before["cached_blocks"]
    after = client.get("/v1/eviction/stats").json()
    assert after["policy"] == "arc" and after["strategy"] == "ARC"
    assert after["cached_blocks"] == before["cached_blocks"]
    assert after["policy_swaps"] == before["policy_swaps"] + 1
    assert client.get("/v1/eviction/policies").json()["active"] == "arc"
    # params go through to the policy
    r = client.put("/v1/eviction/policy", json={"policy": "s3fifo", "params": {"small_ratio": 0.2}})
    assert r.status_code == 200, r.text
    assert r.json()["new"]["name"] == "s3fifo"
    assert _complete(client, SHARED + "after the swap")["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert client.put("/v1/eviction/policy", json={"policy": "lru"}).status_code == 200


def test_unknown_policy_is_400_listing_the_available_ones(client: TestClient) -> None:
    r = client.put("/v1/eviction/policy", json={"policy": "no-such-policy"})
    _assert_error(r, 400, "invalid_policy", "no-such-policy", "lru", "arc", "s3fifo")
    assert client.get("/v1/eviction/policies").json()["active"] == "lru"  # unchanged


def test_bad_policy_param_and_offline_policy_are_400(client: TestClient) -> None:
    r = client.put("/v1/eviction/policy", json={"policy": "s3fifo", "params": {"no_such_param": 1}})
    _assert_error(r, 400, "invalid_policy", "no_such_param")
    r = client.put("/v1/eviction/policy", json={"policy": "belady"})
    _assert_error(r, 400, "invalid_policy", "needs the future", "online policies: arc, fifo")
    # The pool's size is the engine's to give: a 400 naming it, not a 500 from a duplicate keyword.
    r = client.put("/v1/eviction/policy", json={"policy": "arc", "params": {"capacity": 64}})
    _assert_error(r, 400, "invalid_policy", "'capacity'", "leave it out")
    r = client.put("/v1/eviction/policy", json={"policy": "arc", "params": [1]})
    _assert_error(r, 400, "invalid_value", "params")
    r = client.put("/v1/eviction/policy", json={"params": {}})
    _assert_error(r, 400, "invalid_value", "policy")
    assert client.get("/v1/eviction/policies").json()["active"] == "lru"


# ---- metrics ------------------------------------------------------------------------------------


def test_metrics_parse_and_count_what_the_engine_did(client: TestClient) -> None:
    _complete(client, SHARED + "for the metrics")
    _complete(client, SHARED + "for the metrics, again")  # hits the shared prefix, whatever ran before
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in (
        "sage:evictions", "sage:eviction_duration_seconds", "sage:prefix_cache_queries",
        "sage:prefix_cache_hits", "sage:kv_cache_usage_perc", "sage:num_preemptions",
        "sage:re_prefill_blocks", "sage:num_requests_running", "sage:num_requests_waiting",
        "sage:request_success", "sage:time_to_first_token_seconds", "sage:time_per_output_token_seconds",
        "sage:prompt_tokens", "sage:generation_tokens", "sage:policy_swaps", "sage:policy_info",
    ):  # fmt: skip
        assert name in families, name

    def total(family: str, sample: str) -> float:
        return sum(s.value for s in families[family].samples if s.name == sample)

    assert total("sage:request_success", "sage:request_success_total") > 0
    assert total("sage:prefix_cache_hits", "sage:prefix_cache_hits_total") > 0
    active = [s.labels["policy"] for s in families["sage:policy_info"].samples if s.value == 1]
    assert active == [client.get("/v1/eviction/policies").json()["active"]]


# ---- errors --------------------------------------------------------------------------------------


def test_malformed_json_is_400(client: TestClient) -> None:
    r = client.post(
        "/v1/completions", content=b'{"prompt": "x", ', headers={"content-type": "application/json"}
    )
    _assert_error(r, 400, "invalid_json", "malformed JSON")
    r = client.put("/v1/eviction/policy", content=b"not json")
    _assert_error(r, 400, "invalid_json")
    r = client.post("/v1/completions", content=b"")
    _assert_error(r, 400, "invalid_json", "empty")
    r = client.post("/v1/completions", json=["a list"])
    _assert_error(r, 400, "invalid_request", "JSON object")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        # These were 500s: a ValueError from int parsing, a RecursionError, and a lone surrogate
        # that failed later, while hashing the cache salt, and wedged the engine.
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "malformed JSON"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt": "hello", "max_tokens": 2, "cache_salt": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"prompt": "\\udfff", "max_tokens": 2}', "lone UTF-16 surrogate"),
    ],
    ids=["5000-digit int", "deep prompt", "deep body", "surrogate salt", "surrogate prompt"],
)
def test_hostile_json_is_a_400_and_the_engine_serves_on(
    client: TestClient, content: bytes, needle: str
) -> None:
    r = client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    _assert_error(r, 400, "invalid_json", needle)
    ok = client.post("/v1/completions", json={"prompt": "still serving", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_extreme_sampling_values_do_not_fail_the_request(client: TestClient) -> None:
    for body in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300}):
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, **body})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1


def test_unknown_fields_are_400_naming_them(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokenz": 3})
    _assert_error(r, 400, "unknown_field", "'max_tokenz'")
    r = client.put("/v1/eviction/policy", json={"policy": "arc", "param": {}})
    _assert_error(r, 400, "unknown_field", "'param'")
    r = client.get("/v1/eviction/logs", params={"tial": 3})
    _assert_error(r, 400, "unknown_field", "'tial'")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "temperature": -1.0}, "temperature"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "stop": 5}, "stop"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "logprobs": 3}, "logprobs"),
        ({"prompt": "x", "priority": "high"}, "priority"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": 123}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "batches"),
        ({"max_tokens": 3}, "prompt"),
    ],
)
def test_bad_values_are_400_naming_the_field(client: TestClient, body: dict[str, Any], needle: str) -> None:
    _assert_error(client.post("/v1/completions", json=body), 400, "invalid_value", needle)


def test_requests_the_engine_can_never_serve_are_400(client: TestClient) -> None:
    too_long = list(range(1, 200)) * 2  # 398 tokens > 16 blocks x 16 tokens
    _assert_error(client.post("/v1/completions", json={"prompt": too_long}), 400, "invalid_request", "pool")
    r = client.post("/v1/completions", json={"prompt": [1, 2, 10**6]})
    _assert_error(r, 400, "invalid_request", "vocabulary")


def test_bad_log_query_is_400(client: TestClient) -> None:
    _assert_error(client.get("/v1/eviction/logs?tail=-1"), 400, "invalid_value", "tail")
    _assert_error(client.get("/v1/eviction/logs?tail=many"), 400, "invalid_value", "tail")
    _assert_error(client.get("/v1/eviction/logs?follow=maybe"), 400, "invalid_value", "follow")


def test_unknown_model_is_404(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", "model": "gpt-4"})
    _assert_error(r, 404, "model_not_found", "gpt-4", "sage-tiny")


def test_unknown_route_is_404_and_wrong_method_405(client: TestClient) -> None:
    _assert_error(client.get("/v1/nope"), 404, "not_found", "/v1/nope")
    r = client.post("/v1/eviction/stats")
    _assert_error(r, 405, "method_not_allowed", "POST", "GET")
    assert "GET" in r.headers["allow"]
    _assert_error(client.get("/v1/completions"), 405, "method_not_allowed")
    _assert_error(client.delete("/v1/eviction/policy"), 405, "method_not_allowed", "PUT")


def test_an_unexpected_exception_is_a_logged_500_in_json(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("stats exploded")

    monkeypatch.setattr(engine, "eviction_stats", broken)
    with capture_logs() as logs:
        r = client.get("/v1/eviction/stats")
    message = _assert_error(r, 500, "internal_error", "RuntimeError", "stats exploded")
    assert "Traceback" not in message
    entry = next(e for e in logs if e["log_level"] == "error" and e.get("path") == "/v1/eviction/stats")
    assert isinstance(entry["exc_info"], RuntimeError)  # the traceback goes to the log


def test_a_value_error_of_the_engine_itself_is_a_500_not_a_bad_request(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the engine's RequestError means "this request can never be served"; any other
    # ValueError from submit is a bug of ours, answered as one and logged with its traceback.
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bug in submit")

    monkeypatch.setattr(engine, "submit", broken)
    with capture_logs() as logs:
        r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    _assert_error(r, 500, "internal_error", "ValueError", "a bug in submit")
    entry = next(e for e in logs if e["log_level"] == "error" and e.get("path") == "/v1/completions")
    assert isinstance(entry["exc_info"], ValueError)


# ---- shutdown (its own engine: it ends it) ----------------------------------------------------------


def test_shutdown_answers_draining_then_refuses_new_requests() -> None:
    root = tempfile.TemporaryDirectory(prefix="sage-app-", dir="/tmp")
    eng = Engine(_config(Path(root.name)))
    eng.start()
    try:
        client = TestClient(build_app(eng), raise_server_exceptions=False)
        assert _complete(client, "warm up")["choices"][0]["finish_reason"] in ("stop", "length")
        r = client.post("/v1/engine/shutdown")
        assert r.status_code == 200 and r.json() == {"status": "draining"}
        deadline = time.monotonic() + 30
        while not eng.stopped and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.stopped
        assert client.get("/health").json()["status"] == "draining"
        _assert_error(client.post("/v1/completions", json={"prompt": "late"}), 503, "unavailable")
    finally:
        eng.shutdown(drain=False, timeout=10)
        root.cleanup()


# ---- token-level eviction (spec 002) ------------------------------------------------------------


def test_kv_compression_per_request_and_its_errors(client: TestClient) -> None:
    body = _complete(client, SHARED * 2, kv_compression={"policy": "snapkv", "ratio": 0.5})
    assert body["choices"][0]["finish_reason"] in ("length", "stop")
    spec = {"policy": "adakv:knorm,alpha_safeguard=0.5", "ratio": 0.5}  # head-varying, by spec
    assert _complete(client, SHARED * 2, kv_compression=spec)["choices"][0]["finish_reason"] in (
        "length",
        "stop",
    )
    chat = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
              "kv_compression": {"policy": "tova", "ratio": 0.25}},
    )  # fmt: skip
    assert chat.status_code in (200, 400), chat.text  # sage-tiny may have no chat template
    for bad, needle in (
        ({"policy": "lru", "ratio": 0.5}, "sliding, snapkv, h2o, tova"),
        ({"policy": "snapkv", "ratio": 1}, "[0, 1)"),
        ({"policy": "snapkv", "ratio": True}, "[0, 1)"),
        ({"policy": "snapkv"}, '"policy": NAME, "ratio": R'),
        ("snapkv", '"policy": NAME, "ratio": R'),
        # a spec's params are checked on arrival: a 400, not a failed engine step
        ({"policy": "adakv:snapkv,no_such=1", "ratio": 0.5}, "no param 'no_such'"),
        ({"policy": "knorm:3", "ratio": 0.5}, "'3' is not k=v"),
        ({"policy": "leverage:sketch_dimension=0", "ratio": 0.5}, "sketch_dimension must be >= 1"),
    ):
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "kv_compression": bad})
        _assert_error(r, 400, "invalid_value", "kv_compression", needle)


def test_token_policy_hot_swap(client: TestClient) -> None:
    state = client.get("/v1/eviction/token").json()
    assert state["policy"] == "none" and state["eviction_window"] == 1024
    assert state["memory_threshold_bytes"] == 256 * 2**20
    r = client.put("/v1/eviction/token", json={"policy": "h2o"})
    assert r.status_code == 200 and r.json()["old"] == "none" and r.json()["new"] == "h2o"
    assert client.get("/v1/eviction/token").json()["policy"] == "h2o"
    _assert_error(client.put("/v1/eviction/token", json={"policy": "lru"}), 400, "invalid_policy", "tova")
    r = client.put("/v1/eviction/token", json={"policy": "pyramid:snapkv,beta=10"})
    assert r.status_code == 200 and r.json()["new"] == "pyramid" and r.json()["params"]["beta"] == 10
    bad = client.put("/v1/eviction/token", json={"policy": "pyramid:snapkv,beta=0"})
    _assert_error(bad, 400, "invalid_policy", "beta")
    _assert_error(client.put("/v1/eviction/token", json={"policy": 3}), 400, "invalid_value", "policy")
    assert client.put("/v1/eviction/token", json={"policy": "none"}).status_code == 200
