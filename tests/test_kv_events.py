"""KV cache events (engine_adapter.serving.kv_events): a consumer that sees only the events
rebuilds the engine's cached set exactly, per medium, under evictions, preemptions, resets, hot
swaps and tier demotions, promotions and drops; the ZMQ publisher sends vLLM's framing and
answers replays. (The payload decoded by vLLM's own classes: tests_integration/vllm.)"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.serving.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventPublisher,
    KvEventView,
    decode_batch,
    encode_batch,
    hash_bytes,
    translate,
)

zmq = pytest.importorskip("zmq")  # the 'fleet' extra; .ci/run installs it

BS = 4


class Follower:
    """A router's side: every log record translated and applied, as the publisher's thread does."""

    def __init__(self, log: EvictionEventLog) -> None:
        self.view = KvEventView()
        self.records: list[dict[str, Any]] = []
        log.record_stores = True
        log.subscribe(self.on_record)

    def on_record(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.view.apply(translate(record))


def truth(m: CacheManager) -> dict[str, set[bytes]]:
    """What the engine holds: its device blocks and the lower tiers' own blocks, as hashes."""
    out = {"GPU": {hash_bytes(format_block_key(b.key)) for b in m.radix.blocks()}}
    if m.tiers is not None:
        medium = {"host": "CPU", "disk": "STORAGE"}
        for tier, keys in m.tiers.resident_below().items():
            out[medium[tier]] = {hash_bytes(format_block_key(k)) for k in keys}
    return out


def assert_same(m: CacheManager, f: Follower) -> None:
    for medium, blocks in truth(m).items():
        assert f.view.medium(medium) == blocks, f"{medium}: the events' view differs from the cache"
    assert set(f.view.blocks) <= {"GPU", "CPU", "STORAGE"}


def make(tiers: TierConfig | None, policy: str = "lru") -> tuple[CacheManager, Follower]:
    log = EvictionEventLog()
    ticks = iter(range(10**9))
    m = CacheManager(
        BlockAllocator(24, BS), policy=policy, tiers=tiers, clock=lambda: float(next(ticks)), event_log=log
    )
    return m, Follower(log)


def run_chats(m: CacheManager, f: Follower, seed: int, steps: int) -> dict[str, int]:
    """Multi-turn chats that outgrow the pool: each turn extends its conversation, runs with
    mid-run commits, then finishes or is preempted; every few steps a reset or a hot swap."""
    rng = random.Random(seed)
    convs: dict[int, list[int]] = {}
    seen = {"reset": 0, "swap": 0, "evict": 0, "demote": 0, "promote": 0, "drop": 0}
    sid = 0
    for step in range(steps):
        c = rng.randrange(8)
        history = convs.setdefault(c, [c * 10_000 + i for i in range(rng.randrange(2, 9))])
        if len(history) > 60:  # a new conversation in its place (the pool holds 24 blocks)
            history = convs[c] = [step * 10_000 + i for i in range(rng.randrange(2, 9))]
        history += [rng.randrange(1, 500) for _ in range(rng.randrange(3, 11))]
        sid += 1
        try:
            m.allocate(CacheRequest(sid, list(history)))
        except NoEvictableBlocksError:
            continue
        m.commit_blocks(sid, history)
        if rng.random() < 0.2:
            m.preempt(sid, history)
        else:
            m.free_sequence(sid, history)
        if m.tiers is not None:
            m.take_moves()  # the engine copies them; the bookkeeping is what is announced
        if step % 37 == 36:
            m.reset_prefix_cache()
            seen["reset"] += 1
        elif step % 23 == 22:
            m.swap_policy(rng.choice(["lfu", "arc", "lru"]))
            seen["swap"] += 1
        assert_same(m, f)
    for record in f.records:
        if record["event"] in seen:
            seen[record["event"]] += 1
    return seen


def test_the_events_rebuild_the_device_cache_under_evictions_resets_and_swaps() -> None:
    m, f = make(None)
    seen = run_chats(m, f, seed=1, steps=200)
    assert seen["evict"] > 50 and seen["reset"] and seen["swap"]
    assert any(r["event"] == "store" and r["parent"] is not None for r in f.records)


@pytest.mark.parametrize("write_policy", ["write_back", "write_through"])
def test_the_events_rebuild_every_tier_under_demotions_promotions_and_drops(write_policy: str) -> None:
    m, f = make(TierConfig(host_blocks=12, disk_blocks=16, write_policy=write_policy))
    seen = run_chats(m, f, seed=2, steps=250)
    assert seen["demote"] > 20 and seen["promote"] > 5 and seen["drop"] > 5
    assert f.view.medium("CPU") or f.view.medium("STORAGE")


def test_a_demoted_block_moves_medium_rather_than_leaving_the_view() -> None:
    m, f = make(TierConfig(host_blocks=16))
    prompt = list(range(4 * BS + 1))
    m.allocate(CacheRequest(1, prompt))
    m.free_sequence(1, prompt)
    first = hash_bytes(format_block_key(m.radix.blocks()[0].key))
    m.evict(4)
    assert f.view.medium("GPU") == set() and first in f.view.medium("CPU")
    removed = [e for r in f.records for e in translate(r) if isinstance(e, BlockRemoved)]
    assert all(e.medium == "GPU" for e in removed)


def test_a_store_event_carries_the_chain_its_parent_and_its_tokens() -> None:
    m, f = make(None)
    prompt = list(range(100, 100 + 3 * BS + 2))
    m.allocate(CacheRequest(1, prompt))
    m.commit_blocks(1, prompt[: 2 * BS])
    m.free_sequence(1, prompt)
    stored = [e for r in f.records for e in translate(r) if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [2, 1]
    assert stored[0].parent_block_hash is None and stored[1].parent_block_hash == stored[0].block_hashes[-1]
    assert stored[0].token_ids == prompt[: 2 * BS] and stored[1].token_ids == prompt[2 * BS : 3 * BS]
    assert {e.block_size for e in stored} == {BS} and {e.medium for e in stored} == {"GPU"}


def test_a_reset_with_nothing_held_is_all_blocks_cleared_else_the_removed_blocks() -> None:
    m, f = make(None)
    a, b = list(range(2 * BS + 1)), list(range(500, 500 + 2 * BS + 1))
    for sid, p in ((1, a), (2, b)):
        m.allocate(CacheRequest(sid, p))
        m.free_sequence(sid, p)
    m.allocate(CacheRequest(3, a))  # holds a's blocks through the reset
    m.reset_prefix_cache()
    last = translate(f.records[-1])
    assert len(last) == 1 and isinstance(last[0], BlockRemoved) and len(last[0].block_hashes) == 2
    assert_same(m, f)
    m.free_sequence(3, a)
    m.reset_prefix_cache()
    assert translate(f.records[-1]) == [AllBlocksCleared()]
    assert f.view.medium("GPU") == set() == truth(m)["GPU"]


def test_without_a_publisher_the_log_makes_no_store_events() -> None:
    log = EvictionEventLog()
    m = CacheManager(BlockAllocator(8, BS), event_log=log)
    p = list(range(2 * BS + 1))
    m.allocate(CacheRequest(1, p))
    m.free_sequence(1, p)
    m.reset_prefix_cache()
    assert [r["event"] for r in log.tail()] == []


def test_a_batch_round_trips_in_vllm_s_array_layout() -> None:
    import msgpack

    events = [BlockStored([b"\x01" * 16], None, [1, 2], 2, "GPU"), BlockRemoved([b"\x01" * 16], "CPU")]
    payload = encode_batch(12.5, [*events, AllBlocksCleared()])
    raw = msgpack.unpackb(payload)
    assert raw[0] == 12.5 and raw[2] == 0 and raw[1][0]["type"] == "BlockStored"
    assert list(raw[1][0])[:2] == ["type", "block_hashes"]  # msgspec's tagged map: the tag first
    assert decode_batch(payload) == (12.5, [*events, AllBlocksCleared()], 0)


def _recv(sock: Any, timeout_ms: int = 5000) -> list[bytes]:
    assert sock.poll(timeout_ms), "nothing arrived"
    frames: list[bytes] = sock.recv_multipart()
    return frames


def test_the_publisher_sends_numbered_batches_and_replays_from_a_sequence_number() -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    try:
        stored = {
            "event": "store",
            "blocks": ["a1", "b2"],
            "parent": None,
            "tokens": [1, 2, 3, 4],
            "block_size": 2,
        }
        time.sleep(0.3)  # PUB drops what it sends before the subscription arrives (slow joiner)
        pub.put(stored)
        topic, seq, payload = _recv(sub)
        assert (topic, int.from_bytes(seq, "big")) == (b"kv", 0)
        assert decode_batch(payload)[1] == translate(stored)
        pub.put({"event": "evict", "block": "a1"})
        pub.put({"event": "freed"})  # not a cache change: not sent
        assert int.from_bytes(_recv(sub)[1], "big") == 1
        req = ctx.socket(zmq.REQ)
        req.connect(pub.replay_endpoint)
        req.send((1).to_bytes(8, "big"))
        frames = _recv(req)
        assert frames[:2] == [b"kv", (1).to_bytes(8, "big")]
        assert decode_batch(frames[2])[1] == [BlockRemoved([hash_bytes("a1")], "GPU")]
        req.close()
        dealer = ctx.socket(zmq.DEALER)  # the REQ socket takes one reply; a DEALER reads the rest
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        seqs = []
        while True:
            _, topic, seq, _ = _recv(dealer)
            if seq == (-1).to_bytes(8, "big", signed=True):
                break
            seqs.append(int.from_bytes(seq, "big"))
        assert seqs == [0, 1]
        dealer.close()
    finally:
        ctx.destroy(linger=0)  # closes the sockets a failed assertion left open; term() would wait
        pub.close()


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    pub = KvEventPublisher("tcp://127.0.0.1:*", max_queue=1)
    try:
        start = time.perf_counter()
        for _ in range(2000):
            pub.put({"event": "evict", "block": "ff"})
        assert time.perf_counter() - start < 5
        assert pub.dropped > 0
    finally:
        pub.close()


def test_a_taken_port_is_a_config_error_and_the_log_is_left_as_it_was() -> None:
    import socket

    from engine_adapter.serving.config import ConfigError, EngineConfig
    from engine_adapter.serving.kv_events import start_kv_events

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    first = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    try:
        config = EngineConfig(
            kv_events_endpoint=f"tcp://127.0.0.1:{free}", kv_events_replay_endpoint=first.replay_endpoint
        )
        log = EvictionEventLog()
        with pytest.raises(ConfigError, match="cannot bind"):
            start_kv_events(config, log)
        assert not log.record_stores and log.num_subscribers == 0
    finally:
        first.close()
