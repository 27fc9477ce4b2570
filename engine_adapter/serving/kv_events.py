"""KV cache events in vLLM's wire format, for routers and indexers that follow an engine's cache
(llm-d's precise prefix scorer, Dynamo's KV router; docs/routers.md).

The engine's event log (`engine_adapter.cache.events`) already says every change of the cache:
``store`` (a chain newly cached on the device), ``evict``, the tiers' ``demote`` / ``promote`` /
``drop``, and ``reset``. `translate` turns each into vLLM's events, one record per medium:

    store                      -> BlockStored(medium GPU, hashes, parent, token ids)
    evict                      -> BlockRemoved(GPU)
    demote device -> host      -> BlockStored(CPU)              (the block lives on, below)
    demote host -> disk        -> BlockRemoved(CPU), BlockStored(STORAGE)
    promote host|disk -> device-> BlockRemoved(CPU|STORAGE), BlockStored(GPU)
    drop (leaves every tier)   -> BlockRemoved(its tier's medium)
    reset                      -> AllBlocksCleared when nothing stays cached, else BlockRemoved
                                  per medium for what it removed

as vLLM's KV offloading connector reports its CPU copies with ``medium="CPU"``: a demoted block
is not gone from the fleet's view, it moved to a slower medium. A write-through copy of a device
block is not announced (it is the device block's shadow until the device block is evicted,
when the ``demote`` announces it). Block hashes are sage's 128-bit chained keys as 16 big-endian
bytes (vLLM's default ``ExternalBlockHash`` is bytes too).

`KvEventPublisher` is vLLM's ``ZmqEventPublisher`` protocol: multipart ``(topic, seq, payload)``
on a PUB socket, ``seq`` an 8-byte big-endian counter, ``payload`` a msgpack ``EventBatch``
(``[ts, [event, ...], data_parallel_rank]``, each event a map tagged ``"type"``), and a ROUTER
socket answering ``(client, b"", start_seq)`` with every kept batch from ``start_seq`` then
``(client, b"", b"", -1 as 8 bytes, b"")``. The engine thread only puts the log's records on a
bounded queue (a full queue drops and counts them); the publisher's thread translates, packs
and sends. `KvEventView` is the consumer's side: the cached set per medium, rebuilt from events.

Needs pyzmq and msgpack (the ``fleet`` extra); imported by the engine only when
``kv_events_endpoint`` is set.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_adapter.cache.events import EvictionEventLog
    from engine_adapter.serving.config import EngineConfig

__all__ = [
    "MEDIUM",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "KvEventPublisher",
    "KvEventView",
    "decode_batch",
    "encode_batch",
    "hash_bytes",
    "start_kv_events",
    "translate",
]

MEDIUM = {"device": "GPU", "host": "CPU", "disk": "STORAGE"}  # sage tier -> vLLM medium
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


def hash_bytes(key: str) -> bytes:
    """A block key as the log writes it (hex of sage's 128-bit int key) -> 16 big-endian bytes."""
    return int(key, 16).to_bytes(16, "big")


def translate(record: dict[str, Any]) -> list[KvEvent]:
    """vLLM's events for one record of the engine's event log (none for the others)."""
    kind = record.get("event")
    if kind == "store":
        parent = record["parent"]
        return [
            BlockStored(
                [hash_bytes(k) for k in record["blocks"]],
                None if parent is None else hash_bytes(parent),
                list(record["tokens"]),
                record["block_size"],
                MEDIUM["device"],
            )
        ]
    if kind == "evict":
        return [BlockRemoved([hash_bytes(record["block"])], MEDIUM["device"])]
    if kind in ("demote", "promote"):
        block = [hash_bytes(record["block"])]
        out: list[KvEvent] = []
        if record["tier"] != "device":  # it leaves a lower tier (a demotion from the device keeps it)
            out.append(BlockRemoved(block, MEDIUM[record["tier"]]))
        out.append(BlockStored(block, None, [], 0, MEDIUM[record["to_tier"]]))
        return out
    if kind == "drop":
        return [BlockRemoved([hash_bytes(record["block"])], MEDIUM[record["tier"]])]
    if kind == "reset":
        if record["remaining"] == 0:
            return [AllBlocksCleared()]
        out = [BlockRemoved([hash_bytes(k) for k in record["blocks"]], MEDIUM["device"])]
        out += [
            BlockRemoved([hash_bytes(k) for k in keys], MEDIUM[tier])
            for tier, keys in record["below"].items()
        ]
        return [e for e in out if not isinstance(e, BlockRemoved) or e.block_hashes]
    return []


def _wire(event: KvEvent) -> dict[str, Any]:
    """One event as msgspec encodes vLLM's tagged struct: a map, ``type`` first, and the fields
    without defaults always present."""
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium}
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: Iterable[KvEvent], data_parallel_rank: int = 0) -> bytes:
    """A msgpack ``KVEventBatch``: the array ``[ts, events, data_parallel_rank]``."""
    import msgpack

    payload: bytes = msgpack.packb([ts, [_wire(e) for e in events], data_parallel_rank], use_bin_type=True)
    return payload


def decode_batch(payload: bytes) -> tuple[float, list[KvEvent], int | None]:
    """The inverse of `encode_batch` (what a consumer without vLLM does)."""
    import msgpack

    fields = msgpack.unpackb(payload, raw=False)
    ts, raw_events = fields[0], fields[1]
    rank = fields[2] if len(fields) > 2 else None
    events: list[KvEvent] = []
    for raw in raw_events:
        kind = raw["type"]
        if kind == "BlockStored":
            events.append(
                BlockStored(
                    list(raw["block_hashes"]),
                    raw["parent_block_hash"],
                    list(raw["token_ids"]),
                    raw["block_size"],
                    raw["medium"],
                    raw.get("lora_id"),
                    raw.get("lora_name"),
                )
            )
        elif kind == "BlockRemoved":
            events.append(BlockRemoved(list(raw["block_hashes"]), raw["medium"]))
        elif kind == "AllBlocksCleared":
            events.append(AllBlocksCleared())
        else:
            raise ValueError(f"unknown KV event type {kind!r}")
    return ts, events, rank


@dataclass
class KvEventView:
    """What a KV-event-fed router knows of one engine: its cached block hashes per medium."""

    blocks: dict[str, set[bytes]] = field(default_factory=dict)

    def apply(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.blocks.setdefault(event.medium, set()).update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.blocks.get(event.medium, set()).difference_update(event.block_hashes)
            else:
                self.blocks.clear()

    def medium(self, name: str) -> set[bytes]:
        return set(self.blocks.get(name, set()))


class KvEventPublisher:
    """A PUB socket (and optionally a replay ROUTER socket) fed from the engine's event log.

    Args:
        endpoint: Where the PUB socket binds (tcp://127.0.0.1:5557).
        replay_endpoint: Where the replay ROUTER binds; "" for none.
        topic: The first frame of every message (vLLM's default: empty).
        buffer_steps: Batches kept for replay.
        max_queue: Log records queued for the thread; beyond it they are dropped (`dropped`).
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str = "",
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        max_queue: int = 100_000,
    ) -> None:
        import zmq

        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic.encode("utf-8")
        self._ctx = zmq.Context()
        self._replay = None
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.bind(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self._ctx.destroy(linger=0)  # a port taken: nothing stays bound
            raise
        # what was bound (a tcp://HOST:* endpoint binds a free port)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = (
            "" if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        )
        self.next_seq = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="sage-kv-events", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> None:
        """An event-log subscriber (runs on the engine thread): queue the record, never block."""
        if record.get("event") not in ("store", "evict", "demote", "promote", "drop", "reset"):
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1  # a router resyncs through replay or a reset; the engine never waits

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, then stop the thread and close the sockets."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
        self._ctx.term()

    def _run(self) -> None:
        while True:
            if self._replay is not None:
                self._serve_replays()
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            records = [first]
            while len(records) < 1024:  # one batch per wake-up, as vLLM sends one per step
                try:
                    records.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in records
            events = [e for r in records if r is not None for e in translate(r)]
            if events:
                self._send(events)
            if done:
                return

    def _send(self, events: list[KvEvent]) -> None:
        seq = self.next_seq
        self.next_seq += 1
        payload = encode_batch(time.time(), events)
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replays(self) -> None:
        replay = self._replay
        assert replay is not None
        while replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3:
                continue  # not a replay request: vLLM ignores it too
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))


def start_kv_events(config: EngineConfig, events: EvictionEventLog) -> KvEventPublisher | None:
    """The engine's publisher when ``kv_events_endpoint`` is set: subscribed to its event log,
    which from now on also records ``store`` and ``reset``; None when it is not set.

    Raises:
        ConfigError: pyzmq or msgpack is missing, or the endpoint cannot be bound.
    """
    from engine_adapter.serving.config import ConfigError

    if not config.kv_events_endpoint:
        return None
    try:
        import msgpack  # noqa: F401
        import zmq
    except ImportError as exc:
        raise ConfigError(
            f"kv_events_endpoint needs pyzmq and msgpack ({exc.name} is missing): "
            "pip install 'sage-kv[fleet]'"
        ) from None
    try:
        publisher = KvEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"kv_events_endpoint {config.kv_events_endpoint}: cannot bind: {exc}") from None
    events.record_stores = True
    events.subscribe(publisher.put)
    return publisher
