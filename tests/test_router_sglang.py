"""SGLang's real router (``sglang-router``, in its venv: scripts/integration_venvs.sh
sglang-router) in front of two real sage engines, each its own process on 127.0.0.1: it
registers them (reading their server and model info), routes chats and completions to both and
brings the answers back, and its /flush_cache empties both engines' prefix caches.
benchmarks/fleet.py starts and stops the processes for both."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FLEET = Path(__file__).resolve().parent.parent / "benchmarks" / "fleet.py"


def _fleet_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_under_test", FLEET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


fleet = _fleet_module()


@pytest.fixture(scope="module")
def routed() -> Iterator[tuple[str, list[Any]]]:
    try:
        fleet.router_binary("sglang")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with tempfile.TemporaryDirectory(prefix="sage-router-") as work:
        procs = fleet.Fleet(Path(work))
        try:
            engines = fleet.start_engines(procs, 2, "sage-tiny", 512, Path(work) / "home")
            port = fleet.free_port()
            cmd = fleet.router_command("sglang", "round_robin", port, engines, 16, "sage-tiny")
            router = procs.spawn("router", cmd)
            url = f"http://127.0.0.1:{port}"
            fleet.wait_until(
                "router", lambda: len(fleet.http("GET", f"{url}/v1/models")["data"]) == 1, 120, router
            )
            yield url, engines
        finally:
            procs.stop_all()


@pytest.mark.slow
def test_the_router_spreads_real_requests_over_both_engines_and_answers_come_back(
    routed: tuple[str, list[Any]],
) -> None:
    url, engines = routed
    assert fleet.http("GET", f"{url}/v1/models")["data"][0]["id"] == "sage-tiny"
    before = [e.stats()[2] for e in engines]
    for i in range(4):
        body = {
            "model": "sage-tiny",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 3,
        }
        answer = fleet.http("POST", f"{url}/v1/chat/completions", body)
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 3
    done = fleet.http(
        "POST", f"{url}/v1/completions", {"model": "sage-tiny", "prompt": "hello", "max_tokens": 2}
    )
    assert done["choices"][0]["finish_reason"] == "length"
    served = [e.stats()[2] - b for e, b in zip(engines, before, strict=True)]
    assert sum(served) == 5 and min(served) >= 2  # round robin: both engines served


@pytest.mark.slow
def test_the_router_s_flush_empties_every_engine_s_prefix_cache(routed: tuple[str, list[Any]]) -> None:
    url, engines = routed
    for _ in range(2):
        body = {
            "model": "sage-tiny",
            "messages": [{"role": "user", "content": "a shared prompt " * 4}],
            "max_tokens": 1,
        }
        fleet.http("POST", f"{url}/v1/chat/completions", body)
    assert sum(fleet.http("GET", f"{e.url}/v1/cache/usage")["cached_blocks"] for e in engines) > 0
    flushed = fleet.http("POST", f"{url}/flush_cache")
    assert flushed["workers_flushed"] == 2
    assert [fleet.http("GET", f"{e.url}/v1/cache/usage")["cached_blocks"] for e in engines] == [0, 0]
