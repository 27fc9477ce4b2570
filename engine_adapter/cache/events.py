"""Structured eviction events: one ``evict`` event per victim block, one ``freed`` per eviction
call (their shapes: docs/architecture.md, "Control API"). Every event carries ``run``, the id
of the log that wrote it (one per engine start: ``YYYYmmdd-HHMMSS-PID``), so that the records of
several engine runs appended to one file can be told apart (``sage llm eviction explain --file``
groups by it).

Events go through a structlog processor chain of plain callables:

    _fan_out (ring buffer + subscribers) -> JSONRenderer -> stdlib logger -> RotatingFileHandler

The file (JSON lines, rotated by size) is optional; the in-memory ring buffer that serves
``GET /v1/eviction/logs?tail=N`` is always kept, and subscribers (a callable, or anything with
``put_nowait`` such as ``queue.Queue``) receive each event as it happens, for ``follow``.

Event shapes::

    {"event": "evict", "ts", "run", "block", "parent", "depth", "block_id", "sequence_id",
     "tenant", "policy", "reason", "last_access", "hits", "priority", "id"}
    {"event": "freed", "ts", "run", "policy", "reason", "blocks_freed", "total_freed", "duration_us"}
    {"event": "compress", "ts", "run", "sequence_id", "policy", "reason", "tokens_before",
     "tokens_after", "blocks_freed", "bytes_freed", "duration_us", "fallback"
     [, "block", "blocks", "chosen_by", "explain"]}
    {"event": "drop_compressed", "ts", "run", "blocks", "blocks_freed", "tokens_kept", "hits",
     "reason", "why"}
    {"event": "demote" | "promote" | "drop", "ts", "run", "block", "tier", "slot", "to_tier",
     "to_slot", "policy", "reason"}
    {"event": "store", "ts", "run", "blocks", "parent", "tokens", "block_size"}
    {"event": "reset", "ts", "run", "blocks", "below", "remaining"}

``compress`` is token-level eviction (engine_adapter.token_eviction): one running sequence's
K/V compacted by a token policy, `reason` "prefill" (a request's ``kv_compression``),
"pressure" (memory under ``--memory-threshold``) or "preempt" (instead of a preemption);
`fallback` is null, or why an attention-scored policy kept the newest tokens instead. With
``--compress-on-evict``, a cached prefix compressed instead of evicted is a ``compress`` event with
reason ``evict:<why>`` that also names the block policy's victim (`block`), the chain compressed
(`blocks`), the policy that chose it (`chosen_by`) and, with ``--explain``, why (`explain`, as an
``evict`` event's, with ``then``: ``compress``); a compressed prefix given up later is a
``drop_compressed`` event saying `why`.

``store`` and ``reset`` are made only while ``record_stores`` is on (the KV events publisher,
engine_adapter.serving.kv_events, turns it on): ``store`` is one chain of blocks a sequence
newly cached on the device (`blocks`, under `parent`, holding `tokens`: every block's token ids
in order, empty when the caller gave keys only), ``reset`` a prefix-cache reset (`blocks`: the
device blocks it removed, `below`: the host and disk blocks it forgot, by tier, `remaining`: the
device blocks still cached because running requests hold them).

``demote`` / ``promote`` / ``drop`` are the KV tiers' moves (docs/architecture.md, "Tiers"): a
block going down from `tier` (``device``, ``host``) to `to_tier`, loaded back from `tier`
(``host``, ``disk``) into device block `to_slot`, or leaving the last tier that held it (`to_tier`
null); `policy` is the policy of the tier that chose it (null when no policy chose: a promotion,
a failed move), `reason` why (``evict``, ``lookup``, ``prefetch``, ``orphan``, ``failed``).

Imports `engine_adapter.paths` (the log folder) and structlog; nothing else of the cache.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from engine_adapter.paths import default_log_dir, is_engine_name

__all__ = [
    "COMPRESS_KEYS",
    "EVICT_KEYS",
    "FREED_KEYS",
    "RESET_KEYS",
    "STORE_KEYS",
    "TIER_KEYS",
    "EventSubscriber",
    "EvictionEventLog",
    "default_log_path",
    "new_run_id",
]

EVICT_KEYS = (  # and "explain" last, with explanation on (engine_adapter.cache.explain)
    "event",
    "ts",
    "run",
    "block",
    "parent",
    "depth",
    "block_id",
    "sequence_id",
    "tenant",
    "policy",
    "reason",
    "last_access",
    "hits",
    "priority",
    "id",
)
FREED_KEYS = ("event", "ts", "run", "policy", "reason", "blocks_freed", "total_freed", "duration_us")
STORE_KEYS = ("event", "ts", "run", "blocks", "parent", "tokens", "block_size")
RESET_KEYS = ("event", "ts", "run", "blocks", "below", "remaining")
TIER_KEYS = ("event", "ts", "run", "block", "tier", "slot", "to_tier", "to_slot", "policy", "reason")
COMPRESS_KEYS = (
    "event",
    "ts",
    "run",
    "sequence_id",
    "policy",
    "reason",
    "tokens_before",
    "tokens_after",
    "blocks_freed",
    "bytes_freed",
    "duration_us",
    "fallback",
)


class _PutNowait(Protocol):
    def put_nowait(self, item: dict[str, Any], /) -> None: ...


EventSubscriber = Callable[[dict[str, Any]], None] | _PutNowait


def new_run_id() -> str:
    """An id for the records of one engine run: its start time and pid, ``YYYYmmdd-HHMMSS-PID``
    (readable, sortable by start, distinct for two engines started in the same second)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def default_log_path(name: str) -> Path:
    """``$SAGE_HOME/logs/<name>/evictions.jsonl``.

    Raises:
        ValueError: `name` is not an engine name (`engine_adapter.paths`).
    """
    if not is_engine_name(name):
        raise ValueError(f"engine name {name!r} cannot name a log folder")
    return default_log_dir(name) / "evictions.jsonl"


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating log whose files are created mode 0600, whatever the umask (rotations too)."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


class _NullSink:
    """The end of the chain when no file is kept."""

    def info(self, *args: Any, **kwargs: Any) -> None:
        return None


class EvictionEventLog:
    """Where eviction events go: ring buffer, subscribers and an optional rotated JSONL file.

    Args:
        path: File to append JSON lines to; None keeps events in memory only.
        name: Engine name; with no `path`, writes ``$SAGE_HOME/logs/<name>/evictions.jsonl``.
        max_bytes: Rotate the file at this size.
        backup_count: Rotated files kept (``evictions.jsonl.1`` ...).
        ring_size: Events kept in memory for `tail`.
        processors: Extra structlog processors that observe each event: each is called with a
            copy, and what it returns or raises (``DropEvent``) is ignored, so a
            ``structlog.testing.LogCapture`` here captures without stopping the file or the ring.
        run_id: The ``run`` every event carries; `new_run_id()` when None.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        max_bytes: int = 16 * 1024 * 1024,
        backup_count: int = 3,
        ring_size: int = 10_000,
        processors: list[Callable[..., Any]] | None = None,
        run_id: str | None = None,
    ) -> None:
        if ring_size <= 0:
            raise ValueError(f"ring_size={ring_size} must be positive")
        self.run_id = run_id if run_id is not None else new_run_id()
        if path is None and name is not None:
            path = default_log_path(name)
        self.path: Path | None = None if path is None else Path(path)
        self._ring: deque[dict[str, Any]] = deque(maxlen=ring_size)
        self._subscribers: list[EventSubscriber] = []
        self._guard = threading.Lock()
        self._handler: logging.Handler | None = None
        self._observers = tuple(processors or ())
        # store and reset events cost a record per commit: only made when a consumer wants them
        self.record_stores = False
        chain: list[Callable[..., Any]] = [self._fan_out]
        sink: Any
        if self.path is not None:
            # Events carry tenants: the folder and the files are the engine user's alone.
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            handler = _PrivateRotatingFileHandler(
                self.path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
            )
            handler.setFormatter(logging.Formatter("%(message)s"))
            self._handler = handler
            std = logging.Logger(f"sage.evictions.{self.path}", logging.INFO)
            std.propagate = False
            std.addHandler(handler)
            chain.append(structlog.processors.JSONRenderer())
            sink = std
        else:
            chain.append(_drop)
            sink = _NullSink()
        self._log = structlog.wrap_logger(
            sink,
            processors=chain,
            wrapper_class=structlog.stdlib.BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=True,
        )

    # ---- producing --------------------------------------------------------------------

    def evict(
        self,
        *,
        block: str,
        block_id: int,
        sequence_id: int | None,
        tenant: str | None,
        policy: str,
        reason: str,
        last_access: float,
        hits: int,
        priority: int,
        ts: float | None = None,
        parent: str | None = None,
        depth: int | None = None,
        explain: dict[str, Any] | None = None,
        eviction_id: int | None = None,
    ) -> None:
        """One victim block; `parent` and `depth` place it in the radix tree (the tree view's
        ghosts), `explain` says why it went (only with explanation on), `eviction_id` numbers
        it among the cache's evicted blocks (the lookup records' ``eviction.id``)."""
        extra: dict[str, Any] = {} if eviction_id is None else {"id": eviction_id}
        if explain is not None:
            extra["explain"] = explain
        self._log.info(
            "evict",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            block=block,
            parent=parent,
            depth=depth,
            block_id=block_id,
            sequence_id=sequence_id,
            tenant=tenant,
            policy=policy,
            reason=reason,
            last_access=last_access,
            hits=hits,
            priority=priority,
            **extra,
        )

    def freed(
        self,
        *,
        policy: str,
        reason: str,
        blocks_freed: int,
        total_freed: int,
        duration_us: float,
        ts: float | None = None,
    ) -> None:
        """One eviction call: how many blocks it freed and how long the policy took."""
        self._log.info(
            "freed",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            policy=policy,
            reason=reason,
            blocks_freed=blocks_freed,
            total_freed=total_freed,
            duration_us=duration_us,
        )

    def tier(
        self,
        event: str,
        *,
        block: str,
        tier: str,
        slot: int,
        to_tier: str | None,
        to_slot: int | None,
        policy: str | None,
        reason: str,
        ts: float | None = None,
        explain: dict[str, Any] | None = None,
    ) -> None:
        """One block's move between KV tiers: `event` is ``demote``, ``promote`` or ``drop``;
        `explain` (last, only with explanation on) says why the tier's policy chose it."""
        if event not in ("demote", "promote", "drop"):
            raise ValueError(f"unknown tier event {event!r}")
        extra: dict[str, Any] = {} if explain is None else {"explain": explain}
        self._log.info(
            event,
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            block=block,
            tier=tier,
            slot=slot,
            to_tier=to_tier,
            to_slot=to_slot,
            policy=policy,
            reason=reason,
            **extra,
        )

    def compress(
        self,
        *,
        sequence_id: int | None,
        policy: str,
        reason: str,
        tokens_before: int,
        tokens_after: int,
        blocks_freed: int,
        bytes_freed: int | None,
        duration_us: float,
        fallback: str | None = None,
        ts: float | None = None,
        victim: dict[str, Any] | None = None,
    ) -> None:
        """One token-level compression of a running sequence; `fallback` says why the policy
        kept the newest tokens instead of scoring by attention (None: it scored as it should).
        A cached prefix compressed instead of evicted (`cache.compressed`) has reason
        ``evict:<why>``, no sequence and no byte count (the cache core counts blocks), and
        `victim`: the block policy's victim (``block``), the chain compressed (``blocks``), the
        policy that chose it (``chosen_by``) and, with explanation on, why (``explain``)."""
        extra: dict[str, Any] = {} if victim is None else victim
        self._log.info(
            "compress",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            sequence_id=sequence_id,
            policy=policy,
            reason=reason,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            blocks_freed=blocks_freed,
            bytes_freed=bytes_freed,
            duration_us=duration_us,
            fallback=fallback,
            **extra,
        )

    def drop_compressed(
        self,
        *,
        blocks: list[str],
        blocks_freed: int,
        tokens_kept: int,
        hits: int,
        reason: str,
        why: str,
        ts: float | None = None,
    ) -> None:
        """A compressed prefix given up (compress-on-evict): its chain's blocks, the pool blocks
        it freed, the tokens it kept, the hits it served, and why it went."""
        self._log.info(
            "drop_compressed",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            blocks=blocks,
            blocks_freed=blocks_freed,
            tokens_kept=tokens_kept,
            hits=hits,
            reason=reason,
            why=why,
        )

    def store(
        self,
        *,
        blocks: list[str],
        parent: str | None,
        tokens: list[int],
        block_size: int,
        ts: float | None = None,
    ) -> None:
        """A chain of blocks newly cached on the device, `parent` first above them."""
        self._log.info(
            "store",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            blocks=blocks,
            parent=parent,
            tokens=tokens,
            block_size=block_size,
        )

    def reset(
        self, *, blocks: list[str], below: dict[str, list[str]], remaining: int, ts: float | None = None
    ) -> None:
        """A prefix-cache reset: what it removed from each tier and what stayed on the device."""
        self._log.info(
            "reset",
            ts=time.time() if ts is None else ts,
            run=self.run_id,
            blocks=blocks,
            below=below,
            remaining=remaining,
        )

    def _fan_out(self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> Any:
        """Processor: put ``event`` first, keep a copy in the ring and hand one to each subscriber."""
        record = {"event": event_dict.pop("event", None), **event_dict}
        for observer in self._observers:
            with contextlib.suppress(structlog.DropEvent):
                observer(logger, method_name, dict(record))
        with self._guard:
            self._ring.append(record)
            subscribers = tuple(self._subscribers)
        for subscriber in subscribers:
            try:
                if callable(subscriber):
                    subscriber(dict(record))
                else:
                    subscriber.put_nowait(dict(record))
            except queue.Full:
                pass  # a slow follower loses events rather than stalling the engine
            except Exception as exc:  # a broken subscriber must not break eviction
                if type(exc).__name__ != "QueueFull":  # asyncio.QueueFull: drop the event only
                    self.unsubscribe(subscriber)
        return record

    # ---- consuming -------------------------------------------------------------------

    def tail(self, n: int | None = None) -> list[dict[str, Any]]:
        """The last `n` events (all kept when None), oldest first."""
        with self._guard:
            events = list(self._ring)
        if n is not None:
            events = events[-n:] if n > 0 else []
        return events

    def __len__(self) -> int:
        return len(self._ring)

    def subscribe(self, subscriber: EventSubscriber) -> Callable[[], None]:
        """Deliver every later event to `subscriber` (called from the evicting thread).

        A callable is called with the event; anything else gets ``put_nowait(event)`` (a full
        queue drops the event). For asyncio, pass a callable that uses
        ``loop.call_soon_threadsafe``. A subscriber that raises is dropped.

        Returns:
            A function that unsubscribes it.
        """
        with self._guard:
            self._subscribers.append(subscriber)
        return lambda: self.unsubscribe(subscriber)

    def unsubscribe(self, subscriber: EventSubscriber) -> None:
        """Stop delivering to `subscriber` (no error when it is not subscribed)."""
        with self._guard:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    @property
    def num_subscribers(self) -> int:
        """Subscribers now."""
        return len(self._subscribers)

    def close(self) -> None:
        """Flush and close the file."""
        if self._handler is not None:
            self._handler.close()
            self._handler = None

    def __enter__(self) -> EvictionEventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop(logger: Any, method_name: str, event_dict: Mapping[str, Any]) -> Any:
    """Processor: end of the chain when no file is kept (nothing to render)."""
    raise structlog.DropEvent
