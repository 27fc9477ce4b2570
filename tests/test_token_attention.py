"""The scheduler feeds real attention to the token policies that score by it (issue 28, item 3).

snapkv, h2o and tova score tokens by what the decoder's `AttentionObserver` collected while the
sequence ran; without it (a sequence that started before the policy was swapped in) they keep
the newest tokens. Here, on sage-tiny:

- the contract of every policy that asks for an observer: without one it says why
  (`attention_missing`) and keeps exactly the newest tokens; with one it needs nothing more;
- the engine's prompt compression (a request's ``kv_compression``) decodes exactly as the same
  policy run straight on the decoder with its observer (`generate_compressed`, the path the
  kvpress differential tests pin to kvpress), with no fallback;
- compressions under memory pressure while sequences decode score by attention every time;
- a sequence admitted before a swap falls back, and that is logged, counted in the stats and
  ``/metrics``, and named in its ``compress`` event.
"""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import app_client
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from engine_adapter.model import load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.token_eviction import KVCompression
from engine_adapter.token_eviction.generate import generate_compressed, prefill
from engine_adapter.token_eviction.presses.base import top_kept
from engine_adapter.token_eviction.presses.none import NoEvictionPolicy
from engine_adapter.token_eviction.registry import make_token_policy, token_policy_names

# Every registered policy that asks the decoder for attention (a new one is tested the day it
# is registered); the three of the issue among them.
ATTENTION_SCORED = [n for n in token_policy_names() if make_token_policy(n).make_observer() is not None]
PROMPT = [int(t) for t in torch.randint(3, 250, (100,), generator=torch.Generator().manual_seed(7))]


def test_the_attention_scored_policies_are_known() -> None:
    assert {"snapkv", "h2o", "tova"} <= set(ATTENTION_SCORED)


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    model, _tokenizer, _config = load_model("sage-tiny", device="cpu")
    return model


@pytest.mark.slow  # two prefills and a keep per layer, per policy: seconds on a shared CPU
@pytest.mark.parametrize("name", ATTENTION_SCORED)
def test_without_attention_a_policy_says_why_and_keeps_the_newest(decoder: Decoder, name: str) -> None:
    policy = make_token_policy(name)
    # Room for both prefills (50 blocks) and a replay press's replay of the context (kvzip, skim)
    pool = decoder.make_pool(num_blocks=128, block_size=4)
    blind, _ = prefill(decoder, pool, PROMPT, NoEvictionPolicy())  # no observer
    seeing, _ = prefill(decoder, pool, PROMPT, policy)
    assert "no attention observer" in (policy.attention_missing(blind) or "")
    assert policy.attention_missing(seeing) is None
    target = 75
    newest = torch.arange(len(PROMPT) - target, len(PROMPT))
    # A budget wrapper (adakv, pyramid) scores by its inner press, which it asks the same question.
    scorer = getattr(policy, "press", policy)
    for layer in range(blind.num_layers):
        kept = top_kept(scorer.scores(blind, layer, target), target)
        assert all(_sinks_then_newest(row.tolist(), len(PROMPT)) for row in kept), (name, layer)
    scored, _counts = scorer.select(seeing, target)  # kvzip's rows differ in length per head
    assert not all(torch.equal(row, newest) for row in scored.flatten(0, 1)), name  # attention chose


def _sinks_then_newest(kept: list[int], length: int) -> bool:
    """Whether `kept` is the newest tokens, after the first few (the attention sinks that
    compactor and expected_attention keep by recency too): 0..s-1, then the last len - s."""
    kept = sorted(kept)
    sinks = 0
    while sinks < len(kept) and kept[sinks] == sinks:
        sinks += 1
    return sinks <= 8 and kept[sinks:] == list(range(length - (len(kept) - sinks), length))


def _engine(**overrides: object) -> Engine:
    values: dict[str, object] = {
        "device": "cpu",
        "block_size": 4,
        "num_blocks": 256,
        "name": "attention",
        "socket": "/tmp/sage-test-unused.sock",
        "memory_threshold": 0,
    }
    values.update(overrides)
    engine = Engine(EngineConfig(**values))  # type: ignore[arg-type]
    engine.start()
    return engine


def _compress_events(engine: Engine) -> list[dict[str, object]]:
    return [e for e in engine.eviction_events(10_000) if e["event"] == "compress"]


@pytest.mark.slow  # an engine and the direct path per policy
@pytest.mark.parametrize("name", ATTENTION_SCORED)
def test_a_prompt_compressed_in_the_engine_decodes_as_on_the_decoder(decoder: Decoder, name: str) -> None:
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    engine = _engine()
    try:
        served = engine.submit(PROMPT, greedy, kv_compression=KVCompression(name, 0.5)).result(60)
        [event] = _compress_events(engine)
        stats = engine.token_eviction()
    finally:
        engine.shutdown()
    direct = generate_compressed(
        decoder,
        decoder.make_pool(num_blocks=64, block_size=4),
        PROMPT,
        make_token_policy(name),
        0.5,
        max_new_tokens=8,
    )
    assert served.token_ids == direct.token_ids
    assert event["fallback"] is None and stats["attention_fallbacks"] == {}


@pytest.mark.slow  # an engine per policy, a few dozen compressions
@pytest.mark.parametrize("name", ATTENTION_SCORED)
def test_compressions_under_pressure_score_by_attention(name: str) -> None:
    engine = _engine(token_eviction=name, memory_threshold=10**6)  # always under the threshold
    try:
        handles = [
            engine.submit(PROMPT[i:] + PROMPT[:i], SamplingParams(max_tokens=40, ignore_eos=True))
            for i in (0, 5)
        ]
        assert [h.result(60).finish_reason for h in handles] == ["length", "length"]
        stats = engine.token_eviction()
        events = _compress_events(engine)
    finally:
        engine.shutdown()
    assert stats["compressions"] >= 2 and stats["by_reason"].get("pressure", 0) >= 2
    if make_token_policy(name).track_tokens:
        # A replay press (kvzip, skim) cannot replay a sequence it compacted before (its ids
        # are gone); one that keeps a full-budget head frees little, so the sequence grows back
        # and is compressed again: only each sequence's first compression must replay.
        first: dict[object, dict[str, object]] = {}
        for e in events:
            first.setdefault(e["sequence_id"], e)
        assert all(e["fallback"] is None for e in first.values())
        assert all(e["fallback"] is None or "not all known" in str(e["fallback"]) for e in events)
        return
    assert stats["attention_fallbacks"] == {} and stats["attention_fallbacks_total"] == 0
    assert all(e["fallback"] is None for e in events)


@pytest.mark.slow  # an engine decoding through a swap
def test_a_fallback_is_logged_counted_and_named() -> None:
    engine = _engine(token_eviction="none", memory_threshold=10**6)
    client = app_client(engine)
    try:
        with capture_logs() as logs:
            # Long enough that the swap lands while it decodes, even when the swap waits a while
            # for the cache lock on a loaded machine (at 120 tokens it once finished first).
            handle = engine.submit(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True))
            next(iter(handle))  # decoding, with no observer: `none` asks for nothing
            engine.set_token_policy("tova")
            assert handle.result(60).finish_reason == "length"
        stats = engine.token_eviction()
        assert stats["attention_fallbacks"].get("tova", 0) >= 1
        fallen = [e for e in _compress_events(engine) if e["fallback"]]
        assert fallen and all("no attention observer" in str(e["fallback"]) for e in fallen)
        assert len(fallen) == stats["attention_fallbacks_total"]
        warnings = [r for r in logs if r["event"] == "token policy fell back to recency"]
        assert warnings and warnings[0]["policy"] == "tova" and warnings[0]["log_level"] == "warning"
        metrics = client.get("/metrics").text
        counted = [
            s.value
            for f in text_string_to_metric_families(metrics)
            for s in f.samples
            if s.name == "sage:token_attention_fallbacks_total" and s.labels == {"policy": "tova"}
        ]
        assert counted == [len(fallen)]
        assert client.get("/v1/eviction/token").json()["attention_fallbacks"] == {"tova": len(fallen)}
        # a request admitted after the swap has its observer: compressed, never by recency
        before = stats["compressions"]
        engine.submit(PROMPT[::-1], SamplingParams(max_tokens=30, ignore_eos=True)).result(60)
        after = engine.token_eviction()
        assert after["compressions"] > before and after["attention_fallbacks_total"] == len(fallen)
    finally:
        engine.shutdown()
