"""Per-lookup records and regret in a real engine (issue 32): on a 200-request multi-turn replay
the lookup log, each request's ``cached_tokens`` and the stats' hit tokens agree exactly, and
``sage llm eviction explain --lookup`` (a real process) follows a lookup to the eviction that
cost its hit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine

REPO = Path(__file__).resolve().parents[1]
CONVERSATIONS, TURNS = 20, 10


def _replay(engine: Engine) -> dict[str, int]:
    """20 conversations of 10 turns, interleaved turn by turn: each turn's prompt is the last
    prompt, its answer and a new message. Returns each request's cached tokens by request id."""
    rng = random.Random(32)
    greedy = SamplingParams(max_tokens=2, ignore_eos=True)
    prompts = [[rng.randrange(10, 200) for _ in range(12)] for _ in range(CONVERSATIONS)]
    cached: dict[str, int] = {}
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            rid = f"conv{c}-turn{turn}"
            out = engine.submit(prompts[c], greedy, request_id=rid, tenant=f"t{c % 3}").result(120)
            cached[rid] = out.cached_tokens
            prompts[c] = [*prompts[c], *out.token_ids, *(rng.randrange(10, 200) for _ in range(6))]
    return cached


@pytest.mark.slow
def test_lookup_records_cached_tokens_and_stats_agree_and_explain_follows_an_eviction(tmp_path: Path) -> None:
    log = tmp_path / "lookups.jsonl"
    engine = Engine(
        EngineConfig(
            model="sage-tiny",
            device="cpu",
            block_size=4,
            num_blocks=160,  # every conversation's prefix does not fit: evictions cost hits
            name="acct",
            socket=str(tmp_path / "unused.sock"),
            log_dir=str(tmp_path / "logs"),
            log_evictions=True,
            explain_evictions=True,
            lookup_log=str(log),
            max_num_batched_tokens=512,
        )
    )
    engine.start()
    try:
        cached = _replay(engine)
        stats = engine.eviction_stats()
    finally:
        engine.shutdown()
    assert stats.preemptions == 0  # one admission per request, so one record each
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(records) == CONVERSATIONS * TURNS
    by_id = {r["request_id"]: r for r in records}
    assert {rid: r["matched_tokens"] for rid, r in by_id.items()} == cached
    assert sum(r["matched_tokens"] for r in records) == stats.prefix_cache_hits_tokens
    assert sum(r["prompt_tokens"] for r in records) == stats.prefix_cache_queries_tokens
    stops = {r["stop"] for r in records}
    assert {"evicted", "absent"} <= stops
    assert stats.total_evictions > 0 and stats.ghost_hits > 0
    assert stats.missed_blocks == sum(r["prompt_blocks"] - r["matched_blocks"] for r in records)
    kinds = {h.kind for h in stats.age_histograms}
    assert {"age_at_hit_seconds", "age_at_eviction_seconds", "reuse_distance_blocks"} <= kinds
    hits = sum(h.count for h in stats.age_histograms if h.kind == "age_at_hit_seconds")
    assert hits == sum(r["matched_blocks"] for r in records)

    evicted = next(r for r in records if r["stop"] == "evicted")
    events = tmp_path / "logs" / "evictions.jsonl"
    ids = [json.loads(line).get("id") for line in events.read_text(encoding="utf-8").splitlines()]
    assert evicted["eviction"]["id"] in ids
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "sage_cli", "llm", "eviction", "explain", "--lookup", evicted["request_id"]]
    cmd += ["--lookup-log", str(log), "--file", str(events), "--tail", "100000"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"request {evicted['request_id']}" in done.stdout
    assert f"eviction #{evicted['eviction']['id']}" in done.stdout
    assert "that eviction cost this hit" in done.stdout
    event = done.stdout.split("that eviction cost this hit", 1)[1]  # the evict event, explained
    assert evicted["eviction"]["block"][:10] in event and "by LRU for alloc" in event
    assert "no explanation recorded" not in event
    done = subprocess.run(
        [*cmd[:7], "no-such-request", *cmd[8:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "no lookup of request no-such-request" in done.stderr


def test_a_bad_ghost_factor_is_refused_in_one_line(tmp_path: Path) -> None:
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ConfigError) as info:
            EngineConfig.from_dict({"ghost_factor": bad, "socket": str(tmp_path / "x.sock")})
        assert "\n" not in str(info.value) and "ghost_factor" in str(info.value)
