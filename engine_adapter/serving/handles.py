"""What a caller holds for a submitted completion: `RequestHandle`, fed by the engine loop.

The engine loop hands each `RequestOutput` of a request (its deltas, then its final output) to
the request's handle (`Sequence.emit`); the caller, in any thread, iterates the deltas
(blocking, or `stream` without blocking an event loop), waits for the whole `result`, or aborts
it. An embedding request's handle is `engine_adapter.serving.embedding_batch.EmbeddingHandle`.

Imports: the scheduler's records only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from engine_adapter.serving.sequence import RequestOutput

__all__ = ["RequestHandle"]


class RequestHandle:
    """A submitted request: iterate its deltas (blocking or async), or wait for the result.

    Args:
        request_id: The request.
        abort: Ends the request by id (the engine's `abort`).
    """

    def __init__(self, request_id: str, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._abort = abort
        self._queue: queue.Queue[RequestOutput] = queue.Queue()
        self._done = threading.Event()
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._final: RequestOutput | None = None

    def _put(self, output: RequestOutput) -> None:
        self._text.append(output.text)
        self._tokens.extend(output.token_ids)
        if output.finished:
            # the last delta's counts (cached, written, retention ...) with the whole text and tokens
            self._final = dataclasses.replace(output, text="".join(self._text), token_ids=list(self._tokens))
            self._done.set()
        self._queue.put(output)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self._queue.get()
            yield item
            if item.finished:
                return

    async def stream(self) -> AsyncIterator[RequestOutput]:
        """The deltas, without blocking the event loop."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                item = await asyncio.to_thread(self._queue.get)
            yield item
            if item.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """The final output (whole text and tokens).

        Raises:
            TimeoutError: Not finished within `timeout` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout}s")
        assert self._final is not None
        return self._final

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def abort(self) -> None:
        """Stop generating; the request ends with finish_reason "abort"."""
        self._abort(self.request_id)
