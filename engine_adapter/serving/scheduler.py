"""Iteration-level continuous batching over the cache manager and the model (docs/architecture.md, "Engine").

Each `Scheduler.step()`:

1. aborts waiting requests past `queued_timeout` and drops the lowest priority beyond
   `max_queued_requests`, each with a reason;
2. admits waiting requests, highest priority first then oldest, while a sequence slot is free
   and the cache manager can allocate the uncached part of the prompt (a hit is locked, so an
   admitted request keeps its prefix);
3. reserves one KV slot for every decoding sequence; when the pool cannot give one, the active
   policy's `select_victims` chooses a running sequence to preempt by recompute (its full
   blocks stay cached, so its re-prefill can hit) and it goes back to the head of the queue;
4. runs one batched forward: a prefill chunk for sequences still in prefill (within the
   `max_num_batched_tokens` budget) and one token for each decoding sequence;
5. samples, detokenizes, checks stop conditions, caches newly full blocks so that concurrent
   requests share them, and releases finished sequences (their full blocks stay cached).

A preempted sequence recomputes prompt and output together; with greedy sampling it produces
exactly the tokens it would have produced without preemption.

Token-level eviction (engine_adapter.token_eviction), when the engine has a token policy or a
request asks for ``kv_compression``: a request's prompt is compressed once right after its
prefill; after each step `TokenCacheManager.maybe_evict` compresses decoding sequences, longest
first, while memory is under the threshold; and when a decode slot cannot be reserved, one
sequence is compressed before any is preempted. A compressed sequence's cache holds fewer tokens
than it has (`Sequence.evicted_tokens` fewer): its new tokens sit at cache index
``num_computed - evicted_tokens`` with RoPE position ``num_computed``.

The scheduler is not thread-safe: the engine calls `step` with the cache manager's lock held.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
import torch

from engine_adapter.cache.adaptive_batch import AdaptiveBatch, BatchChange
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.model.decoder import AttentionObserver, Decoder, ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.sampling import SamplingParams, make_generator, sample_batch
from engine_adapter.model.tokenizer import IncrementalDetokenizer, Tokenizer
from engine_adapter.serving.embedding_batch import EmbeddingJob, EmbeddingResult, EmbeddingText
from engine_adapter.token_eviction import KVCompression
from engine_adapter.token_eviction.policies import TokenEvictionPolicy, kept_for_ratio, make_token_policy
from engine_adapter.token_eviction.pressure import TokenCacheManager
from engine_adapter.token_eviction.sequence_kv import CompactionRefused, SequenceKV

__all__ = ["RequestOutput", "Scheduler", "SchedulerLimits", "Sequence", "SequenceStatus", "StepStats"]

log = structlog.get_logger("sage.scheduler")

# Embedding chunks beside decodes (engine_adapter.serving.embedding_batch): the embedding work of
# a step that also decodes is sized so that the step takes at most this much longer than a
# decode-only step (TPOT stays within 1 + headroom of what it is without embeddings), learnt
# from the steps' forward times; never fewer tokens than the floor, so embeddings progress.
EMBEDDING_TPOT_HEADROOM = 0.4
MIN_EMBEDDING_CHUNK = 8
_PROBE_EVERY = 32  # steps: a decode step without embeddings re-measures the baseline
_EWMA = 0.2


class SequenceStatus(enum.Enum):
    """Where a sequence is."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestOutput:
    """A delta while a request runs, or its final output.

    Attributes:
        request_id: The request.
        text: New text (a delta) while streaming; the whole text in the final output.
        token_ids: New token ids, or all of them in the final output.
        finished: Whether the request ended.
        finish_reason: "stop", "length", "abort", "timeout", "dropped" or "error".
        error: Why a request ended without completing (abort, timeout, dropped, error).
        prompt_tokens: Prompt length in tokens.
        cached_tokens: Prompt tokens served from the prefix cache at first admission.
        completion_tokens: Tokens generated so far.
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class SchedulerLimits:
    """Batch and queue limits (engine config keys of the same names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_queued_requests: int | None = None
    queued_timeout: float | None = None
    embedding_chunk_tokens: int = 128


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler tracks it."""

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    detokenizer: IncrementalDetokenizer
    emit: Callable[[RequestOutput], None]
    priority: int = 0
    tenant: str | None = None
    cache_salt: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0  # tokens whose K/V are in the pool
    block_table: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens hit at first admission
    text: str = ""
    emitted_chars: int = 0
    emitted_tokens: int = 0  # output ids already handed out in deltas
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    finish_reason: str | None = None
    error: str | None = None
    kv_compression: KVCompression | None = None  # compress the prompt once after prefill
    evicted_tokens: int = 0  # tokens token-level eviction removed from its cache (RoPE offset)
    observer: AttentionObserver | None = None  # what its attention exposes to its token policy
    prompt_compressed: bool = False
    # SLOs (spec 004), in milliseconds; None: no SLO given and colocation off.
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # Absolute time (the cache's clock) its blocks should be done by: the `slo` policy's
    # deadline. None: no deadline known (the policy's default slack).
    deadline: float | None = None

    @property
    def cache_len(self) -> int:
        """Tokens of this sequence whose K/V are in the pool now."""
        return self.num_computed - self.evicted_tokens

    @property
    def all_ids(self) -> list[int]:
        """Prompt and output tokens: what a (re)prefill computes."""
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


def _cache_request(
    seq: Sequence, *, estimated_lifetime: float | None = None, deadline: float | None = None
) -> CacheRequest:
    """What `seq` brings to the cache manager now: its tokens so far (a re-prefill after
    preemption includes its output), isolation key and policy metadata.

    Args:
        seq: The sequence.
        estimated_lifetime: Its predicted remaining life in seconds (predictive policies).
        deadline: When its blocks should be done by (the `slo` policy); none: no deadline.
    """
    return CacheRequest(
        seq.seq_id,
        seq.all_ids,
        cache_salt=seq.cache_salt,
        tenant=seq.tenant,
        priority=seq.priority,
        max_tokens=len(seq.prompt_ids) + seq.sampling.max_tokens,
        deadline=deadline,
        estimated_lifetime=estimated_lifetime,
        # A prompt compressed after prefill is scored by all its queries, as kvpress does.
        match_prefix=seq.kv_compression is None,
    )


@dataclass(slots=True)
class StepStats:
    """What one step did (for the engine's metrics and the benchmark)."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    embedding_tokens: int = 0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0  # everything but the forward: scheduling, sampling, detokenizing
    cache_s: float = 0.0  # of which in the cache manager and the policy


class Scheduler:
    """Continuous batching with chunked prefill, priority admission and preemption by recompute.

    Args:
        cache: The cache manager (its pool is the model's KV pool).
        decoder: The model.
        pool: The paged KV pool the decoder reads and writes.
        tokenizer: For detokenizing and the eos ids.
        limits: Batch and queue limits.
        clock: Monotonic time source.
    """

    def __init__(
        self,
        cache: CacheManager,
        decoder: Decoder,
        pool: PagedKVPool,
        tokenizer: Tokenizer,
        limits: SchedulerLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.decoder = decoder
        self.pool = pool
        self.tokenizer = tokenizer
        self.limits = limits or SchedulerLimits()
        self.clock = clock
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._next_seq_id = 0
        self.finished_count = 0
        self.total_preemptions = 0
        self.preempted_in_step = 0
        self.cache_s = 0.0  # time in the cache manager during the current step
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        # Hooks for the engine's metrics: called with the sequence (and its prompt hit in tokens).
        self.on_admitted: Callable[[Sequence, int], None] | None = None
        self.on_finished: Callable[[Sequence], None] | None = None
        # Lifetime prediction (predictive policies): seconds a sequence has left, at admission.
        self.estimate_lifetime: Callable[[Sequence], float] | None = None
        # Colocation: the deadline (cache clock) a sequence's blocks get at admission, from its
        # real slack; None: the sequence's own `deadline`.
        self.deadline_for: Callable[[Sequence], float | None] | None = None
        # Colocation: running sequences to preempt so that `blocks` blocks come free (Algorithm 3);
        # None: the eviction policy's `select_preemption_victims`.
        self.choose_victims: Callable[[list[Sequence], int], list[Sequence]] | None = None
        # Colocation: whether a waiting sequence may be admitted within the LLM quota now.
        self.llm_gate: Callable[[Sequence], bool] | None = None
        # --adaptive-batch: the running limit follows the re-prefill rate (adaptive_batch.py);
        # each change is logged here and handed to `on_batch_change` (the engine's metrics).
        self.adaptive: AdaptiveBatch | None = None
        self.on_batch_change: Callable[[BatchChange], None] | None = None
        # Token-level eviction (--token-eviction, kv_compression); None: never compress.
        self.token_eviction: TokenCacheManager | None = None
        self._named_policies: dict[str, TokenEvictionPolicy] = {}
        # Embedding requests (engine_adapter.serving.embedding_batch), earliest deadline first.
        self.embedding_queue: list[EmbeddingJob] = []
        self._reservation_ids = itertools.count(1)
        # Colocation: whether an embedding job may reserve `n` more blocks now (its quota);
        # None: whenever the pool has them.
        self.embedding_gate: Callable[[EmbeddingJob, int], bool] | None = None
        self.on_embedding_finished: Callable[[EmbeddingJob, EmbeddingResult], None] | None = None
        self._decode_step_s: float | None = None  # EWMA forward time of decode-only steps
        self._embedding_token_s: float | None = None  # EWMA marginal forward time per embedding token
        self._steps_since_probe = 0

    # ---- requests ---------------------------------------------------------------------

    def new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    def add(self, seq: Sequence, *, keep_arrival: bool = False) -> None:
        """Queue a validated sequence (`keep_arrival`: it arrived earlier, e.g. deferred by
        colocation's admission, and its latency counts from then)."""
        if seq.generator is None and not seq.sampling.greedy:
            seq.generator = make_generator(seq.sampling.seed)
        if not keep_arrival:
            seq.arrival = self.clock()
        self.waiting.append(seq)
        self._protect(seq)
        cap = self.limits.max_queued_requests
        if cap is not None and len(self.waiting) > cap:
            # Drop the lowest priority, and among those the newest.
            victim = min(self.waiting, key=lambda s: (s.priority, -s.arrival))
            self.waiting.remove(victim)
            self._finish(
                victim,
                "dropped",
                f"queue full ({cap} waiting requests); dropped the lowest priority ({victim.priority})",
            )

    def abort(self, request_id: str, reason: str = "abort", message: str = "aborted by the client") -> bool:
        """End a request wherever it is; returns whether it was found."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, reason, message)
                return True
        for seq in self.running:
            if seq.request_id == request_id:
                self._release(seq)
                self.running.remove(seq)
                self._finish(seq, reason, message)
                return True
        return False

    def preempt_request(self, request_id: str) -> bool:
        """Preempt a running request by recompute (colocation's ADMIT_WITH_PREEMPTION)."""
        for seq in self.running:
            if seq.request_id == request_id:
                self._preempt(seq)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.embedding_queue)

    # ---- embeddings ------------------------------------------------------------------------

    def add_embedding(self, job: EmbeddingJob) -> None:
        """Queue an embedding request (validated: every text fits the pool and the model)."""
        self.embedding_queue.append(job)

    def abort_embedding(self, request_id: str, message: str, status: int = 500) -> bool:
        """End a queued or running embedding request with an error; returns whether found."""
        for job in self.embedding_queue:
            if job.request_id == request_id:
                self._finish_embedding(job, message, status)
                return True
        return False

    def fail_embeddings(self, message: str) -> None:
        """End every embedding request that has started (a failed step), releasing its blocks."""
        for job in [j for j in self.embedding_queue if j.started is not None]:
            self._finish_embedding(job, message, 500)

    def embedding_budget(self, decoding: bool) -> int:
        """Embedding tokens this step may take: `embedding_chunk_tokens` when no sequence decodes;
        beside decodes, what lengthens the step by `EMBEDDING_TPOT_HEADROOM` of a decode-only
        step at the learnt cost per embedding token (0 for a probe step that re-measures the
        decode-only baseline)."""
        cap = self.limits.embedding_chunk_tokens
        if not decoding:
            return cap
        self._steps_since_probe += 1
        if self._decode_step_s is None or self._steps_since_probe >= _PROBE_EVERY:
            return 0  # measure a decode step alone first
        if self._embedding_token_s is None or self._embedding_token_s <= 0:
            return min(cap, MIN_EMBEDDING_CHUNK)
        fit = int(EMBEDDING_TPOT_HEADROOM * self._decode_step_s / self._embedding_token_s)
        return max(min(cap, MIN_EMBEDDING_CHUNK), min(cap, fit))

    def _learn_step_cost(self, forward_s: float, decoding: bool, embedding_tokens: int) -> None:
        """Update the decode-only baseline and the marginal cost of an embedding token."""
        if decoding and embedding_tokens == 0:
            old = self._decode_step_s
            self._decode_step_s = forward_s if old is None else (1 - _EWMA) * old + _EWMA * forward_s
            self._steps_since_probe = 0
        elif embedding_tokens > 0:
            base = self._decode_step_s if decoding and self._decode_step_s is not None else 0.0
            sample = max(forward_s - base, 0.0) / embedding_tokens
            old = self._embedding_token_s
            self._embedding_token_s = sample if old is None else (1 - _EWMA) * old + _EWMA * sample

    def _schedule_embeddings(self, decoding: bool = False) -> tuple[list[EmbeddingText], list[int]]:
        """This step's embedding chunks, earliest deadline first, within `embedding_budget`; a
        text reserves its workspace blocks at its first chunk (evicting cached blocks if the pool
        is short) and waits when neither the pool nor its quota has them."""
        texts: list[EmbeddingText] = []
        chunks: list[int] = []
        if not self.embedding_queue:
            return texts, chunks
        budget = self.embedding_budget(decoding)
        self.embedding_queue.sort(key=lambda j: (j.deadline, -j.priority, j.arrival))
        now = self.clock()
        block_size = self.cache.block_size
        for job in self.embedding_queue:
            for text in job.texts:
                if budget <= 0:
                    return texts, chunks
                if text.finished:
                    continue
                if text.reservation is None:
                    need = -(-len(text.ids) // block_size)
                    if self.embedding_gate is not None and not self.embedding_gate(job, need):
                        return texts, chunks
                    owner = next(self._reservation_ids)
                    t = time.perf_counter()
                    table = self.cache.reserve_blocks(owner, need)
                    self.cache_s += time.perf_counter() - t
                    if table is None:  # the pool is full of blocks in use: wait for them
                        return texts, chunks
                    text.reservation, text.block_table = owner, table
                if job.started is None:
                    job.started = now
                n = min(text.remaining, budget)
                texts.append(text)
                chunks.append(n)
                budget -= n
        return texts, chunks

    def _advance_embeddings(self, texts: list[EmbeddingText], chunks: list[int], sums: torch.Tensor) -> int:
        """Pool each chunk's hidden states; release finished texts' blocks; answer finished jobs."""
        for row, (text, n) in enumerate(zip(texts, chunks, strict=True)):
            text.pool.add(sums[row], n)
            text.done_tokens += n
            if text.finished and text.reservation is not None:
                self.cache.release_reservation(text.reservation)
                text.reservation, text.block_table = None, []
        done = [job for job in self.embedding_queue if job.done]
        for job in done:
            self._finish_embedding(job, None, 200)
        return sum(chunks)

    def _finish_embedding(self, job: EmbeddingJob, error: str | None, status: int) -> None:
        self.embedding_queue.remove(job)
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
        if self.on_embedding_finished is not None:
            self.on_embedding_finished(job, result)
        job.finish(result)

    # ---- the step ------------------------------------------------------------------------

    def step(self) -> StepStats:
        """One iteration: admit, reserve (preempting when short), forward, sample, release."""
        stats = StepStats()
        self.cache_s = 0.0
        t0 = time.perf_counter()
        self._expire_waiting()
        stats.admitted = self._admit()
        batch_seqs, chunks, stats.preempted = self._schedule()
        # a step decodes when an LLM row computes one token; prefill chunks are no TPOT to protect
        decoding = any(n == 1 for n in chunks)
        emb_texts, emb_chunks = self._schedule_embeddings(decoding)
        t1 = time.perf_counter()
        if batch_seqs or emb_texts:
            observers: list[AttentionObserver | None] = [seq.observer for seq in batch_seqs]
            offsets = [seq.evicted_tokens for seq in batch_seqs]
            token_ids = [
                seq.all_ids[seq.num_computed : seq.num_computed + n]
                for seq, n in zip(batch_seqs, chunks, strict=True)
            ]
            starts = [seq.cache_len for seq in batch_seqs]
            tables = [seq.block_table for seq in batch_seqs]
            # Embedding chunks ride in the same forward, after the LLM's rows.
            for text, n in zip(emb_texts, emb_chunks, strict=True):
                token_ids.append(text.ids[text.done_tokens : text.done_tokens + n])
                starts.append(text.done_tokens)
                tables.append(text.block_table)
                offsets.append(0)
                observers.append(None)
            batch = ForwardBatch(
                token_ids=token_ids,
                start_positions=starts,
                block_tables=tables,
                position_offsets=offsets if any(offsets) else None,
                observers=observers if any(o is not None for o in observers) else None,
                pool_hidden=[False] * len(batch_seqs) + [True] * len(emb_texts) if emb_texts else None,
            )
            out = self.decoder(batch, self.pool)
            t2 = time.perf_counter()
            stats.forward_s = t2 - t1
            self._learn_step_cost(stats.forward_s, decoding, sum(emb_chunks))
            if emb_texts:
                assert out.hidden_sums is not None
                stats.embedding_tokens = self._advance_embeddings(
                    emb_texts, emb_chunks, out.hidden_sums[len(batch_seqs) :]
                )
            if batch_seqs:
                stats.finished = self._advance(batch_seqs, chunks, out.logits[: len(batch_seqs)], stats)
                self._compress_after_step()
            t3 = time.perf_counter()
            stats.bookkeeping_s = (t1 - t0) + (t3 - t2)
        else:
            stats.bookkeeping_s = t1 - t0
        stats.cache_s = self.cache_s
        if self.adaptive is not None:
            change = self.adaptive.observe(self.cache.total_evictions, self.cache.re_prefill_blocks)
            if change is not None:
                log.info("batch limit changed", **change.to_dict())
                if self.on_batch_change is not None:
                    self.on_batch_change(change)
        return stats

    def _expire_waiting(self) -> None:
        timeout = self.limits.queued_timeout
        if timeout is None or not self.waiting:
            return
        now = self.clock()
        expired = [s for s in self.waiting if s.num_preemptions == 0 and now - s.arrival > timeout]
        for seq in expired:
            self.waiting.remove(seq)
            self._finish(
                seq, "timeout", f"waited {now - seq.arrival:.2f}s in the queue (queued_timeout={timeout}s)"
            )

    def _admit(self) -> int:
        if not self.waiting:
            return 0
        self.waiting.sort(key=lambda s: (-s.priority, s.arrival))
        admitted = 0
        limit = self.adaptive.current if self.adaptive is not None else self.limits.max_num_seqs
        while self.waiting and len(self.running) < limit:
            seq = self.waiting[0]
            if self.llm_gate is not None and not self.llm_gate(seq):
                break  # over the LLM quota: wait for running sequences to finish
            t = time.perf_counter()
            try:
                alloc = self.cache.allocate(
                    _cache_request(
                        seq,
                        estimated_lifetime=self.estimate_lifetime(seq) if self.estimate_lifetime else None,
                        deadline=self.deadline_for(seq) if self.deadline_for is not None else seq.deadline,
                    )
                )
            except NoEvictableBlocksError:
                self.cache_s += time.perf_counter() - t
                break  # wait for running sequences to finish; keep priority order
            except RequestTooLargeError as exc:
                self.cache_s += time.perf_counter() - t
                self.waiting.pop(0)
                self._finish(seq, "error", str(exc))
                continue
            except Exception as exc:
                # Any other failure is this request's alone: it leaves the queue with the error,
                # so that it cannot fail every later step, and the rest are admitted as usual.
                self.cache_s += time.perf_counter() - t
                self.waiting.pop(0)
                log.error("admission failed", request_id=seq.request_id, exc_info=exc)
                self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
                continue
            self.cache_s += time.perf_counter() - t
            self.waiting.pop(0)
            seq.block_table = alloc.block_table
            seq.num_computed = alloc.num_cached_tokens
            if seq.cached_tokens is None:
                seq.cached_tokens = min(alloc.num_cached_tokens, len(seq.prompt_ids))
            seq.status = SequenceStatus.RUNNING
            policy = self._token_policy(seq)
            seq.observer = policy.make_observer() if policy is not None else None
            self.running.append(seq)
            admitted += 1
            if self.on_admitted is not None:
                self.on_admitted(seq, alloc.num_cached_tokens)
        return admitted

    def _schedule(self) -> tuple[list[Sequence], list[int], int]:
        """Pick this step's sequences and token counts; reserve decode slots, preempting if short."""
        self.preempted_in_step = 0
        # Highest priority first, then oldest: they keep their slots when the pool runs short.
        self.running.sort(key=lambda s: (-s.priority, s.arrival))
        budget = self.limits.max_num_batched_tokens
        batch: list[Sequence] = []
        chunks: list[int] = []
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            remaining = seq.num_tokens - seq.num_computed
            if remaining <= 0 or budget <= 0:
                continue
            n = min(remaining, budget)
            if not self._reserve(seq, n, batch, chunks):
                continue
            batch.append(seq)
            chunks.append(n)
            budget -= n
        return batch, chunks, self.preempted_in_step

    def _reserve(self, seq: Sequence, n_new: int, batch: list[Sequence], chunks: list[int]) -> bool:
        """Make `seq`'s blocks hold `n_new` more tokens; compress (token-level eviction) or
        preempt others (or `seq`) when the pool is short."""
        if seq.cache_len + n_new <= len(seq.block_table) * self.cache.block_size:
            return True
        while True:
            num_tokens = seq.cache_len + n_new  # `seq` itself may have been compressed
            if num_tokens <= len(seq.block_table) * self.cache.block_size:
                return True
            t = time.perf_counter()
            try:
                new_ids = self.cache.reserve_tokens(seq.seq_id, num_tokens)
            except RequestTooLargeError as exc:
                # Only with a token policy can a sequence outgrow the whole pool (the engine
                # admits it when its prompt fits): it shrinks itself, or ends with the error.
                self.cache_s += time.perf_counter() - t
                if self.token_eviction is not None and self._pressure(
                    [(seq, self._sequence_kv(seq))] if self._token_policy(seq) else [], force=True
                ):
                    continue
                self._release(seq)
                self.running.remove(seq)
                self._finish(seq, "error", str(exc))
                return False
            if new_ids is not None:
                seq.block_table = self.cache.block_table(seq.seq_id)
                self.cache_s += time.perf_counter() - t
                return True
            self.cache_s += time.perf_counter() - t
            if self._compress_instead_of_preempting(batch, chunks):
                continue
            t = time.perf_counter()
            skip = {s.seq_id for s in batch}
            skip.add(seq.seq_id)
            victim: Sequence | None
            if self.choose_victims is not None:
                others = [s for s in self.running if s.seq_id not in skip]
                chosen = self.choose_victims(others, 1)
                victim = chosen[0] if chosen else None
            else:
                victim_ids = self.cache.select_preemption_victims(1, exclude=skip)
                by_id = {s.seq_id: s for s in self.running}
                victim = by_id.get(victim_ids[0]) if victim_ids else None
            self.cache_s += time.perf_counter() - t
            if victim is None:
                self._preempt(seq)  # nothing else can give way
                return False
            self._preempt(victim)

    def _preempt(self, seq: Sequence) -> None:
        t = time.perf_counter()
        self.cache.preempt(seq.seq_id, seq.all_ids, num_computed_tokens=seq.num_computed)
        self.cache_s += time.perf_counter() - t
        self.running.remove(seq)
        self.preempted_in_step += 1
        self.total_preemptions += 1
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        seq.num_computed = 0
        seq.block_table = []
        self._reset_compression(seq)
        self.waiting.insert(0, seq)
        self._protect(seq)

    def _protect(self, seq: Sequence) -> None:
        """Queue-aware protection of a waiting sequence's cached prefix (a no-op unless the cache
        has `protect_queued`); `allocate` ends it when the sequence runs, `_finish` when it leaves."""
        if self.cache.max_protected > 0:
            t = time.perf_counter()
            self.cache.protect_queued_prefix(_cache_request(seq))
            self.cache_s += time.perf_counter() - t

    def _release(self, seq: Sequence) -> None:
        t = time.perf_counter()
        if self.cache.has_sequence(seq.seq_id):
            self.cache.free_sequence(seq.seq_id, seq.all_ids, num_computed_tokens=seq.num_computed)
        self.cache_s += time.perf_counter() - t
        if self.token_eviction is not None:
            self.token_eviction.forget(seq.seq_id)

    # ---- token-level eviction ------------------------------------------------------------

    def _named_policy(self, name: str) -> TokenEvictionPolicy:
        policy = self._named_policies.get(name)
        if policy is None:
            window = self.token_eviction.window if self.token_eviction is not None else 1024
            policy = self._named_policies[name] = make_token_policy(name, window=window)
        return policy

    def _token_policy(self, seq: Sequence) -> TokenEvictionPolicy | None:
        """The policy that compresses `seq`: its request's, else the engine's (None: never)."""
        if seq.kv_compression is not None:
            return self._named_policy(seq.kv_compression.policy)
        manager = self.token_eviction
        if manager is None or manager.policy.name() == "none":
            return None
        return manager.policy

    def _reset_compression(self, seq: Sequence) -> None:
        seq.evicted_tokens = 0
        seq.observer = None
        seq.prompt_compressed = False
        if self.token_eviction is not None:
            self.token_eviction.forget(seq.seq_id)

    def _sequence_kv(self, seq: Sequence, *, for_room: bool = True) -> SequenceKV:
        """`seq` as a `SequenceKV` whose compaction takes its new table from the cache manager;
        `for_room`: refuse a compaction that would not give blocks back (shared prefixes)."""

        def reallocate(n: int) -> list[int]:
            if for_room and self.cache.compaction_gain(seq.seq_id, n) <= 0:
                raise CompactionRefused(f"compacting sequence {seq.seq_id} would free no block")
            table = self.cache.compact_sequence(seq.seq_id, n)
            if table is None:
                raise CompactionRefused(f"no blocks to compact sequence {seq.seq_id} into")
            return table

        return SequenceKV(
            self.pool,
            seq.block_table,
            seq.cache_len,
            position_offset=seq.evicted_tokens,
            observer=seq.observer,
            reallocate=reallocate,
        )

    def _manager(self) -> TokenCacheManager:
        if self.token_eviction is None:  # a request's kv_compression on an engine without one
            raise RuntimeError("token-level eviction needs Scheduler.token_eviction")
        return self.token_eviction

    def _decoding(self, exclude: set[int]) -> list[tuple[Sequence, SequenceKV]]:
        """Running sequences past their prompt, not in `exclude`, that a policy may compress."""
        return [
            (seq, self._sequence_kv(seq))
            for seq in self.running
            if seq.status is SequenceStatus.RUNNING
            and seq.seq_id not in exclude
            and seq.num_computed >= len(seq.prompt_ids)
            and self._token_policy(seq) is not None
        ]

    def _pressure(self, candidates: list[tuple[Sequence, SequenceKV]], *, force: bool) -> bool:
        if not candidates:
            return False
        by_id = {seq.seq_id: seq for seq, _kv in candidates}
        t = time.perf_counter()
        try:
            result = self._manager().maybe_evict(
                [(seq.seq_id, kv) for seq, kv in candidates],
                lambda sid: self._token_policy(by_id[sid]),
                reason="preempt" if force else "pressure",
                force=force,
            )
        finally:
            for seq, kv in candidates:
                seq.block_table, seq.evicted_tokens = kv.block_table, kv.position_offset
            self.cache_s += time.perf_counter() - t
        return result.evicted

    def _compress_instead_of_preempting(self, batch: list[Sequence], chunks: list[int]) -> bool:
        """The pool is short: compress one decoding sequence, the longest that frees blocks.

        A sequence already in this step's batch may be chosen when it decodes one token: its
        compacted table then gets that token's slot again (the compaction freed more than a
        block); should it not, it is preempted and leaves the batch.
        """
        if self.token_eviction is None:
            return False
        in_batch = dict(zip((s.seq_id for s in batch), chunks, strict=True))
        prefilling = {sid for sid, n in in_batch.items() if n != 1}
        if not self._pressure(self._decoding(prefilling), force=True):
            return False
        for member in [s for s in batch if s.seq_id in in_batch and in_batch[s.seq_id] == 1]:
            if member.cache_len + 1 <= len(member.block_table) * self.cache.block_size:
                continue
            if self.cache.reserve_tokens(member.seq_id, member.cache_len + 1) is not None:
                member.block_table = self.cache.block_table(member.seq_id)
                continue
            index = batch.index(member)
            batch.pop(index)
            chunks.pop(index)
            self._preempt(member)
        return True

    def _compress_after_step(self) -> None:
        """Prompts that asked for ``kv_compression`` and just finished prefill are compressed;
        then memory pressure compresses the longest decoding sequences (the spec's
        ``maybe_evict`` after each generation step)."""
        for seq in self.running:
            request = seq.kv_compression
            if request is None or seq.prompt_compressed or seq.num_computed < len(seq.prompt_ids):
                continue
            seq.prompt_compressed = True
            if request.ratio <= 0:
                continue
            kv = self._sequence_kv(seq, for_room=False)
            t = time.perf_counter()
            try:
                self._manager().compress(
                    seq.seq_id,
                    kv,
                    kept_for_ratio(kv.length, request.ratio),
                    policy=self._named_policy(request.policy),
                    reason="prefill",
                )
            except CompactionRefused as exc:
                log.warning("kv_compression skipped", request_id=seq.request_id, reason=str(exc))
            seq.block_table, seq.evicted_tokens = kv.block_table, kv.position_offset
            self.cache_s += time.perf_counter() - t
        if self.token_eviction is not None:
            self._pressure(self._decoding(set()), force=False)

    def _advance(
        self, seqs: list[Sequence], chunks: list[int], logits: torch.Tensor, stats: StepStats
    ) -> int:
        """Account the computed tokens, sample where a sequence reached its end, emit, release."""
        sampling_rows: list[int] = []
        for row, (seq, n) in enumerate(zip(seqs, chunks, strict=True)):
            decoding = seq.num_computed >= len(seq.prompt_ids) and n == 1 and seq.output_ids
            if decoding:
                stats.decode_tokens += n
            else:
                stats.prefill_tokens += n
            block_size = self.cache.block_size
            filled = (seq.num_computed + n) // block_size > seq.num_computed // block_size
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                sampling_rows.append(row)
            if filled:  # a block became full: cache it now so concurrent requests can share it
                t = time.perf_counter()
                self.cache.commit_blocks(seq.seq_id, seq.all_ids, num_computed_tokens=seq.num_computed)
                self.cache_s += time.perf_counter() - t
        if not sampling_rows:
            return 0
        sampled_seqs = [seqs[r] for r in sampling_rows]
        tokens = sample_batch(
            logits[sampling_rows],
            [s.sampling for s in sampled_seqs],
            [s.generator for s in sampled_seqs],
        )
        now = self.clock()
        finished = 0
        for seq, token in zip(sampled_seqs, tokens, strict=True):
            t = time.perf_counter()
            self.cache.touch_sequence(seq.seq_id)
            self.cache_s += time.perf_counter() - t
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.token_times.append(now)
            seq.output_ids.append(token)
            reason = self._append_text(seq, token)
            if reason is not None:
                self._release(seq)
                self.running.remove(seq)
                self._finish(seq, reason, None)
                finished += 1
            else:
                self._emit_delta(seq)
        return finished

    def _append_text(self, seq: Sequence, token: int) -> str | None:
        """Add the token's text; the finish reason when the sequence is done."""
        is_eos = token in self.eos_ids and not seq.sampling.ignore_eos
        if not is_eos:
            seq.text += seq.detokenizer.push(token)
        stops = seq.sampling.stop
        if stops:
            # Only the tail can hold a stop string that the last token completed.
            window = max(len(s) for s in stops) + 16
            start = max(0, len(seq.text) - window - len(self.tokenizer.decode([token])))
            for stop in stops:
                pos = seq.text.find(stop, max(0, start - len(stop)))
                if pos != -1:
                    seq.text = seq.text[:pos]
                    return "stop"
        if is_eos:
            seq.text += seq.detokenizer.flush()
            return "stop"
        if len(seq.output_ids) >= seq.sampling.max_tokens:
            seq.text += seq.detokenizer.flush()
            return "length"
        return None

    def _emit_delta(self, seq: Sequence) -> None:
        # Hold back text that could still become the start of a stop string.
        hold = max((len(s) for s in seq.sampling.stop), default=1) - 1
        upto = max(seq.emitted_chars, len(seq.text) - hold)
        delta = seq.text[seq.emitted_chars : upto]
        seq.emitted_chars = upto
        new_tokens = seq.output_ids[seq.emitted_tokens :]
        seq.emitted_tokens = len(seq.output_ids)
        seq.emit(
            RequestOutput(
                request_id=seq.request_id,
                text=delta,
                token_ids=new_tokens,
                finished=False,
                prompt_tokens=len(seq.prompt_ids),
                cached_tokens=seq.cached_tokens or 0,
                completion_tokens=len(seq.output_ids),
            )
        )

    def _finish(self, seq: Sequence, reason: str, error: str | None) -> None:
        if self.cache.max_protected > 0:
            self.cache.release_queued(seq.seq_id)  # it may leave from the queue
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        self.finished_count += 1
        if self.on_finished is not None:
            self.on_finished(seq)
        delta = seq.text[seq.emitted_chars :]
        seq.emitted_chars = len(seq.text)
        # the token that ended it (stop, length) was sampled but not yet handed out
        new_tokens = seq.output_ids[seq.emitted_tokens :]
        seq.emitted_tokens = len(seq.output_ids)
        seq.emit(
            RequestOutput(
                request_id=seq.request_id,
                text=delta,
                token_ids=new_tokens,
                finished=True,
                finish_reason=reason,
                error=error,
                prompt_tokens=len(seq.prompt_ids),
                cached_tokens=seq.cached_tokens or 0,
                completion_tokens=len(seq.output_ids),
            )
        )
