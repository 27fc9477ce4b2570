"""`sage_cli.benchmark.remote`'s counter arithmetic over the real ``/metrics`` text of real sage
engines (in-process, behind their HTTP app): one engine's counters, and a fleet's hit ratio,
served shares and load spread, each checked against the engines' own ``/v1/eviction/stats``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_fixtures import app_client, started_engine
from starlette.testclient import TestClient

from engine_adapter.serving.engine import Engine
from sage_cli.benchmark.options import EngineKind
from sage_cli.benchmark.remote import RemoteBenchmarkError, engine_counters, fleet_figures
from sage_cli.benchmark.replay import prompt_tokens


@pytest.fixture(scope="module")
def two_engines() -> Iterator[list[tuple[Engine, TestClient]]]:
    engines = [started_engine(name=f"remote{i}") for i in range(2)]
    try:
        yield [(engine, app_client(engine)) for engine in engines]
    finally:
        for engine in engines:
            engine.shutdown(drain=False, timeout=10)


def _complete(client: TestClient, blocks: list[int]) -> None:
    body = {"prompt": prompt_tokens(blocks, 4), "max_tokens": 2, "ignore_eos": True, "temperature": 0.0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


def _stats(client: TestClient) -> tuple[int, int]:
    stats = client.get("/v1/eviction/stats").json()
    return stats["prefix_cache_queries_tokens"], stats["prefix_cache_hits_tokens"]


@pytest.mark.slow  # two engines start (~5 s)
def test_one_engine_s_counters_move_by_what_it_served(two_engines: list[tuple[Engine, TestClient]]) -> None:
    _, client = two_engines[0]
    before = engine_counters(client.get("/metrics").text, EngineKind.sage)
    stats_before = _stats(client)
    for tail in (100, 101, 102):  # a shared 3-block head: the 2nd and 3rd requests hit it
        _complete(client, [1, 2, 3, tail])
    delta = engine_counters(client.get("/metrics").text, EngineKind.sage) - before
    stats_after = _stats(client)
    assert delta.served == 3
    assert (delta.queries, delta.hits) == (
        stats_after[0] - stats_before[0],
        stats_after[1] - stats_before[1],
    )
    assert delta.hits >= 2 * 12 and delta.queries >= 3 * 16


@pytest.mark.slow  # two engines start (~5 s)
def test_a_fleet_sums_its_engines_and_reports_each_one_s_share(
    two_engines: list[tuple[Engine, TestClient]],
) -> None:
    clients = [client for _, client in two_engines]
    before = [engine_counters(c.get("/metrics").text, EngineKind.sage) for c in clients]
    stats_before = [_stats(c) for c in clients]
    for tail in range(3):  # engine 0: three requests on a head it already holds
        _complete(clients[0], [1, 2, 3, 200 + tail])
    for tail in range(2):  # engine 1: a cold head, then a hit on it
        _complete(clients[1], [7, 8, 9, 300 + tail])
    after = [engine_counters(c.get("/metrics").text, EngineKind.sage) for c in clients]
    stats = [
        (a[0] - b[0], a[1] - b[1]) for a, b in zip((_stats(c) for c in clients), stats_before, strict=True)
    ]
    fleet = fleet_figures(["http://e0", "http://e1"], before, after)
    queries, hits = sum(s[0] for s in stats), sum(s[1] for s in stats)
    assert stats[0][1] > 0 and stats[1][1] > 0  # both engines hit: the sum is over both
    assert fleet["hit_rate"] == pytest.approx(hits / queries)
    assert (fleet["prefix_cache_queries_tokens"], fleet["prefix_cache_hits_tokens"]) == (queries, hits)
    assert [w["requests_served"] for w in fleet["workers"]] == [3, 2]
    assert [w["served_share"] for w in fleet["workers"]] == [0.6, 0.4]
    assert fleet["load_spread"] == pytest.approx(1.2) and fleet["served"] == "3/2"
    assert [
        (w["prefix_cache_queries_tokens"], w["prefix_cache_hits_tokens"]) for w in fleet["workers"]
    ] == stats


@pytest.mark.slow  # two engines start (~5 s)
def test_the_wrong_kind_s_counters_or_a_page_that_is_not_prometheus_are_refused(
    two_engines: list[tuple[Engine, TestClient]],
) -> None:
    text = two_engines[0][1].get("/metrics").text
    with pytest.raises(RemoteBenchmarkError, match=r"no vllm:prefix_cache_queries or vllm:prefix_cache_hits"):
        engine_counters(text, EngineKind.vllm, "http://127.0.0.1:9")
    with pytest.raises(RemoteBenchmarkError, match=r"--worker-url"):
        engine_counters("<html><body>router</body></html>", EngineKind.sage, "http://127.0.0.1:9")


def test_an_idle_fleet_has_no_hit_ratio_to_divide_and_no_spread() -> None:
    zero = engine_counters(
        "# TYPE sage:prefix_cache_queries counter\nsage:prefix_cache_queries_total 5.0\n"
        "# TYPE sage:prefix_cache_hits counter\nsage:prefix_cache_hits_total 2.0\n",
        EngineKind.sage,
    )
    fleet = fleet_figures(["http://e0"], [zero], [zero])
    assert (fleet["hit_rate"], fleet["load_spread"], fleet["served"]) == (0.0, None, "0")
