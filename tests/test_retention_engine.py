"""The prompt-cache contract through a real engine (sage-tiny on the CPU): `Engine.submit`
with a `CacheContract` fills `RequestOutput.written_tokens` and `retention_ttl_s`, the usage adds
up (written + read + uncached = prompt tokens), a lifetime keeps a session's prefix through a
pool that turns over, and the counters reach `/v1/eviction/stats` and `/metrics`."""

from __future__ import annotations

import pytest
from engine_fixtures import started_engine
from prometheus_client import generate_latest

from engine_adapter.cache.contract import CacheContract
from engine_adapter.model.sampling import SamplingParams

pytestmark = pytest.mark.slow  # a real engine: out of the quick loop

SYSTEM = list(range(1, 41))  # 40 token ids: ten 4-token blocks


def _ask(engine: object, prompt: list[int], contract: CacheContract | None = None) -> object:
    return engine.submit(prompt, SamplingParams(max_tokens=3), cache_contract=contract).result(60)  # type: ignore[attr-defined]


def test_usage_adds_up_and_reports_the_lifetime_granted() -> None:
    engine = started_engine(max_cache_ttl=600.0)
    try:
        first = _ask(engine, [*SYSTEM, 50, 51], CacheContract(ttl_s=3600.0))
        second = _ask(engine, [*SYSTEM, 60, 61, 62, 63, 64], CacheContract(ttl_s=60.0))
        plain = _ask(engine, [70, 71, 72, 73, 74])
    finally:
        engine.shutdown()
    assert (first.cached_tokens, first.written_tokens, first.retention_ttl_s) == (0, 40, 600.0)
    assert (second.cached_tokens, second.written_tokens, second.retention_ttl_s) == (40, 4, 60.0)
    assert plain.written_tokens == 4 and plain.retention_ttl_s is None
    for out in (first, second, plain):
        assert out.written_tokens + out.cached_tokens <= out.prompt_tokens


def test_explicit_writes_and_generated_tokens_are_not_cached() -> None:
    engine = started_engine()
    try:
        out = _ask(engine, SYSTEM, CacheContract(write_tokens=16))
        assert out.written_tokens == 16
        # only the breakpoint's four blocks entered the cache; the rest and the output were freed
        assert engine.cache.num_cached_blocks == 4
    finally:
        engine.shutdown()


def test_a_lifetime_keeps_a_session_prefix_through_pool_turnover() -> None:
    # 40 blocks, no lower tier: retention pins hold the session's ten blocks (a quarter of the
    # pool) while plain traffic turns the rest over several times
    engine = started_engine(num_blocks=40, max_retained_fraction=0.25, max_pinned_ratio=0.5)
    try:
        _ask(engine, [*SYSTEM, 99], CacheContract(ttl_s=3600.0))
        for i in range(30):
            base = 100 + (i * 37) % 120
            _ask(engine, [i % 7 + 1, *list(range(base, base + 35))])
        back = _ask(engine, [*SYSTEM, 98], CacheContract(ttl_s=3600.0))
        stats = engine.eviction_stats()
        text = generate_latest(engine.metrics_registry()).decode()
    finally:
        engine.shutdown()
    assert back.cached_tokens == 40
    assert stats.total_evictions > 0 and stats.preemptions == 0
    assert stats.retained_blocks == 10 and stats.retention_broken_blocks == 0
    assert "sage:prompt_cache_retained_blocks 10.0" in text
    assert 'sage:prompt_cache_retention_blocks_total{event="granted"}' in text
    assert "sage:prompt_cache_written_tokens_total" in text
