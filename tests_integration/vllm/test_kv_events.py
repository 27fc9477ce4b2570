"""A sage engine's KV events read by vLLM's own classes (vllm.distributed.kv_events).

Multi-turn chats drive a sage cache (with a host tier, so blocks are demoted, promoted and
dropped, and a reset) through the real publisher on a real ZMQ socket; a subscriber decodes each
payload with msgspec into vLLM's ``KVEventBatch`` and keeps the cached set per medium, as a
KV-event-fed router does, and ends with exactly the cache's own set. The replay endpoint answers
in the framing vLLM's publisher uses (its ``END_SEQ`` ends it).
"""

from __future__ import annotations

import random
import time

import msgspec
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.serving.kv_events import KvEventPublisher, hash_bytes

BS = 4


def serve_chats(m: CacheManager, steps: int) -> None:
    rng = random.Random(5)
    convs: dict[int, list[int]] = {}
    for sid in range(1, steps + 1):
        c = rng.randrange(6)
        history = convs.setdefault(c, [c * 1000 + i for i in range(6)])
        if len(history) > 50:
            history = convs[c] = [sid * 1000 + i for i in range(6)]
        history += [rng.randrange(1, 300) for _ in range(rng.randrange(3, 9))]
        m.allocate(CacheRequest(sid, list(history)))
        m.commit_blocks(sid, history)
        m.free_sequence(sid, history)
        m.take_moves()
        if sid == steps // 2:
            m.reset_prefix_cache()


def test_vllm_s_classes_decode_the_events_and_rebuild_the_cache() -> None:
    log = EvictionEventLog()
    m = CacheManager(BlockAllocator(24, BS), tiers=TierConfig(host_blocks=12), event_log=log)
    pub = KvEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    log.record_stores = True
    log.subscribe(pub.put)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    try:
        time.sleep(0.3)  # the subscription reaches the PUB socket before the first batch
        serve_chats(m, 150)
        media: dict[str, set[bytes]] = {}
        kinds: set[str] = set()
        expected_seq = 0
        while sub.poll(2000):
            _, seq, payload = sub.recv_multipart()
            assert int.from_bytes(seq, "big") == expected_seq  # vLLM's 8-byte big-endian counter
            expected_seq += 1
            batch = decoder.decode(payload)
            assert batch.data_parallel_rank == 0
            for event in batch.events:
                kinds.add(type(event).__name__)
                if isinstance(event, BlockStored):
                    assert event.lora_id is None and event.block_size in (BS, 0)
                    media.setdefault(event.medium, set()).update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    media.get(event.medium, set()).difference_update(event.block_hashes)
                else:
                    assert isinstance(event, AllBlocksCleared)
                    media.clear()
        assert kinds >= {"BlockStored", "BlockRemoved"}
        device = {hash_bytes(format_block_key(b.key)) for b in m.radix.blocks()}
        host = {hash_bytes(format_block_key(k)) for k in m.tiers.resident_below()["host"]}
        assert media.get("GPU", set()) == device and media.get("CPU", set()) == host
        req = ctx.socket(zmq.DEALER)
        req.connect(pub.replay_endpoint)
        req.send_multipart((b"", (expected_seq - 1).to_bytes(8, "big")))
        _, _, seq, payload = req.recv_multipart()
        assert int.from_bytes(seq, "big") == expected_seq - 1 and decoder.decode(payload).events
        assert req.recv_multipart()[2] == ZmqEventPublisher.END_SEQ
        req.close()
    finally:
        ctx.destroy(linger=0)  # closes the sockets a failed assertion left open; term() would wait
        pub.close()
