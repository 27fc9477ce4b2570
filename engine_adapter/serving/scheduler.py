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
   `max_num_batched_tokens` budget), one token for each decoding sequence, and the step's
   embedding chunks (`engine_adapter.serving.embedding_scheduler`);
5. samples (after OpenAI's penalties, `engine_adapter.model.penalties`), detokenizes, checks stop
   conditions (`engine_adapter.serving.outputs`), caches newly full blocks so that concurrent
   requests share them, and releases finished sequences (their full blocks stay cached).

A preempted sequence recomputes prompt and output together; with greedy sampling it produces
exactly the tokens it would have produced without preemption.

Its owner (the engine) is told of each request's admission and end, and asked the decisions
that are not the scheduler's own (lifetime, deadline, quotas, victims), through the
`SchedulerHooks` given at construction (`engine_adapter.serving.hooks`). Token-level eviction
(`engine_adapter.serving.compression`) runs when the engine has a token policy or a request
asks for ``kv_compression``: after each step, and before any preemption when a decode slot
cannot be reserved.

Not thread-safe: the engine calls `step` with the cache manager's lock held. Imports: the cache
core, the model, token-level eviction, this package's records, hooks, outputs, compression,
embedding scheduling and prefetch; never the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
import torch

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.records import Allocation
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tier_moves import TierMove
from engine_adapter.model.decoder import AttentionObserver, Decoder, ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.penalties import apply_penalties
from engine_adapter.model.sampling import make_generator, sample_batch
from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.serving.compression import SequenceCompressor
from engine_adapter.serving.embedding_batch import EmbeddingText
from engine_adapter.serving.embedding_scheduler import EmbeddingScheduler
from engine_adapter.serving.hooks import NoHooks, SchedulerHooks
from engine_adapter.serving.outputs import append_text, emit_delta, emit_final
from engine_adapter.serving.prefetch import QueuePrefetch
from engine_adapter.serving.sequence import SchedulerLimits, Sequence, SequenceStatus, StepStats
from engine_adapter.token_eviction.pressure import TokenCacheManager
from sage_eviction.preemption import resolve_order

__all__ = ["Scheduler"]

log = structlog.get_logger("sage.scheduler")


def _cache_request(
    seq: Sequence, *, estimated_lifetime: float | None = None, deadline: float | None = None
) -> CacheRequest:
    """What `seq` brings to the cache manager now: its tokens so far (a re-prefill after
    preemption includes its output), isolation key, policy metadata (`estimated_lifetime`, its
    predicted remaining life in seconds; `deadline`, when its blocks should be done by, for the
    `slo` policy), prompt-cache contract and the receipt the cache fills (its usage)."""
    return CacheRequest(
        seq.seq_id, seq.all_ids,
        cache_salt=seq.cache_salt,
        tenant=seq.tenant,
        priority=seq.priority,
        max_tokens=len(seq.prompt_ids) + seq.sampling.max_tokens,
        deadline=deadline,
        estimated_lifetime=estimated_lifetime,
        # A prompt compressed after prefill is scored by all its queries, as kvpress does.
        match_prefix=seq.kv_compression is None,
        request_id=seq.request_id,
        contract=seq.cache_contract,
        receipt=seq.cache_receipt,
        text_marks=seq.text_marks,
    )


class Scheduler:
    """Continuous batching with chunked prefill, priority admission and preemption by recompute.

    Args:
        cache: The cache manager (its pool is the model's KV pool).
        decoder: The model.
        pool: The paged KV pool the decoder reads and writes.
        tokenizer: For detokenizing and the eos ids.
        limits: Batch and queue limits.
        clock: Monotonic time source.
        hooks: What the scheduler tells its owner and asks it (`SchedulerHooks`); `NoHooks`
            when None.
        token_eviction: Token-level eviction (--token-eviction); None: only a request's
            ``kv_compression`` compresses.
        adaptive: --adaptive-batch: the running limit follows the re-prefill rate; None: it
            is ``max_num_seqs``.
        prefetch: --prefetch: with tiers, each step loads the head of the queue's host/disk
            prefixes into spare room, locking nothing (`engine_adapter.serving.prefetch`).
    """

    def __init__(
        self,
        cache: CacheManager,
        decoder: Decoder,
        pool: PagedKVPool,
        tokenizer: Tokenizer,
        limits: SchedulerLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        hooks: SchedulerHooks | None = None,
        token_eviction: TokenCacheManager | None = None,
        adaptive: AdaptiveBatch | None = None,
        tier_copier: Callable[[list[TierMove]], list[TierMove]] | None = None,
        prefetch: bool = False,
    ) -> None:
        self.cache = cache
        self.decoder = decoder
        self.pool = pool
        self.tokenizer = tokenizer
        self.limits = limits or SchedulerLimits()
        cache.preemption_order = resolve_order(self.limits.preemption_order)  # the scheduler's to choose
        self.clock = clock
        self.hooks: SchedulerHooks = hooks if hooks is not None else NoHooks()
        self.token_eviction = token_eviction
        self.adaptive = adaptive
        # Copies the cache core's tier moves (engine_adapter.model.tier_copy); returns the failed.
        self.tier_copier = tier_copier
        # --prefetch: queued requests' host/disk prefixes loaded into spare room (never locked).
        self.prefetch = QueuePrefetch(cache, _cache_request) if prefetch and tier_copier is not None else None
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._next_seq_id = 0
        self.finished_count = 0
        self.total_preemptions = 0
        self.preempted_in_step = 0
        self.cache_s = 0.0  # time in the cache manager during the current step
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.compression = SequenceCompressor(cache, pool, token_eviction, getattr(decoder, "rotary", None))
        self.embeddings = EmbeddingScheduler(cache, self.limits.embedding_chunk_tokens, clock, self.hooks)

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

    def end(self, seq: Sequence, reason: str, message: str) -> None:
        """End a sequence that the scheduler does not hold (colocation deferred it, or took it
        off the queue to reject it): its caller gets the final output with `reason`."""
        self._finish(seq, reason, message)

    def preempt_request(self, request_id: str) -> bool:
        """Preempt a running request by recompute (colocation's ADMIT_WITH_PREEMPTION)."""
        for seq in self.running:
            if seq.request_id == request_id:
                self._preempt(seq)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.embeddings.queue)

    # ---- the step ------------------------------------------------------------------------

    def step(self) -> StepStats:
        """One iteration: admit, reserve (preempting when short), forward, sample, release."""
        stats = StepStats()
        self.cache_s = self.compression.cache_s = self.embeddings.cache_s = 0.0
        t0 = time.perf_counter()
        self._expire_waiting()
        stats.admitted = self._admit()
        batch_seqs, chunks, stats.preempted = self._schedule()
        if self.prefetch is not None and self.waiting:
            t = time.perf_counter()
            stats.prefetched = self.prefetch.step(self.waiting, self.running)
            self.cache_s += time.perf_counter() - t
        # Admission's and prefetch's promotions and the reservations' demotions, before the forward
        # reads the promoted blocks and overwrites the demoted ones (a failed promotion moves its
        # sequence's computed prefix back: the chunk starts earlier, the forward reads num_computed).
        self._run_tier_moves(stats)
        # a step decodes when an LLM row computes one token; prefill chunks are no TPOT to protect
        decoding = any(n == 1 for n in chunks)
        emb_texts, emb_chunks = self.embeddings.schedule(decoding)
        t1 = time.perf_counter()
        if batch_seqs or emb_texts:
            out = self.decoder(self._forward_batch(batch_seqs, chunks, emb_texts, emb_chunks), self.pool)
            t2 = time.perf_counter()
            stats.forward_s = t2 - t1
            self.embeddings.learn_step_cost(stats.forward_s, decoding, sum(emb_chunks))
            if emb_texts:
                assert out.hidden_sums is not None
                stats.embedding_tokens = self.embeddings.advance(
                    emb_texts, emb_chunks, out.hidden_sums[len(batch_seqs) :]
                )
            if batch_seqs:
                stats.finished = self._advance(batch_seqs, chunks, out.logits[: len(batch_seqs)], stats)
                self.compression.after_step(self.running)
            t3 = time.perf_counter()
            stats.bookkeeping_s = (t1 - t0) + (t3 - t2)
        else:
            stats.bookkeeping_s = t1 - t0
        stats.cache_s = self.cache_s + self.compression.cache_s + self.embeddings.cache_s
        self._adapt_batch_limit()
        return stats

    def _run_tier_moves(self, stats: StepStats) -> None:
        """Copy the blocks the cache core moved between the pool and its host/disk tiers, in its
        order (engine_adapter.cache.tier_moves); a failed copy is a miss: each sequence whose
        cached prefix it cut recomputes from the cut. Compress-on-evict's compactions run first."""
        self.compression.run_prefix_moves()
        if self.tier_copier is None:
            return
        t = time.perf_counter()
        moves = self.cache.take_moves()
        failed = self.tier_copier(moves) if moves else []
        kept = self.cache.moves_failed(failed) if failed else {}
        for seq in self.running:
            if seq.seq_id in kept:
                seq.num_computed = min(seq.num_computed, kept[seq.seq_id] * self.cache.block_size)
                seq.block_table = self.cache.block_table(seq.seq_id)
        stats.tier_moves += len(moves)
        stats.tier_failed += len(failed)
        stats.tier_copy_s += time.perf_counter() - t

    def _forward_batch(
        self, seqs: list[Sequence], chunks: list[int], texts: list[EmbeddingText], text_chunks: list[int]
    ) -> ForwardBatch:
        """The step's one forward: each sequence's chunk, then the embedding chunks."""
        observers: list[AttentionObserver | None] = [seq.observer for seq in seqs]
        offsets = [seq.evicted_tokens for seq in seqs]
        key_masks = [seq.key_mask for seq in seqs]
        token_ids = [
            seq.all_ids[seq.num_computed : seq.num_computed + n] for seq, n in zip(seqs, chunks, strict=True)
        ]
        starts = [seq.cache_len for seq in seqs]
        tables = [seq.block_table for seq in seqs]
        # Embedding chunks ride in the same forward, after the LLM's rows.
        for text, n in zip(texts, text_chunks, strict=True):
            token_ids.append(text.ids[text.done_tokens : text.done_tokens + n])
            starts.append(text.done_tokens)
            tables.append(text.block_table)
            offsets.append(0)
            observers.append(None)
            key_masks.append(None)
        return ForwardBatch(
            token_ids=token_ids,
            start_positions=starts,
            block_tables=tables,
            position_offsets=offsets if any(offsets) else None,
            observers=observers if any(o is not None for o in observers) else None,
            pool_hidden=[False] * len(seqs) + [True] * len(texts) if texts else None,
            key_masks=key_masks if any(m is not None for m in key_masks) else None,
        )

    def _adapt_batch_limit(self) -> None:
        """--adaptive-batch: let the running limit follow the re-prefill rate; log each change."""
        if self.adaptive is None:
            return
        change = self.adaptive.observe(self.cache.total_evictions, self.cache.re_prefill_blocks)
        if change is not None:
            log.info("batch limit changed", **change.to_dict())
            self.hooks.on_batch_change(change)

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

    # ---- admission -----------------------------------------------------------------------

    def _admit(self) -> int:
        if not self.waiting:
            return 0
        self.waiting.sort(key=lambda s: (-s.priority, s.arrival))
        admitted = 0
        limit = self.adaptive.current if self.adaptive is not None else self.limits.max_num_seqs
        while self.waiting and len(self.running) < limit:
            seq = self.waiting[0]
            if not self.hooks.admits_llm(seq, self.running):
                break  # over the LLM quota: wait for running sequences to finish
            t = time.perf_counter()
            try:
                alloc = self._allocate(seq)
            except NoEvictableBlocksError:
                self.cache_s += time.perf_counter() - t
                break  # wait for running sequences to finish; keep priority order
            except Exception as exc:
                self.cache_s += time.perf_counter() - t
                self.waiting.pop(0)
                self._refuse(seq, exc)
                continue
            self.cache_s += time.perf_counter() - t
            self.waiting.pop(0)
            self._start_running(seq, alloc)
            admitted += 1
        return admitted

    def _allocate(self, seq: Sequence) -> Allocation:
        """The cache manager's admission of `seq`: its cached prefix locked, blocks for the rest."""
        return self.cache.allocate(
            _cache_request(
                seq,
                estimated_lifetime=self.hooks.estimate_lifetime(seq),
                deadline=self.hooks.deadline_for(seq),
            )
        )

    def _refuse(self, seq: Sequence, exc: Exception) -> None:
        """`seq`'s allocation failed for a reason of its own: it leaves with the error."""
        if isinstance(exc, RequestTooLargeError):
            self._finish(seq, "error", str(exc))
            return
        # Any other failure is this request's alone: it leaves the queue with the error, so
        # that it cannot fail every later step, and the rest are admitted as usual.
        log.error("admission failed", request_id=seq.request_id, exc_info=exc)
        self._finish(seq, "error", f"{type(exc).__name__}: {exc}")

    def _start_running(self, seq: Sequence, alloc: Allocation) -> None:
        seq.block_table = alloc.block_table
        seq.num_computed = alloc.num_cached_tokens
        self.compression.adopt_hit(seq, alloc)
        if seq.cached_tokens is None:
            seq.cached_tokens = min(alloc.num_cached_tokens, len(seq.prompt_ids))
        seq.status = SequenceStatus.RUNNING
        seq.observer = self.compression.observer_for(seq)
        self.running.append(seq)
        self.hooks.on_admitted(seq, alloc.num_cached_tokens)

    # ---- reservation and preemption --------------------------------------------------------

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
        preempt others (or `seq`) when the pool, or the LLM quota, is short."""
        block_size = self.cache.block_size
        if seq.cache_len + n_new <= len(seq.block_table) * block_size:
            return True
        while True:
            num_tokens = seq.cache_len + n_new  # `seq` itself may have been compressed
            new_blocks = -(-num_tokens // block_size) - len(seq.block_table)
            if new_blocks <= 0:
                return True
            if not self.hooks.admits_llm_growth(seq, new_blocks, self.running):
                # The LLM class is charged for decode growth too: past its quota, some running
                # sequence gives way, as when the pool is short.
                if self._compress_instead_of_preempting(batch, chunks):
                    continue
                if not self._give_way(seq, batch, quota=True):
                    return False
                continue
            t = time.perf_counter()
            try:
                new_ids = self.cache.reserve_tokens(seq.seq_id, num_tokens)
            except RequestTooLargeError as exc:
                # Only with a token policy can a sequence outgrow the whole pool (the engine
                # admits it when its prompt fits): it shrinks itself, or ends with the error.
                self.cache_s += time.perf_counter() - t
                if self.compression.shrink(seq):
                    continue
                self._end_running(seq, str(exc))
                return False
            if new_ids is not None:
                seq.block_table = self.cache.block_table(seq.seq_id)
                self.cache_s += time.perf_counter() - t
                return True
            self.cache_s += time.perf_counter() - t
            if self._compress_instead_of_preempting(batch, chunks):
                continue
            if not self._give_way(seq, batch):
                return False

    def _give_way(self, seq: Sequence, batch: list[Sequence], *, quota: bool = False) -> bool:
        """Preempt a running sequence so that `seq` can grow; True when one other than `seq`
        gave way. Else `seq` itself is preempted, or, over a hard LLM partition (`quota`) with
        nothing else running, it ends with an error: it could never be re-admitted."""
        victim = self._choose_victim(seq, batch)
        if victim is not None:
            self._preempt(victim)
            return True
        if quota and len(self.running) == 1:
            self._end_running(seq, f"sequence {seq.request_id} outgrew the LLM quota running alone")
        else:
            self._preempt(seq)  # nothing else can give way
        return False

    def _end_running(self, seq: Sequence, error: str) -> None:
        self._release(seq)
        self.running.remove(seq)
        self._finish(seq, "error", error)

    def _choose_victim(self, seq: Sequence, batch: list[Sequence]) -> Sequence | None:
        """The running sequence to preempt so that `seq` gets its slot: the hooks' choice, else
        the eviction policy's; never `seq` or one already in this step's batch."""
        t = time.perf_counter()
        skip = {s.seq_id for s in batch}
        skip.add(seq.seq_id)
        victim: Sequence | None
        chosen = self.hooks.choose_victims(self.running, skip, 1)
        if chosen is not None:
            victim = chosen[0] if chosen else None
        else:
            victim_ids = self.cache.select_preemption_victims(1, exclude=skip)
            by_id = {s.seq_id: s for s in self.running}
            victim = by_id.get(victim_ids[0]) if victim_ids else None
        self.cache_s += time.perf_counter() - t
        return victim

    def _compress_instead_of_preempting(self, batch: list[Sequence], chunks: list[int]) -> bool:
        """The pool is short: compress one decoding sequence, the longest that frees blocks.

        A sequence already in this step's batch may be chosen when it decodes one token: its
        compacted table then gets that token's slot again (the compaction freed more than a
        block); should it not, it is preempted and leaves the batch.
        """
        if not self.compression.enabled:
            return False
        in_batch = dict(zip((s.seq_id for s in batch), chunks, strict=True))
        prefilling = {sid for sid, n in in_batch.items() if n != 1}
        if not self.compression.relieve(self.running, prefilling):
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
        self.compression.reset(seq)
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
        self.compression.forget(seq.seq_id)

    # ---- after the forward -----------------------------------------------------------------

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
        params = [s.sampling for s in sampled_seqs]
        rows = apply_penalties(logits[sampling_rows], params, [s.output_ids for s in sampled_seqs])
        tokens = sample_batch(rows, params, [s.generator for s in sampled_seqs])
        return self._take_tokens(sampled_seqs, tokens)

    def _take_tokens(self, seqs: list[Sequence], tokens: list[int]) -> int:
        """Append each sampled token; emit a delta, or finish and release the sequence."""
        now = self.clock()
        finished = 0
        for seq, token in zip(seqs, tokens, strict=True):
            t = time.perf_counter()
            self.cache.touch_sequence(seq.seq_id)
            self.cache_s += time.perf_counter() - t
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.token_times.append(now)
            seq.output_ids.append(token)
            reason = append_text(seq, token, self.eos_ids, self.tokenizer)
            if reason is not None:
                self._release(seq)
                self.running.remove(seq)
                self._finish(seq, reason, None)
                finished += 1
            else:
                emit_delta(seq)
        return finished

    def _finish(self, seq: Sequence, reason: str, error: str | None) -> None:
        if self.cache.max_protected > 0:
            self.cache.release_queued(seq.seq_id)  # it may leave from the queue
        if self.prefetch is not None:
            self.prefetch.cancel(seq)  # likewise
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.error = error
        self.finished_count += 1
        self.hooks.on_finished(seq)
        emit_final(seq)
