"""``sage llm eviction explain`` and ``logs --explain`` on a log file a real cache manager wrote.

No engine: a `CacheManager` with explanation on writes its events through `EvictionEventLog`
to a JSON-lines file, as the engine does with ``--log-evictions --explain``; the CLI reads it
with ``--file`` in a subprocess. A log written without explanation says how to get one, and a
target that is not in the log, or not a sequence id or block key, is a one-line error.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cli_process import sage

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.request import CacheRequest
from sage_cli.eviction.explanations import explain_lines, explain_one_line

BS = 4


def _write_log(path: Path, *, explain: bool) -> list[dict[str, object]]:
    with EvictionEventLog(path) as log:
        m = CacheManager(BlockAllocator(12, BS), policy="lfu", event_log=log, explain=explain)
        for sid in range(1, 6):
            prompt = [sid * 100 + i for i in range(3 * BS)]
            m.allocate(CacheRequest(sid, prompt, tenant=f"t{sid % 2}"))
            m.free_sequence(sid, prompt)
        events = log.tail()
    return [e for e in events if e["event"] == "evict"]


def _sage(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return sage("llm", "eviction", *args, home=home, timeout=60)


def test_explain_and_logs_explain_from_a_file(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    victims = _write_log(log, explain=True)
    assert victims
    first = victims[0]
    done = _sage("explain", str(first["sequence_id"]), "--file", str(log), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ranked by: hits since insert, then the time of its latest insert or hit" in done.stdout
    assert f"block {str(first['block'])[:10]}" in done.stdout
    assert "its values:" in done.stdout and "level=0" in done.stdout
    by_key = _sage("explain", str(first["block"])[:8], "--file", str(log), "--json", home=tmp_path)
    assert by_key.returncode == 0, by_key.stderr
    assert json.loads(by_key.stdout.splitlines()[0])["explain"] == first["explain"]
    lines = _sage("logs", "--explain", "--file", str(log), "--tail", "1000", home=tmp_path)
    assert lines.returncode == 0, lines.stderr
    out = lines.stdout.strip().splitlines()
    assert len(out) == len(victims)  # one line per victim, none for the "freed" events
    assert all("evicted by LFU for alloc: " in line and "rank=(0, " in line for line in out)


def test_without_explanation_and_bad_targets(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    victims = _write_log(log, explain=False)
    done = _sage("explain", str(victims[0]["sequence_id"]), "--file", str(log), home=tmp_path)
    assert done.returncode == 0 and "start the engine with --explain" in done.stdout
    assert "(no explanation: the engine runs without --explain)" in explain_one_line(victims[0])
    for target, fragment in (("424242", "no eviction of 424242"), ("x-y", "sequence id")):
        bad = _sage("explain", target, "--file", str(log), home=tmp_path)
        assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert fragment in bad.stderr and "Traceback" not in bad.stderr


def test_renderers_tolerate_odd_events() -> None:
    """The renderers read JSON from an engine or a file: missing or odd fields print as '?'."""
    odd = {"event": "evict", "explain": {"values": "x", "preferred_to": [1], "skipped": None}}
    assert "evicted by ? for ?" in explain_one_line(odd)
    assert explain_lines(odd)[0].startswith("block ? [pool block None] evicted at ?")


# ---- several engine runs in one file; one line per eviction (issue 28, item 12) -----------------


def _write_run(path: Path, run_id: str) -> list[dict[str, object]]:
    """One engine run's records appended to `path`: sequence ids start at 1 again, as they do."""
    with EvictionEventLog(path, run_id=run_id) as log:
        m = CacheManager(BlockAllocator(12, BS), policy="lru", event_log=log, explain=True)
        for sid in range(1, 6):
            prompt = [hash((run_id, sid)) % 10_000 * 100 + i for i in range(3 * BS)]
            m.allocate(CacheRequest(sid, prompt))
            m.free_sequence(sid, prompt)
        return log.tail()


def test_explain_from_a_file_of_two_engine_runs_groups_them(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    first, second = _write_run(log, "20260101-100000-11"), _write_run(log, "20260101-110000-22")
    assert {e["run"] for e in first} == {"20260101-100000-11"} and {e["run"] for e in second} == {
        "20260101-110000-22"
    }
    seq = next(e["sequence_id"] for e in first if e["event"] == "evict")
    assert any(e["event"] == "evict" and e["sequence_id"] == seq for e in second)  # ids repeat
    done = _sage("explain", str(seq), "--file", str(log), home=tmp_path)
    assert done.returncode == 0, done.stderr
    headings = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert [h.split(":")[0] for h in headings] == [
        "== engine run 20260101-100000-11",
        "== engine run 20260101-110000-22",
    ]
    text = done.stdout
    assert text.index(headings[0]) < text.index(headings[1])
    only = ("--run", "20260101-110000-22", "--json")
    one = _sage("explain", str(seq), "--file", str(log), *only, home=tmp_path)
    assert one.returncode == 0, one.stderr
    assert {json.loads(line)["run"] for line in one.stdout.splitlines()} == {"20260101-110000-22"}
    bad = _sage("explain", str(seq), "--file", str(log), "--run", "nope", home=tmp_path)
    assert bad.returncode == 2
    assert "no such run in the log; runs: 20260101-100000-11, 20260101-110000-22" in bad.stderr


def test_the_text_log_has_one_line_per_eviction(tmp_path: Path) -> None:
    """Before issue 28 it printed one line per evicted block and one per call."""
    log = tmp_path / "evictions.jsonl"
    events = _write_run(log, "20260101-100000-11")
    calls = [e for e in events if e["event"] == "freed"]
    assert any(int(str(c["blocks_freed"])) > 1 for c in calls)  # calls that evict several blocks
    text = _sage("logs", "--file", str(log), "--tail", "1000", home=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.strip().splitlines()
    assert len(lines) == len(calls)
    for line, call in zip(lines, calls, strict=True):
        assert " EVICTION: Sequence" in line and "evicted (LRU, alloc, last_access=" in line
        blocks = int(str(call["blocks_freed"]))
        freed = f"{blocks} block{'s' if blocks != 1 else ''}"
        assert f"; freed {freed}, total freed: {call['total_freed']} " in line
    as_json = _sage("logs", "--file", str(log), "--tail", "1000", "--json", home=tmp_path)
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == events  # JSON: every event


def _write_compressing_log(path: Path, *, explain: bool) -> list[dict[str, object]]:
    """Compress-on-evict: an 8-block chain compressed when a second prompt needs room; then a
    reservation of every block compresses the second chain and drops both entries (least
    recently used first)."""
    with EvictionEventLog(path) as log:
        pool = BlockAllocator(12, BS)
        m = CacheManager(pool, event_log=log, explain=explain, compress_on_evict="knorm:0.75", compiled=False)
        for sid, start, n in ((1, 100, 33), (2, 500, 25)):
            prompt = list(range(start, start + n))
            m.allocate(CacheRequest(sid, prompt))
            m.free_sequence(sid, prompt)
        m.take_compress_moves()
        m.reserve_blocks(99, m.num_available_blocks)
        return log.tail()


def test_explain_follows_a_compressed_prefix_to_its_compression_and_its_drop(tmp_path: Path) -> None:
    log = tmp_path / "evictions.jsonl"
    events = _write_compressing_log(log, explain=True)
    compress, second = [e for e in events if e["event"] == "compress"]
    blocks = compress["blocks"]
    assert isinstance(blocks, list) and len(blocks) == 8 and compress["block"] == blocks[-1]
    assert compress["chosen_by"] == "lru" and compress["reason"] == "evict:alloc"
    why = compress["explain"]
    assert isinstance(why, dict) and why["then"] == "compress" and why["ranks_by"]
    assert second["reason"] == "evict:reserve" and not set(second["blocks"]) & set(blocks)
    dropped, _ = [e for e in events if e["event"] == "drop_compressed"]
    assert dropped["blocks"] == blocks and dropped["why"].startswith("least recently used")
    # any block of the chain finds both records, in order
    done = _sage("explain", str(blocks[3])[:8], "--file", str(log), home=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "cached prefix of 8 blocks" in out and "compressed, not evicted" in out
    assert "LRU chose block" in out and "knorm:0.75 kept 8 of 32 tokens and freed 6 blocks" in out
    assert "ranked by:" in out
    assert out.index("compressed, not evicted") < out.index("dropped at")
    assert "why: least recently used compressed prefix" in out


def test_a_compression_without_explain_says_how_to_get_one(tmp_path: Path) -> None:
    events = _write_compressing_log(tmp_path / "evictions.jsonl", explain=False)
    compress = next(e for e in events if e["event"] == "compress")
    assert "explain" not in compress
    lines = explain_lines(compress)
    assert "LRU chose block" in lines[0] and lines[-1].endswith("start the engine with --explain")
