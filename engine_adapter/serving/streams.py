"""The control API's streams: NDJSON eviction events and server-sent completion events.

Waiting on the engine (a request's tokens, new eviction events) blocks for as long as the engine
takes, so each waiting request gets a daemon thread of its own (`ThreadPump`,
`call_in_daemon_thread`) and the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import structlog

from engine_adapter.serving.requests import dumps

if TYPE_CHECKING:
    from engine_adapter.serving.completion_requests import Completion
    from engine_adapter.serving.engine import Engine

__all__ = ["ThreadPump", "call_in_daemon_thread", "completion_events", "follow_events", "sse"]

log = structlog.get_logger("sage.server")

FOLLOW_POLL_S = 0.5  # how long a follow stream waits on the event queue before checking the engine


def sse(value: Any) -> str:
    """One server-sent event carrying `value` as JSON."""
    return f"data: {dumps(value)}\n\n"


_END = object()


class ThreadPump:
    """Runs a blocking iterator in a daemon thread and hands its items to the event loop.

    Waiting on the engine (a request's tokens, new eviction events) blocks for as long as the
    engine takes. A thread of the loop's default executor per waiting request would cap the
    concurrent requests at its size (min(32, cores + 4)), and a non-daemon worker stuck on a
    request could hold the process at exit; one daemon thread per waiting request has neither
    problem. Iterate with ``async for``; an exception of the iterator is raised there.
    """

    def __init__(self, items: Iterator[Any], name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()  # set when the consumer is gone: the producer stops early
        threading.Thread(target=self._run, args=(items,), name=name, daemon=True).start()

    def _post(self, item: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody will read
            return False
        return True

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if self.cancelled.is_set() or not self._post(item):
                    return
            self._post(_END)
        except BaseException as exc:
            self._post(exc)

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            while True:
                item = await self._queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancelled.set()


async def call_in_daemon_thread(fn: Callable[[], Any], name: str) -> Any:
    """`fn()` in a daemon thread of its own (see `ThreadPump`), awaited without blocking the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        def settle() -> None:
            if not future.done():  # the awaiting handler may have been cancelled
                setter(value)

        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            deliver(future.set_exception, exc)
        else:
            deliver(future.set_result, result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


def _new_events(
    engine: Engine, subscription: queue.Queue[dict[str, Any]], cancelled: Callable[[], bool]
) -> Iterator[dict[str, Any]]:
    """The events put on `subscription`, until the engine stops (then what is left) or `cancelled()`."""
    while not cancelled():
        try:
            yield subscription.get(timeout=FOLLOW_POLL_S)
        except queue.Empty:
            if getattr(engine, "stopped", False):
                break
    while not cancelled():
        try:
            yield subscription.get_nowait()
        except queue.Empty:
            return


async def follow_events(
    engine: Engine, subscription: queue.Queue[dict[str, Any]], tail: list[dict[str, Any]]
) -> AsyncIterator[str]:
    """NDJSON: the tail, then each new event until the engine stops or the client goes away."""
    seen = {dumps(event) for event in tail}
    stop = threading.Event()
    try:
        for event in tail:
            yield dumps(event) + "\n"
        async for event in ThreadPump(_new_events(engine, subscription, stop.is_set), "sage-follow"):
            line = dumps(event)
            if seen:
                if line in seen:  # delivered with the tail already
                    seen.discard(line)
                    continue
                seen.clear()  # past the overlap: nothing more can repeat
            yield line + "\n"
    finally:
        stop.set()
        engine.unsubscribe_events(subscription)


async def completion_events(completion: Completion, handle: Any) -> AsyncIterator[str]:
    """Server-sent events: one chunk per delta, the finish reason, with ``include_usage`` a
    last chunk of usage alone (OpenAI's stream), then [DONE]."""
    finished = False
    try:
        async for output in ThreadPump(iter(handle), f"sage-stream-{completion.request_id}"):
            if output.finished:
                finished = True
                if output.finish_reason in ("error", "rejected"):
                    message = output.error or "the engine failed on this request"
                    # rejected: colocation deferred it, then found no room before its slack ran out
                    kind = "slo_rejected" if output.finish_reason == "rejected" else "engine_error"
                    yield sse({"error": {"type": kind, "message": message}})
                    break
                yield sse(completion.stream_chunk(output.text, output.finish_reason))
                if completion.include_usage:
                    yield sse(completion.usage_chunk(output))
                break
            if output.text:
                yield sse(completion.stream_chunk(output.text, None))
    except Exception as exc:
        log.error("stream failed", request_id=completion.request_id, exc_info=exc)
        yield sse({"error": {"type": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
    finally:
        if not finished:
            handle.abort()  # the client went away, or the stream failed: free the slot
    yield "data: [DONE]\n\n"
