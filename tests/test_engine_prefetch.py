"""Prefetch in the engine (issue 30, ``--prefetch``): greedy outputs with prefetch equal an
unbounded pool's, the 24-block pool with six requests that a held prefetch stalled finishes, a
request that leaves the queue has its prefetch forgotten, and the figures reach the stats,
``/metrics`` and ``sage llm eviction stats``."""

from __future__ import annotations

from typing import Any

import pytest
import test_engine_tiers
from engine_fixtures import app_client, started_engine
from prometheus_client.parser import text_string_to_metric_families
from test_engine_tiers import PROMPTS, _run_all

from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.engine import Engine
from sage_cli.eviction.render import render_stats

# The unbounded pool's greedy outputs: the tier tests' fixture, one per module.
reference_outputs = test_engine_tiers.reference_outputs

pytestmark = pytest.mark.slow  # sage-tiny engines, several rounds of requests


def _two_rounds(engine: Engine) -> tuple[list[list[int]], list[list[int]]]:
    try:
        return _run_all(engine, PROMPTS), _run_all(engine, PROMPTS)
    finally:
        engine.cache.check_invariants()


def test_greedy_outputs_with_prefetch_equal_an_unbounded_pool(reference_outputs: list[list[int]]) -> None:
    # Two running at a time: the others queue while their prefixes sit on host, and are
    # prefetched into the room the running two leave.
    engine = started_engine(num_blocks=24, host_kv_cache="128KiB", max_num_seqs=2)
    try:
        first, second = _two_rounds(engine)
        stats = engine.cache.stats()
        client = app_client(engine)
        metrics = client.get("/metrics").text
        shown = render_stats(client.get("/v1/eviction/stats").json())
    finally:
        engine.shutdown()
    assert first == reference_outputs and second == reference_outputs
    host = stats.tiers[0]
    assert host.prefetched_blocks > 0 and host.prefetch_hits > 0
    assert (stats.prefetched_blocks, stats.prefetch_hits) == (host.prefetched_blocks, host.prefetch_hits)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
    }
    for event, count in (("prefetched", host.prefetched_blocks), ("prefetch_hits", host.prefetch_hits)):
        assert samples[("sage:kv_tier_blocks_total", (("event", event), ("tier", "host")))] == count
    line = next(x for x in shown.splitlines() if x.startswith("  Host Tier"))
    assert line.endswith(f", {host.prefetched_blocks} prefetched ({host.prefetch_hits} used)")


@pytest.mark.parametrize("max_num_seqs", [256, 1])
def test_a_small_pool_with_many_queued_requests_finishes(
    reference_outputs: list[list[int]], max_num_seqs: int
) -> None:
    # The case a held prefetch (its path locked until admission, no share of the room) stalled:
    # 24 blocks of 4 tokens, six ~12-block requests, twice. A stall is a timeout here.
    engine = started_engine(num_blocks=24, host_kv_cache="128KiB", max_num_seqs=max_num_seqs)
    try:
        first, second = _two_rounds(engine)
        prefetched = engine.cache.stats().prefetched_blocks
    finally:
        engine.shutdown()
    assert first == reference_outputs and second == reference_outputs
    if max_num_seqs == 1:
        assert prefetched > 0  # the queue was prefetched for, and still nothing stalled


def test_a_request_that_leaves_the_queue_has_its_prefetch_forgotten() -> None:
    # generated tokens cached too (the engine frees them by default): their blocks push the
    # queued prompt's down to host, which its prefetch needs
    engine = started_engine(
        num_blocks=40, host_kv_cache="128KiB", max_num_seqs=1, cache_generated_tokens=True
    )
    prefetches = engine.cache._prefetches
    assert prefetches is not None and engine.scheduler.prefetch is not None
    seen: dict[str, Any] = {}
    real_step = engine.scheduler.step
    try:
        _run_all(engine, PROMPTS[2:] + PROMPTS[:2])  # the queued prompt's blocks go down to host
        long = engine.submit(PROMPTS[3], SamplingParams(max_tokens=32, ignore_eos=True))
        queued = engine.submit(PROMPTS[2], SamplingParams(max_tokens=4, ignore_eos=True))

        def step_then_abort() -> object:  # on the engine thread, under the cache's lock
            stats = real_step()
            waiting = {s.request_id: s for s in engine.scheduler.waiting}
            seq = waiting.get(queued.request_id)
            if "aborted" not in seen and seq is not None and seq.seq_id in prefetches.promoted:
                blocks = [b for b, _ in prefetches.promoted[seq.seq_id]]
                seen["locked"] = [b.ref_count for b in blocks]
                engine.scheduler.abort(queued.request_id)
                seen["aborted"] = seq.seq_id in prefetches.promoted
                seen["budget"] = prefetches.num_promoted
            return stats

        engine.scheduler.step = step_then_abort  # type: ignore[method-assign]
        long.result(timeout=120)
        final = queued.result(timeout=120)
        engine.cache.check_invariants()
    finally:
        engine.scheduler.step = real_step  # type: ignore[method-assign]
        engine.shutdown()
    assert seen, "the queued request was never prefetched for"
    assert all(count == 0 for count in seen["locked"])  # a loose prefetch locks nothing
    assert seen["aborted"] is False and seen["budget"] == 0  # forgotten, its budget back
    assert final.finish_reason == "abort"
