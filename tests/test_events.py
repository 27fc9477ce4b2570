"""Eviction events: their documented shapes, the ring buffer, subscribers, the rotated JSONL file."""

from __future__ import annotations

import json
import os
import queue
import stat
from pathlib import Path
from typing import Any

import pytest
import structlog

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EVICT_KEYS, FREED_KEYS, EvictionEventLog, default_log_path
from engine_adapter.cache.request import CacheRequest


def make(log: EvictionEventLog | None = None, num_blocks: int = 4, **kw: Any) -> CacheManager:
    return CacheManager(BlockAllocator(num_blocks, 4), event_log=log, **kw)


def churn(m: CacheManager, n: int = 4) -> None:
    """Sequences of 2 blocks each through a 4-block pool: every one after the second evicts."""
    for i in range(n):
        prompt = [i * 100 + j for j in range(8)]
        m.allocate(CacheRequest(i, prompt, tenant=f"t{i % 2}", priority=i % 3))
        m.free_sequence(i, prompt)


def test_events_have_the_api_keys_in_order() -> None:
    m = make()
    churn(m)
    assert m.events is not None
    events = m.events.tail()
    evicts = [e for e in events if e["event"] == "evict"]
    freed = [e for e in events if e["event"] == "freed"]
    assert len(evicts) == m.stats().total_evictions == 4
    assert len(freed) == m.stats().eviction_calls == 2
    for e in evicts:
        assert tuple(e) == EVICT_KEYS
        assert e["policy"] == "lru" and e["reason"] == "alloc"
        assert isinstance(e["block"], str) and int(e["block"], 16) >= 0
        assert e["sequence_id"] in (0, 1) and e["tenant"] in ("t0", "t1")
    for e in freed:
        assert tuple(e) == FREED_KEYS
        assert e["blocks_freed"] == 2 and e["duration_us"] >= 0.0
    assert [e["total_freed"] for e in freed] == [2, 4]
    # the per-victim events come before their call's summary
    assert [e["event"] for e in events] == ["evict", "evict", "freed"] * 2


def test_tail_returns_the_last_n_oldest_first() -> None:
    log = EvictionEventLog(ring_size=3)
    for i in range(5):
        log.freed(policy="lru", reason="alloc", blocks_freed=1, total_freed=i, duration_us=1.0, ts=float(i))
    assert [e["total_freed"] for e in log.tail()] == [2, 3, 4]
    assert [e["total_freed"] for e in log.tail(2)] == [3, 4]
    assert log.tail(0) == []
    assert len(log) == 3


def test_subscribers_callable_and_queue() -> None:
    log = EvictionEventLog()
    got: list[dict[str, Any]] = []
    q: queue.Queue[dict[str, Any]] = queue.Queue()
    unsubscribe = log.subscribe(got.append)
    log.subscribe(q)
    m = make(log)
    churn(m, 3)
    assert len(got) == 3 and q.qsize() == 3
    unsubscribe()
    churn_more = make(log)
    churn(churn_more, 3)
    assert len(got) == 3 and q.qsize() == 6


def test_a_full_queue_drops_events_and_a_broken_subscriber_is_dropped() -> None:
    log = EvictionEventLog()
    small: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)
    log.subscribe(small)

    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    log.subscribe(broken)
    churn(make(log), 4)  # eviction carries on
    assert small.qsize() == 1
    assert log.num_subscribers == 1


def test_file_is_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "e1" / "evictions.jsonl"
    with EvictionEventLog(path) as log:
        m = make(log)
        churn(m)
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 6
    assert list(events[0]) == list(EVICT_KEYS)
    assert events == log.tail()


def test_named_log_goes_under_sage_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGE_HOME", str(tmp_path))
    assert default_log_path("eng") == tmp_path / "logs" / "eng" / "evictions.jsonl"
    log = EvictionEventLog(name="eng")
    churn(make(log))
    log.close()
    assert (tmp_path / "logs" / "eng" / "evictions.jsonl").stat().st_size > 0
    with pytest.raises(ValueError):
        default_log_path("../x")


def test_file_rotates_by_size(tmp_path: Path) -> None:
    path = tmp_path / "evictions.jsonl"
    log = EvictionEventLog(path, max_bytes=1000, backup_count=2)
    for i in range(100):
        log.freed(policy="lru", reason="alloc", blocks_freed=1, total_freed=i, duration_us=1.0)
    log.close()
    assert path.exists() and (tmp_path / "evictions.jsonl.1").exists()
    assert not (tmp_path / "evictions.jsonl.3").exists()
    assert path.stat().st_size <= 1000
    for line in path.read_text().splitlines():
        assert json.loads(line)["event"] == "freed"


def test_the_log_folder_and_files_are_private(tmp_path: Path) -> None:
    # Events carry tenants: the folder 0700, the files 0600 (rotated ones too), whatever the umask.
    path = tmp_path / "logs" / "eng" / "evictions.jsonl"
    old_umask = os.umask(0o022)
    try:
        log = EvictionEventLog(path, max_bytes=500, backup_count=2)
        for i in range(50):
            log.freed(policy="lru", reason="alloc", blocks_freed=1, total_freed=i, duration_us=1.0)
        log.close()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for file in (path, path.with_name("evictions.jsonl.1")):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def test_extra_processors_see_every_event() -> None:
    cap = structlog.testing.LogCapture()
    log = EvictionEventLog(processors=[cap])
    churn(make(log))
    assert [e["event"] for e in cap.entries] == ["evict", "evict", "freed"] * 2
    assert cap.entries[0]["block_id"] == log.tail()[0]["block_id"]


def test_events_can_be_turned_off() -> None:
    m = make(record_events=False)
    churn(m)
    assert m.events is None and m.stats().total_evictions == 4


def test_watermark_reason_and_policy_name_after_a_swap() -> None:
    m = make(num_blocks=8, eviction_threshold=0.25)
    churn(m, 3)
    m.swap_policy("fifo")
    assert m.evict_to_threshold() == 4
    assert m.events is not None
    last = m.events.tail(1)[0]
    assert last["event"] == "freed" and last["reason"] == "watermark" and last["policy"] == "fifo"
