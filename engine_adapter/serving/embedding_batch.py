"""Embedding requests in the engine loop: records, the handle a caller waits on, and the chunking.

An embedding request (``POST /v1/embeddings``) is an `EmbeddingJob` of one or more texts. The
scheduler runs its texts through the served decoder in chunks of at most
``embedding_chunk_tokens`` tokens per engine step, in the same forward as the LLM's decodes and
prefill chunks (as chunked prefill does for prompts), so an embedding batch adds a bounded amount
of compute to each step and never stalls a decode step for its whole length. Jobs go earliest
deadline first.

A text's workspace (its K/V while its chunks run: the attention of a later chunk reads the keys
of the earlier ones) is a reservation of pool blocks (`CacheManager.reserve_blocks`), taken at
its first chunk and released after its last: the same memory budget as the KV cache, seen by
eviction and admission, and shown in the stats as ``reserved_blocks``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine_adapter.model.pooling import MeanPool

__all__ = ["EmbeddingHandle", "EmbeddingJob", "EmbeddingResult", "EmbeddingText"]


@dataclass(slots=True)
class EmbeddingResult:
    """What an embedding request ends with.

    Attributes:
        request_id: The request.
        vectors: One L2-normalised vector per input, in input order (empty on error).
        prompt_tokens: Tokens of all inputs.
        error: Why it failed (None: it succeeded).
        status: 200, or the HTTP status of the failure (429: rejected by admission, 500).
        queued_s: Seconds from arrival to its first chunk.
        latency_s: Seconds from arrival to its last chunk.
    """

    request_id: str
    vectors: list[list[float]]
    prompt_tokens: int
    error: str | None = None
    status: int = 200
    queued_s: float = 0.0
    latency_s: float = 0.0


@dataclass(eq=False, slots=True)
class EmbeddingText:
    """One input of an embedding request, as the scheduler runs it."""

    ids: list[int]
    pool: MeanPool = field(default_factory=MeanPool)
    done_tokens: int = 0
    reservation: int | None = None  # the reservation's owner id while its chunks run
    block_table: list[int] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return len(self.ids) - self.done_tokens

    @property
    def finished(self) -> bool:
        return self.done_tokens >= len(self.ids)


@dataclass(eq=False, slots=True)
class EmbeddingJob:
    """One embedding request in the engine: its texts, its deadline, and where its result goes.

    Attributes:
        request_id: The request.
        texts: Its inputs, in order.
        arrival: Engine-clock time it arrived.
        deadline: Engine-clock time it should be answered by (its ``slo_deadline_ms``).
        finish: Called once with the result.
        tenant: Its tenant (accounting).
        priority: Higher goes first among equal deadlines.
        started: When its first chunk ran.
    """

    request_id: str
    texts: list[EmbeddingText]
    arrival: float
    deadline: float
    finish: Callable[[EmbeddingResult], None]
    tenant: str | None = None
    priority: int = 0
    started: float | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(t.ids) for t in self.texts)

    @property
    def done(self) -> bool:
        return all(t.finished for t in self.texts)

    def blocks(self, block_size: int) -> int:
        """Blocks its largest text's workspace needs (texts run one after another)."""
        return max(-(-len(t.ids) // block_size) for t in self.texts)

    def reserved_blocks(self) -> int:
        """Blocks its running texts hold now."""
        return sum(len(t.block_table) for t in self.texts if t.reservation is not None)


class EmbeddingHandle:
    """A submitted embedding request: wait for its `EmbeddingResult`."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._done = threading.Event()
        self._result: EmbeddingResult | None = None

    def _finish(self, result: EmbeddingResult) -> None:
        self._result = result
        self._done.set()

    def result(self, timeout: float | None = None) -> EmbeddingResult:
        """The result once the engine has run every input.

        Raises:
            TimeoutError: Not finished within `timeout` seconds.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"embedding request {self.request_id} did not finish within {timeout}s")
        assert self._result is not None
        return self._result

    @property
    def finished(self) -> bool:
        return self._done.is_set()
