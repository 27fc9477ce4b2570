"""The engine with KV tiers (issue 30): greedy outputs with a tiny pool over a host (and disk)
tier equal those of an unbounded pool, the tiers are hit, and a lost disk file is a miss."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_fixtures import app_client, started_engine
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.cache.stats import TierStats
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.engine import Engine
from sage_cli.eviction.render import render_stats

pytestmark = pytest.mark.slow  # sage-tiny engines, several rounds of requests

SYSTEM = "You are a careful assistant. "
PROMPTS = [
    SYSTEM + "Tell me about caches.",
    SYSTEM + "Tell me about queues.",
    SYSTEM + "Tell me about caches, again.",
    "A different prefix entirely: " + "x" * 11,
    SYSTEM + "Tell me about caches.",
    "Short.",
]


def _run_all(engine: Engine, prompts: list[str], max_tokens: int = 16) -> list[list[int]]:
    handles = [engine.submit(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    return [h.result(timeout=120).token_ids for h in handles]


def _tier(engine: Engine, name: str) -> TierStats:
    return next(t for t in engine.cache.stats().tiers if t.tier == name)


@pytest.fixture(scope="module")
def reference_outputs() -> list[list[int]]:
    engine = started_engine()  # 4096 blocks: nothing is ever evicted
    try:
        return _run_all(engine, PROMPTS)
    finally:
        engine.shutdown()


def test_greedy_outputs_with_a_host_tier_equal_an_unbounded_pool(reference_outputs: list[list[int]]) -> None:
    # 24 blocks of 4 tokens under six ~12-block sequences: evictions (demotions to host) and
    # preemptions; the second round finds its prefixes on host and loads them back.
    engine = started_engine(num_blocks=24, host_kv_cache="128KiB")
    try:
        assert engine.tiers.host is not None and 0 < engine.tiers.host_blocks <= 32
        first = _run_all(engine, PROMPTS)
        second = _run_all(engine, PROMPTS)
        engine.cache.check_invariants()
        host = _tier(engine, "host")
        copies = engine.info()["tier_copies"]
        client = app_client(engine)
        metrics = client.get("/metrics").text
        shown = render_stats(client.get("/v1/eviction/stats").json())
    finally:
        engine.shutdown()
    assert first == reference_outputs
    assert second == reference_outputs
    assert host.demotions > 0 and host.hits > 0 and host.promotions > 0
    # every copy the core counted, the executor ran (no disk: each is into or out of host)
    assert copies["moves"] == host.blocks_moved_in + host.blocks_moved_out and copies["failed"] == 0
    # what a user looks at says the same: /metrics and `sage llm eviction stats`
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
    }
    for event, count in (("demotions", host.demotions), ("hits", host.hits), ("promotions", host.promotions)):
        assert samples[("sage:kv_tier_blocks_total", (("event", event), ("tier", "host")))] == count
    assert samples[("sage:kv_tier_capacity_blocks", (("tier", "host"),))] == host.capacity_blocks
    assert samples[("sage:kv_tier_copy_duration_seconds_count", ())] > 0
    line = next(x for x in shown.splitlines() if x.startswith("  Host Tier"))
    assert line.startswith(
        f"  Host Tier (lru): {host.used_blocks} / {host.capacity_blocks} blocks, {host.hits} hits, "
        f"{host.demotions} demotions, {host.promotions} promotions, {host.drops} drops, "
        f"load p50 {host.load_time_p50_ms:.2f}ms p99 {host.load_time_p99_ms:.2f}ms"
    )
    assert host.loads > 0
    assert samples[("sage:kv_tier_load_duration_seconds_count", (("tier", "host"),))] == host.loads


def test_lost_disk_files_are_misses_not_wrong_answers(
    reference_outputs: list[list[int]], tmp_path: Path
) -> None:
    # A host tier of a few blocks demotes to disk; between the rounds every disk file goes.
    disk_dir = tmp_path / "kv"
    engine = started_engine(
        num_blocks=24, host_kv_cache="16KiB", disk_kv_cache=str(disk_dir), disk_kv_size="1MiB"
    )
    copy = engine.scheduler.tier_copier
    assert copy is not None
    failed: list[TierMove] = []

    def counted(moves: list[TierMove]) -> list[TierMove]:
        these = copy(moves)
        failed.extend(these)
        return these

    engine.scheduler.tier_copier = counted  # between steps: the loop reads it each step
    try:
        first = _run_all(engine, PROMPTS)
        demoted = _tier(engine, "disk").demotions
        files = list(disk_dir.iterdir())
        for file in files:
            file.unlink()
        second = _run_all(engine, PROMPTS)
        engine.cache.check_invariants()
        disk = _tier(engine, "disk")
    finally:
        engine.shutdown()
    assert first == reference_outputs
    assert second == reference_outputs
    assert demoted > 0 and files
    assert failed and all(m.src_tier is Tier.DISK for m in failed)  # the loads of the lost files
    assert disk.drops > 0  # they dropped their blocks
