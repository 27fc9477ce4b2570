"""Embedding requests in the scheduler's step: their queue, each step's chunks, and their results.

`EmbeddingScheduler` holds the queued `EmbeddingJob`s (records and chunking in
`engine_adapter.serving.embedding_batch`) and gives each `Scheduler.step()` its embedding
chunks, earliest deadline first, which ride in the same forward as the LLM's rows:

- `schedule`: this step's chunks within `budget`; a text reserves its workspace blocks at its
  first chunk (`CacheManager.reserve_blocks`, evicting cached blocks when the pool is short)
  and waits when neither the pool nor its quota (`SchedulerHooks.admits_embedding`) has them;
- `advance`: pools each chunk's hidden states, releases a finished text's blocks and answers
  the finished jobs (`SchedulerHooks.on_embedding_finished`, then the caller);
- `budget`: beside decodes, the chunk is sized so that a step takes at most
  `EMBEDDING_TPOT_HEADROOM` longer than a decode-only one, at the per-token cost learnt from
  the steps' forward times (`learn_step_cost`), never fewer than `MIN_EMBEDDING_CHUNK` tokens.

Imports: the cache manager, the embedding records and the hooks protocol.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.serving.embedding_batch import EmbeddingJob, EmbeddingResult, EmbeddingText
from engine_adapter.serving.hooks import SchedulerHooks

__all__ = ["EMBEDDING_TPOT_HEADROOM", "MIN_EMBEDDING_CHUNK", "EmbeddingScheduler"]

# Embedding chunks beside decodes: the embedding work of a step that also decodes is sized so
# that the step takes at most this much longer than a decode-only step (TPOT stays within
# 1 + headroom of what it is without embeddings), learnt from the steps' forward times; never
# fewer tokens than the floor, so embeddings progress.
EMBEDDING_TPOT_HEADROOM = 0.4
MIN_EMBEDDING_CHUNK = 8
_PROBE_EVERY = 32  # steps: a decode step without embeddings re-measures the baseline
_EWMA = 0.2


class EmbeddingScheduler:
    """The embedding queue and each step's embedding chunks.

    Args:
        cache: The cache manager (the texts' workspace is a reservation of its pool).
        chunk_tokens: Most embedding tokens per step (``embedding_chunk_tokens``).
        clock: The scheduler's monotonic clock (arrival, start and latency).
        hooks: The scheduler's hooks (the embedding quota, the finished requests).
    """

    def __init__(
        self, cache: CacheManager, chunk_tokens: int, clock: Callable[[], float], hooks: SchedulerHooks
    ) -> None:
        self.cache = cache
        self.chunk_tokens = chunk_tokens
        self.clock = clock
        self.hooks = hooks
        self.queue: list[EmbeddingJob] = []  # earliest deadline first once a step sorts it
        self.cache_s = 0.0  # time in the cache manager during the current step
        self._reservation_ids = itertools.count(1)
        self.decode_step_s: float | None = None  # EWMA forward time of decode-only steps
        self.embedding_token_s: float | None = None  # EWMA marginal forward time per embedding token
        self._steps_since_probe = 0

    # ---- requests ------------------------------------------------------------------------------

    def add(self, job: EmbeddingJob) -> None:
        """Queue an embedding request (validated: every text fits the pool and the model)."""
        self.queue.append(job)

    def abort(self, request_id: str, message: str, status: int = 500) -> bool:
        """End a queued or running embedding request with an error; returns whether found."""
        for job in self.queue:
            if job.request_id == request_id:
                self.finish(job, message, status)
                return True
        return False

    def fail_started(self, message: str) -> None:
        """End every embedding request that has started (a failed step), releasing its blocks."""
        for job in [j for j in self.queue if j.started is not None]:
            self.finish(job, message, 500)

    # ---- the chunk budget --------------------------------------------------------------------

    def budget(self, decoding: bool) -> int:
        """Embedding tokens this step may take: `chunk_tokens` when no sequence decodes; beside
        decodes, what lengthens the step by `EMBEDDING_TPOT_HEADROOM` of a decode-only step at
        the learnt cost per embedding token (0 for a probe step that re-measures the decode-only
        baseline)."""
        cap = self.chunk_tokens
        if not decoding:
            return cap
        self._steps_since_probe += 1
        if self.decode_step_s is None or self._steps_since_probe >= _PROBE_EVERY:
            return 0  # measure a decode step alone first
        if self.embedding_token_s is None or self.embedding_token_s <= 0:
            return min(cap, MIN_EMBEDDING_CHUNK)
        fit = int(EMBEDDING_TPOT_HEADROOM * self.decode_step_s / self.embedding_token_s)
        return max(min(cap, MIN_EMBEDDING_CHUNK), min(cap, fit))

    def learn_step_cost(self, forward_s: float, decoding: bool, embedding_tokens: int) -> None:
        """Update the decode-only baseline and the marginal cost of an embedding token."""
        if decoding and embedding_tokens == 0:
            old = self.decode_step_s
            self.decode_step_s = forward_s if old is None else (1 - _EWMA) * old + _EWMA * forward_s
            self._steps_since_probe = 0
        elif embedding_tokens > 0:
            base = self.decode_step_s if decoding and self.decode_step_s is not None else 0.0
            sample = max(forward_s - base, 0.0) / embedding_tokens
            old = self.embedding_token_s
            self.embedding_token_s = sample if old is None else (1 - _EWMA) * old + _EWMA * sample

    # ---- the step ------------------------------------------------------------------------------

    def schedule(self, decoding: bool = False) -> tuple[list[EmbeddingText], list[int]]:
        """This step's embedding chunks, earliest deadline first, within `budget`; a text
        reserves its workspace blocks at its first chunk (evicting cached blocks if the pool is
        short) and waits when neither the pool nor its quota has them."""
        texts: list[EmbeddingText] = []
        chunks: list[int] = []
        if not self.queue:
            return texts, chunks
        budget = self.budget(decoding)
        self.queue.sort(key=lambda j: (j.deadline, -j.priority, j.arrival))
        now = self.clock()
        for job in self.queue:
            for text in job.texts:
                if budget <= 0:
                    return texts, chunks
                if text.finished:
                    continue
                if text.reservation is None and not self._reserve(job, text):
                    return texts, chunks
                if job.started is None:
                    job.started = now
                n = min(text.remaining, budget)
                texts.append(text)
                chunks.append(n)
                budget -= n
        return texts, chunks

    def _reserve(self, job: EmbeddingJob, text: EmbeddingText) -> bool:
        """Reserve `text`'s workspace for its chunks; False: its quota or the pool says wait."""
        need = -(-len(text.ids) // self.cache.block_size)
        if not self.hooks.admits_embedding(job, need):
            return False
        owner = next(self._reservation_ids)
        t = time.perf_counter()
        table = self.cache.reserve_blocks(owner, need)
        self.cache_s += time.perf_counter() - t
        if table is None:  # the pool is full of blocks in use: wait for them
            return False
        text.reservation, text.block_table = owner, table
        return True

    def advance(self, texts: list[EmbeddingText], chunks: list[int], sums: torch.Tensor) -> int:
        """Pool each chunk's hidden states; release finished texts' blocks; answer finished jobs."""
        for row, (text, n) in enumerate(zip(texts, chunks, strict=True)):
            text.pool.add(sums[row], n)
            text.done_tokens += n
            if text.finished and text.reservation is not None:
                self.cache.release_reservation(text.reservation)
                text.reservation, text.block_table = None, []
        done = [job for job in self.queue if job.done]
        for job in done:
            self.finish(job, None, 200)
        return sum(chunks)

    def finish(self, job: EmbeddingJob, error: str | None, status: int) -> None:
        """Take `job` off the queue, release its blocks and answer it (`error`: it failed)."""
        self.queue.remove(job)
        for text in job.texts:
            if text.reservation is not None:
                self.cache.release_reservation(text.reservation)
                text.reservation, text.block_table = None, []
        now = self.clock()
        result = EmbeddingResult(
            request_id=job.request_id,
            vectors=[t.pool.vector() for t in job.texts] if error is None else [],
            prompt_tokens=job.num_tokens,
            error=error,
            status=status,
            queued_s=(job.started if job.started is not None else now) - job.arrival,
            latency_s=now - job.arrival,
        )
        self.hooks.on_embedding_finished(job, result)
        job.finish(result)
