"""``GET /v1/cache/requests/{id}`` on a real engine (sage-tiny on the CPU, 4-token blocks): a
request that misses because of (a) first use, (b) an eviction of its prefix (a small pool; the
eviction's explanation with --explain), (c) a different salt, (d) explicit mode without a
breakpoint, (e) a lifetime that lapsed is told so, block run by block run; the receipt's counts are
the usage's and add up to the prompt for any mix of requests (hypothesis); an unknown id is a
404 with a JSON error; the totals per tenant and salt reach ``/v1/eviction/stats`` and /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_fixtures import app_client, serving
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from engine_adapter.cache.receipts import salt_label

pytestmark = pytest.mark.slow  # real engines: out of the quick loop


def _complete(client: TestClient, prompt: str, **fields: Any) -> dict[str, Any]:
    answer = client.post(
        "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0, **fields}
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _receipt(client: TestClient, completion: dict[str, Any]) -> dict[str, Any]:
    answer = client.get(f"/v1/cache/requests/{completion['id']}")
    assert answer.status_code == 200, answer.text
    receipt: dict[str, Any] = answer.json()
    usage = completion["usage"]
    details = usage["prompt_tokens_details"]
    assert receipt["prompt_tokens"] == usage["prompt_tokens"]
    assert receipt["cached_tokens"] == details["cached_tokens"]
    assert receipt["written_tokens"] == details["cache_write_tokens"]
    read = sum(receipt["read_tokens"].values())
    assert read + receipt["written_tokens"] + receipt["uncached_tokens"] == receipt["prompt_tokens"]
    assert sum(m["tokens"] for m in receipt["misses"]) == receipt["prompt_tokens"] - read
    return receipt


def _first_miss(receipt: dict[str, Any]) -> dict[str, Any]:
    miss: dict[str, Any] = receipt["misses"][0]
    return miss


@pytest.fixture(scope="module")
def small() -> Iterator[TestClient]:
    """A pool of 48 blocks that evicts with explanations; lifetimes may hold half of it."""
    with serving(num_blocks=48, max_retained_fraction=0.5, explain_evictions=True) as engine:
        yield app_client(engine)


def test_each_reason_is_named_for_the_blocks_it_cost(small: TestClient) -> None:
    pa, pd, pe, pb = (
        "alpha beta gamma delta ",
        "delta omicron sigma ",
        "epsilon kappa rho ",
        "beta zeta eta theta ",
    )
    first = _receipt(small, _complete(small, pa))
    assert _first_miss(first)["reason"] == "first_use" and _first_miss(first)["first_block"] == 0
    salted = _receipt(small, _complete(small, pa, cache_salt="tenant-b"))
    assert salted["salt"] == salt_label("tenant-b") and "tenant-b" not in str(salted)
    other = _first_miss(salted)
    assert (other["reason"], other["salt"], other["cached"], other["first_block"]) == (
        "other_salt",
        None,
        True,
        0,
    )
    _receipt(small, _complete(small, pd, prompt_cache_options={"mode": "explicit"}))  # writes nothing
    explicit = _first_miss(_receipt(small, _complete(small, pd)))
    assert explicit["reason"] == "explicit_mode" and explicit["first_block"] == 0
    kept = _receipt(small, _complete(small, pe, prompt_cache_options={"ttl": "1s"}))
    assert kept["retention_ttl_s"] == 1.0
    _complete(small, pb)
    time.sleep(1.2)  # pe's lifetime lapses
    for i in range(10):  # distinct prompts: the pool of 48 blocks turns over once, the ghosts stay
        _complete(small, f"{i:02d} flood of other words")
    evicted = _first_miss(_receipt(small, _complete(small, pb)))
    assert evicted["reason"] == "evicted" and evicted["policy"] == "lru" and evicted["first_block"] == 0
    assert evicted["explanation"] is not None and evicted["explanation"]["id"] == evicted["eviction_id"]
    lapsed = _first_miss(_receipt(small, _complete(small, pe)))
    assert lapsed["reason"] == "lapsed" and lapsed["lapsed_at"] <= lapsed["at"]


def test_an_unknown_request_is_a_404_with_a_json_error(small: TestClient) -> None:
    answer = small.get("/v1/cache/requests/cmpl-never-served")
    assert answer.status_code == 404
    assert (
        answer.json()["error"]["type"] == "not_found"
        and "cmpl-never-served" in answer.json()["error"]["message"]
    )


@pytest.fixture(scope="module")
def large() -> Iterator[TestClient]:
    with serving(num_blocks=256) as engine:
        yield app_client(engine)


_WORDS = ("system prompt ", "tools list ", "user asks ", "answer text ", "more context ")


@settings(max_examples=12, deadline=None)
@given(
    parts=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=6),
    salt=st.sampled_from([None, "s1", "s2"]),
    tenant=st.sampled_from([None, "t1"]),
    explicit=st.booleans(),
)
def test_the_usage_adds_up_for_any_mix(
    large: TestClient, parts: list[str], salt: str | None, tenant: str | None, explicit: bool
) -> None:
    fields: dict[str, Any] = {"cache_salt": salt, "tenant": tenant}
    if explicit:
        fields["prompt_cache_options"] = {"mode": "explicit"}
    receipt = _receipt(large, _complete(large, "".join(parts), **fields))
    assert receipt["tenant"] == tenant and receipt["salt"] == salt_label(salt)


def test_the_totals_reach_the_stats_and_metrics(large: TestClient) -> None:
    _complete(large, "totals by tenant and salt " * 2, cache_salt="acct", tenant="t-acct")
    stats = large.get("/v1/eviction/stats").json()
    rows = [a for a in stats["cache_accounts"] if a["tenant"] == "t-acct" and a["salt"] == salt_label("acct")]
    assert len(rows) == 1 and rows[0]["requests"] >= 1 and rows[0]["written_tokens"] > 0
    text = large.get("/metrics").text
    salt = salt_label("acct")
    assert f'sage:prompt_cache_account_tokens_total{{kind="written",salt="{salt}",tenant="t-acct"}}' in text
    assert (
        f'sage:prompt_cache_account_requests_total{{event="admitted",salt="{salt}",tenant="t-acct"}} 1.0'
        in text
    )


def test_a_chat_sent_again_as_its_text_is_told_retokenised() -> None:
    """The same conversation as a chat (its rendered text, no bos) and then that text as a
    completion's prompt (a bos first): the second misses every block of the shared text, and its
    receipt says the text tokenised differently, with how many characters matched."""
    from engine_adapter.model.chat_template import parse_messages, render_chat

    messages = [{"role": "user", "content": "Where do the evicted blocks of a long prompt go? " * 4}]
    with serving() as engine:
        client = app_client(engine)
        body = {"messages": messages, "max_tokens": 1, "temperature": 0}
        chat = client.post("/v1/chat/completions", json=body)
        assert chat.status_code == 200, chat.text
        assert _first_miss(_receipt(client, chat.json()))["reason"] == "first_use"
        template = engine.tokenizer.chat_template
        assert template is not None
        text = render_chat(template, parse_messages(messages))
        again = _receipt(client, _complete(client, text))
    told = _first_miss(again)
    assert again["cached_tokens"] == 0
    assert (told["reason"], told["first_block"]) == ("retokenised", 0)
    assert told["text_chars"] == len(text) // 64 * 64
    assert told["tokens"] >= told["text_chars"]  # every block that starts within the shared text
