"""Per-salt quotas through the control API on a real sage-tiny engine (issue 51, item 4):
``PUT/GET/DELETE /v1/cache/quotas/{salt}`` and ``GET /v1/cache/quotas``, their bad input, and a
salt flooding under its device quota while another salt's prefix keeps hitting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from engine_adapter.cache.quotas import MAX_QUOTA_SALTS
from engine_adapter.serving.engine import Engine
from tests.engine_fixtures import app_client, serving

QUOTA = 6  # blocks of 4 tokens


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with serving() as started:
        yield started


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with app_client(engine) as http:
        yield http
        for view in engine.quotas():
            engine.delete_quota(view["salt"])
        http.post("/v1/cache/reset")


def _complete(http: TestClient, prompt: str, salt: str) -> dict[str, Any]:
    answer = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "cache_salt": salt})
    assert answer.status_code == 200, answer.text
    usage: dict[str, Any] = answer.json()["usage"]
    return usage


def test_put_get_list_delete(client: TestClient) -> None:
    put = client.put("/v1/cache/quotas/tenant-a", json={"device_blocks": 8, "host_blocks": None})
    assert put.status_code == 200, put.text
    assert put.json()["device_blocks"] == 8 and put.json()["host_blocks"] is None
    assert put.json()["device_blocks_used"] == 0
    got = client.get("/v1/cache/quotas/tenant-a").json()
    assert got["salt"] == "tenant-a" and got["device_blocks"] == 8
    client.put("/v1/cache/quotas/tenant-b", json={"host_blocks": 3})
    listed = client.get("/v1/cache/quotas").json()
    assert [q["salt"] for q in listed["quotas"]] == ["tenant-a", "tenant-b"]
    assert listed["max_salts"] == MAX_QUOTA_SALTS
    deleted = client.delete("/v1/cache/quotas/tenant-a")
    assert deleted.status_code == 200 and deleted.json() == {"salt": "tenant-a", "deleted": True}
    assert client.get("/v1/cache/quotas/tenant-a").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"device_blocks": -1}, "device_blocks"),
        ({"device_blocks": "8"}, "device_blocks"),
        ({"host_blocks": 1.5}, "host_blocks"),
        ({"host_blocks": True}, "host_blocks"),
        ({"device_blocks": 1, "gpu_blocks": 2}, "gpu_blocks"),
        ({}, "device_blocks"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field(
    client: TestClient, body: dict[str, object], field: str
) -> None:
    answer = client.put("/v1/cache/quotas/tenant-a", json=body)
    assert answer.status_code == 400
    assert field in answer.json()["error"]["message"]
    assert client.get("/v1/cache/quotas/tenant-a").status_code == 404  # nothing was set


def test_unknown_salt_is_a_404_and_a_bad_method_a_405(client: TestClient) -> None:
    for method in ("GET", "DELETE"):
        answer = client.request(method, "/v1/cache/quotas/nobody")
        assert answer.status_code == 404 and "no quota" in answer.json()["error"]["message"]
    assert client.post("/v1/cache/quotas/nobody", json={}).status_code == 405
    assert client.put("/v1/cache/quotas/tenant-a", content=b"[1]").status_code == 400
    assert client.put("/v1/cache/quotas/" + "s" * 300, json={"device_blocks": 1}).status_code == 400


def test_the_1025th_salt_is_refused_with_a_409_that_says_so(client: TestClient, engine: Engine) -> None:
    for i in range(MAX_QUOTA_SALTS - 1):  # the engine's own method: 1,023 HTTP calls take seconds
        engine.set_quota(f"s{i}", 1, None)
    assert client.put("/v1/cache/quotas/last", json={"device_blocks": 1}).status_code == 200
    refused = client.put("/v1/cache/quotas/one-more", json={"device_blocks": 1})
    assert refused.status_code == 409
    assert "1024 salts have a quota" in refused.json()["error"]["message"]
    assert client.put("/v1/cache/quotas/s0", json={"device_blocks": 2}).status_code == 200  # a replacement


@pytest.mark.slow  # a dozen completions on a shared CPU: out of the quick loop
def test_a_flooding_salt_stays_within_its_quota_and_another_salts_prefix_still_hits(
    client: TestClient, engine: Engine
) -> None:
    b_prompt = "The system prompt of tenant b, long enough for several blocks of four tokens. " * 2
    first = _complete(client, b_prompt, "b")
    b_blocks = engine.cache.num_cached_blocks  # b's blocks only (the pool of 4096 never evicts)
    assert b_blocks > 0
    assert client.put("/v1/cache/quotas/a", json={"device_blocks": QUOTA}).status_code == 200
    for i in range(12):  # a floods the cache with distinct prompts, far past its quota
        _complete(client, f"Tenant a, question {i}: " + "why is the sky blue? " * (1 + i % 3), "a")
        held = engine.cache.num_cached_blocks - b_blocks  # the tree's own count, not the quota's
        assert held <= QUOTA, (i, held)
    view = client.get("/v1/cache/quotas/a").json()
    assert view["device_blocks_used"] == engine.cache.num_cached_blocks - b_blocks <= QUOTA
    assert view["device_evictions"] > 0
    again = _complete(client, b_prompt, "b")
    read, written = again["prompt_tokens_details"]["cached_tokens"], first["prompt_tokens_details"]
    assert read > 0 and read >= written["cache_write_tokens"] - 4  # b's whole prefix: a took none
    stats = client.get("/v1/eviction/stats").json()
    assert stats["evictions_by_reason"].get("quota", 0) == view["device_evictions"]


def test_stats_and_metrics_show_salts_with_a_quota_only(client: TestClient) -> None:
    client.put("/v1/cache/quotas/tenant-a", json={"device_blocks": 8})
    _complete(client, "A prompt of tenant a, a few blocks long.", "tenant-a")
    _complete(client, "A prompt of tenant z, who has no quota.", "tenant-z")
    stats = client.get("/v1/eviction/stats").json()
    assert [q["salt"] for q in stats["salt_quotas"]] == ["tenant-a"]
    assert 0 < stats["salt_quotas"][0]["device_blocks_used"] <= 8
    text = client.get("/metrics").text
    assert 'sage:salt_quota_limit_blocks{salt="tenant-a",tier="device"} 8.0' in text
    assert 'sage:salt_quota_used_blocks{salt="tenant-a",tier="device"}' in text
    assert 'sage:salt_quota_hit_blocks{event="own_eviction",salt="tenant-a"}' in text
    assert 'sage:salt_quota_limit_blocks{salt="tenant-a",tier="host"}' not in text  # uncapped
    assert "tenant-z" not in text  # a salt without a quota has no series
    client.delete("/v1/cache/quotas/tenant-a")
    assert "tenant-a" not in client.get("/metrics").text
    assert client.get("/v1/eviction/stats").json()["salt_quotas"] == []


def test_any_salt_a_request_can_carry_has_its_route(client: TestClient) -> None:
    for salt in ("tenant/a?x=1", "line\nbreak", "ünï cödé"):
        path = "/v1/cache/quotas/" + quote(salt, safe="")
        assert client.put(path, json={"device_blocks": 3}).status_code == 200, salt
        assert client.get(path).json()["salt"] == salt
        assert client.delete(path).status_code == 200
