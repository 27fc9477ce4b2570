"""The engine: model, paged KV pool, cache manager and scheduler behind one thread-safe facade.

The engine loop runs on the engine thread (`engine_thread.EngineThread`, the one thread that
runs torch: the model is loaded and warmed up there too) and calls `Scheduler.step()` with the
cache manager's lock held; a hot swap (`set_policy`) takes the same lock on its caller's thread
(it calls no torch), so it lands between two steps: no step sees half a swap, and no cached
block or request is lost. The loop hands the lock to such a waiter after the step it is in
(`cache.handoff_lock`), so a swap under load waits one step, not until the batch drains. The
server is the only caller (docs/architecture.md, "Layers"); tests drive the facade directly too.

    engine = Engine(EngineConfig(num_blocks=256, device="cpu"))
    engine.start()
    out = engine.submit("Hello", SamplingParams(max_tokens=8)).result()
    engine.shutdown()

Here: the parts' assembly, the loop and its inbox, submission, and colocation's admission in
the loop. Elsewhere: the control plane's queries (`control.EngineControl`, the base class), the
checks a request passes on submission (`intake`), the scheduler's hooks (`engine_hooks`), the
builders of the parts (`engine_parts`), the handles (`handles`) and the errors (`errors`).

Imports: the whole serving package below it, the model, the cache core, the colocation
controller and the policy library.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

import structlog

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.cache.contract import CacheContract
from engine_adapter.cache.errors import SageCacheError
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.colocation import Decision
from engine_adapter.model.chat_template import ChatMessage
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.model.tier_copy import execute_moves
from engine_adapter.model.tokenizer import IncrementalDetokenizer
from engine_adapter.serving.cache_histograms import CacheAccountingCollector
from engine_adapter.serving.colocation import Deferred, EngineColocation
from engine_adapter.serving.config import EngineConfig, colocation_switches
from engine_adapter.serving.control import EngineControl, LoopStats
from engine_adapter.serving.embedding_batch import EmbeddingHandle, EmbeddingJob, EmbeddingResult
from engine_adapter.serving.engine_hooks import EngineHooks
from engine_adapter.serving.engine_parts import cache_manager, colocation_gates, load_parts, token_manager
from engine_adapter.serving.engine_thread import EngineThread
from engine_adapter.serving.errors import AdmissionRejected, EngineClosedError
from engine_adapter.serving.handles import RequestHandle
from engine_adapter.serving.intake import RequestIntake, TokenisedPrompt
from engine_adapter.serving.kv_events import start_kv_events
from engine_adapter.serving.metrics import EngineMetrics
from engine_adapter.serving.scheduler import Scheduler
from engine_adapter.serving.sequence import SchedulerLimits, Sequence
from engine_adapter.token_eviction import KVCompression
from sage_eviction import get_policy_class

__all__ = ["Engine"]

log = structlog.get_logger("sage.engine")


class Engine(EngineControl):
    """An LLM engine with a paged prefix cache whose eviction policy can be swapped while it serves.

    Args:
        config: The engine's configuration.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.name = config.name
        get_policy_class(config.eviction_policy, online=True)  # before the model loads
        self._wake = threading.Event()
        # The one thread that runs torch: the model loads and warms up there, the loop runs
        # there, and control requests that need the model or the pool are answered there
        # (engine_thread; docs/architecture.md, "Threads").
        self.engine_thread = EngineThread(f"sage-engine-{self.name}", wake=self._wake.set)
        parts = self.engine_thread.call(load_parts, config)
        self.thread_settings = parts.threads
        self.decoder, self.tokenizer, self.model_config = parts.decoder, parts.tokenizer, parts.model_config
        self.pool = parts.pool
        self.tiers = parts.tiers
        self.events = EvictionEventLog(
            config.eviction_log_path if config.log_evictions else None, ring_size=10_000
        )
        self.cache = cache_manager(config, self.pool, self.events, self.tiers)
        self.metrics = EngineMetrics(policy=self.cache.policy_name)
        self.metrics.registry.register(CacheAccountingCollector(self.cache.stats))
        self.events.subscribe(self._on_event)
        self.kv_events = start_kv_events(config, self.events)
        self.token_manager = token_manager(config, self.cache, self.pool, self.events)
        # The scheduler's hooks exist before it (colocation's gates need only the controller and
        # the cache manager), so it gets them at construction.
        self.hooks = EngineHooks(
            self.metrics,
            colocation=colocation_gates(config, self.cache, time.monotonic),
            lifetime_prediction=config.enable_lifetime_prediction,
        )
        self.scheduler = self._scheduler(config)
        self.metrics.set_batch_limit(config.max_num_seqs)
        self.colocation = self._colocation(config)
        partition = self.hooks.colocation.partition if self.hooks.colocation is not None else None
        self.intake = RequestIntake(
            config, self.tokenizer, self.model_config, self.cache, self.token_manager, partition
        )
        self.started_at = time.time()
        self.draining = False
        self.stopped = False
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._loop_done: Future[None] | None = None
        self._ids = itertools.count(1)
        self.loop = LoopStats()

    def _scheduler(self, config: EngineConfig) -> Scheduler:
        """The scheduler with the engine's hooks (metrics, lifetime prediction, colocation's
        gates), token-level eviction and adaptive batching, all given at construction."""
        limits = SchedulerLimits(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_queued_requests=config.max_queued_requests,
            queued_timeout=config.queued_timeout,
            embedding_chunk_tokens=config.embedding_chunk_tokens,
            preemption_order=config.preemption_order,
        )
        return Scheduler(
            self.cache,
            self.decoder,
            self.pool,
            self.tokenizer,
            limits,
            time.monotonic,
            hooks=self.hooks,
            token_eviction=self.token_manager,
            adaptive=AdaptiveBatch(config.max_num_seqs) if config.adaptive_batch else None,
            tier_copier=self._tier_copier(),
            prefetch=config.prefetch,
        )

    def _tier_copier(self) -> Callable[[list[TierMove]], list[TierMove]] | None:
        """What runs the cache core's tier moves on the pool, host pool and disk store (on the
        engine thread, in the step); None without tiers."""
        if self.tiers.host is None:
            return None
        return functools.partial(
            execute_moves,
            device_pool=self.pool,
            host_pool=self.tiers.host,
            disk_store=self.tiers.disk,
            on_load=self._tier_loaded,
        )

    def _tier_loaded(self, tier: Tier, seconds: float) -> None:
        """A batch of blocks came back from `tier` in `seconds`: the tier's load time p50/p99 in
        the stats and its histogram in /metrics."""
        self.cache.record_tier_load(tier, seconds)
        self.metrics.on_tier_load(tier.value, seconds)

    def _colocation(self, config: EngineConfig) -> EngineColocation | None:
        """Spec 004's admission and quotas in the loop, over the scheduler; None when off."""
        gates = self.hooks.colocation
        if gates is None:
            return None
        admission = colocation_switches(config.colocation_params)["admission"]
        colocation = EngineColocation(gates, self.scheduler, admission=admission)
        quota = gates.controller.quota
        self.metrics.set_quota(quota.llm_blocks, quota.embedding_blocks)
        return colocation

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine loop on the engine thread."""
        if self._loop_done is not None:
            return
        self._loop_done = self.engine_thread.submit(self._loop)

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; finish (drain) or abort the ones in flight; flush the log."""
        self.draining = True
        if not drain:
            self._inbox.put(("abort_all", None))
        self._inbox.put(("stop", None))
        self._wake.set()
        if self._loop_done is not None:
            wait([self._loop_done], timeout)
        self.stopped = True
        if self.kv_events is not None:
            self.kv_events.close()
        self.events.close()
        if self.cache.accounting.lookup_log is not None:
            self.cache.accounting.lookup_log.close()

    def _loop(self) -> None:
        stopping = False
        while True:
            with self.cache.lock:
                stopping = self._drain_inbox() or stopping
                self.engine_thread.run_pending()  # the control requests queued meanwhile
                if self.colocation is not None:
                    self._colocation_tick()
                stepped = self.scheduler.has_work()
                if stepped:
                    self._step()
                elif stopping and not (self.colocation is not None and self.colocation.deferred):
                    return
            if stepped:
                # A control request (a swap, a stats read) that waits for the lock takes it now,
                # between two steps, rather than when the batch drains.
                if self.cache.lock.waiting:
                    self.cache.lock.yield_to_waiters()
                continue
            self._wake.wait(0.05)
            self._wake.clear()

    def _step(self) -> None:
        """One scheduler step and its accounting; a failed step fails the running requests."""
        try:
            stats = self.scheduler.step()
        except Exception as exc:  # keep serving: fail the running requests, not the engine
            self.loop.error = f"{type(exc).__name__}: {exc}"
            # The traceback and the requests it ended go to the engine's log, so the cause
            # survives the one-line error the clients get.
            log.error(
                "engine step failed",
                request_ids=[seq.request_id for seq in self.scheduler.running],
                exc_info=exc,
            )
            self._fail_running(self.loop.error)
            return
        self.loop.steps += 1
        self.loop.forward_s += stats.forward_s
        self.loop.bookkeeping_s += stats.bookkeeping_s
        self.loop.tier_moves += stats.tier_moves
        self.loop.tier_failed_moves += stats.tier_failed
        self.loop.tier_copy_s += stats.tier_copy_s
        if stats.tier_moves:
            self.metrics.on_tier_copies(stats.tier_copy_s, stats.tier_failed)
        if stats.preempted:
            self.metrics.on_preemption(stats.preempted)
        if self.cache.eviction_threshold is not None:
            self.cache.evict_to_threshold()
        self._refresh_gauges()

    def _drain_inbox(self) -> bool:
        stop = False
        while True:
            try:
                op, arg = self._inbox.get_nowait()
            except queue.Empty:
                return stop
            if op == "add":
                self.scheduler.add(arg)
            elif op == "embed":
                self.scheduler.embeddings.add(arg)
            elif op == "admitted":  # colocation admitted it on arrival (with preemptions, maybe)
                self._enqueue_admitted(*arg)
            elif op == "defer":
                assert self.colocation is not None
                self.colocation.deferred.append(arg)
            elif op == "abort":
                if not self.scheduler.abort(arg) and self.colocation is not None:
                    self._abort_deferred(arg)
            elif op == "abort_all":
                self._abort_all()
            elif op == "stop":
                stop = True

    def _abort_all(self) -> None:
        """A shutdown without draining: every request ends, with "engine shut down"."""
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.scheduler.abort(seq.request_id, "abort", "engine shut down")
        for job in list(self.scheduler.embeddings.queue):
            self.scheduler.embeddings.abort(job.request_id, "engine shut down", 503)
        if self.colocation is not None:
            for deferred in list(self.colocation.deferred):
                self.colocation.deferred.remove(deferred)
                self._reject(deferred.item, "engine shut down", 503)

    def _fail_running(self, message: str) -> None:
        for seq in list(self.scheduler.running):
            try:
                self.scheduler.abort(seq.request_id, "error", message)
            except SageCacheError:
                self.scheduler.running.remove(seq)
        self.scheduler.embeddings.fail_started(message)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "freed":
            self.metrics.on_eviction(
                str(event["policy"]),
                str(event["reason"]),
                int(event["blocks_freed"]),
                float(event["duration_us"]) / 1e6,
            )
        elif event.get("event") == "compress" and event.get("fallback"):
            self.metrics.on_attention_fallback(str(event["policy"]))

    # ---- colocation (engine_adapter.serving.colocation) --------------------------------------

    def _enqueue_admitted(self, item: Sequence | EmbeddingJob, preempt: tuple[str, ...]) -> None:
        for request_id in preempt:
            if self.scheduler.preempt_request(request_id):
                self.metrics.on_preemption(1)
        if isinstance(item, EmbeddingJob):
            self.scheduler.embeddings.add(item)
        else:
            self.scheduler.add(item, keep_arrival=True)

    def _reject(self, item: Sequence | EmbeddingJob, reason: str, status: int = 429) -> None:
        """End a request colocation did not admit: 429 (its reason), or 503 when shutting down."""
        if isinstance(item, EmbeddingJob):
            now = self.scheduler.clock()
            result = EmbeddingResult(
                item.request_id,
                [],
                item.num_tokens,
                error=reason,
                status=status,
                latency_s=now - item.arrival,
            )
            self.hooks.on_embedding_finished(item, result)
            item.finish(result)
        else:
            self.scheduler.end(item, "rejected" if status == 429 else "abort", reason)

    def _abort_deferred(self, request_id: str) -> None:
        """A deferred request whose client went away leaves the deferred list at once."""
        assert self.colocation is not None
        for deferred in list(self.colocation.deferred):
            item = deferred.item
            if isinstance(item, Sequence) and item.request_id == request_id:
                self.colocation.deferred.remove(deferred)
                self.scheduler.end(item, "abort", "aborted by the client")

    def _colocation_tick(self) -> None:
        """Each loop: recompute the quotas (each interval), shed queued work that can no longer
        meet its SLO (sage), and ask again for every deferred request: admitted, or rejected once
        its slack has run out (or the controller says so)."""
        colocation = self.colocation
        assert colocation is not None
        now = self.scheduler.clock()
        quota = colocation.update_quota(now)
        self.metrics.set_quota(quota.llm_blocks, quota.embedding_blocks)
        for item, reason in colocation.missed(now):  # sage: shed queued work past its deadline
            kind = "embedding" if isinstance(item, EmbeddingJob) else "llm"
            colocation.decisions[f"{kind}:dropped"] = colocation.decisions.get(f"{kind}:dropped", 0) + 1
            if isinstance(item, EmbeddingJob):
                self.scheduler.embeddings.queue.remove(item)
            else:
                self.scheduler.waiting.remove(item)
            self._reject(item, reason)
        for deferred in list(colocation.deferred):
            self._ask_again(deferred, now)

    def _ask_again(self, deferred: Deferred, now: float) -> None:
        """A deferred request's admission, asked again: admitted, still deferred within its
        slack, or rejected."""
        colocation = self.colocation
        assert colocation is not None
        item = deferred.item
        is_embedding = isinstance(item, EmbeddingJob)
        admission = (
            colocation.admit_embedding(item, now, count=False)
            if isinstance(item, EmbeddingJob)
            else colocation.admit_llm(item, now, count=False)
        )
        kind = "embedding" if is_embedding else "llm"
        if admission.decision is Decision.DEFER and now < deferred.until:
            return
        colocation.deferred.remove(deferred)
        colocation.count(kind, admission)
        self.metrics.on_admission(kind, admission.decision.value)
        if admission.decision in (Decision.ADMIT, Decision.ADMIT_WITH_PREEMPTION):
            self._enqueue_admitted(item, admission.preempt)
        else:
            reason = admission.reason
            if admission.decision is Decision.DEFER:
                reason = f"deferred until its slack ran out: {reason}"
            self._reject(item, reason)

    def _admit_on_arrival(self, kind: str, item: Sequence | EmbeddingJob) -> None:
        """Colocation's admission of a new request, in the caller's thread under the lock, so
        that a rejection is the caller's 429 before anything is queued.

        Raises:
            AdmissionRejected: REJECT, with the controller's reason.
        """
        colocation = self.colocation
        assert colocation is not None
        with self.cache.lock:
            now = self.scheduler.clock()
            if isinstance(item, EmbeddingJob):
                colocation.controller.observe_embedding_arrival(now, item.blocks(self.cache.block_size))
                admission = colocation.admit_embedding(item, now)
            else:
                item.arrival = now
                admission = colocation.admit_llm(item, now)
            until = colocation.defer_until(item, now)
        self.metrics.on_admission(kind, admission.decision.value)
        if admission.decision is Decision.REJECT:
            if isinstance(item, EmbeddingJob):
                self.metrics.on_embedding_finished(429, 0.0, item.num_tokens)
            raise AdmissionRejected(admission.reason)
        if admission.decision is Decision.DEFER:
            self._inbox.put(("defer", Deferred(item, until)))
        else:
            self._inbox.put(("admitted", (item, admission.preempt)))
        self._wake.set()

    # ---- requests -----------------------------------------------------------------------

    def submit(
        self,
        prompt: str | list[int] | TokenisedPrompt,
        sampling: SamplingParams,
        *,
        priority: int = 0,
        tenant: str | None = None,
        cache_salt: str | None = None,
        cache_contract: CacheContract | None = None,
        request_id: str | None = None,
        kv_compression: KVCompression | None = None,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
    ) -> RequestHandle:
        """Queue a request; `kv_compression` compresses its prompt once after prefill.

        `slo_ttft_ms` and `slo_tpot_ms` are its SLOs (None: its tenant's defaults from the
        config); given, or with colocation on, its blocks carry the deadline they set.

        Raises:
            RequestError: It can never be served (empty prompt, token ids out of the vocabulary,
                prompt plus max_tokens beyond the pool).
            EngineClosedError: The engine is draining or stopped.
            AdmissionRejected: Colocation's admission control rejected it.
        """
        if self.draining or self.stopped:
            raise EngineClosedError("the engine is shutting down and takes no new request")
        tokenised = self.intake.prompt_ids(prompt, sampling)
        ids = tokenised.ids
        rid = request_id or f"cmpl-{uuid.uuid4().hex[:16]}"
        handle = RequestHandle(rid, self.abort)
        seq_id = next(self._ids)
        seq = Sequence(
            seq_id=seq_id,
            request_id=rid,
            prompt_ids=ids,
            sampling=self.intake.seeded(sampling, seq_id),
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids),
            emit=handle._put,
            priority=priority,
            tenant=tenant,
            cache_salt=cache_salt,
            cache_contract=cache_contract,
            text_marks=tokenised.marks,
            kv_compression=kv_compression,
        )
        self.intake.set_slo(seq, slo_ttft_ms, slo_tpot_ms)
        self._enqueue("llm", seq)
        return handle

    def submit_embedding(
        self,
        inputs: list[str | list[int]],
        *,
        tenant: str | None = None,
        priority: int = 0,
        slo_deadline_ms: float | None = None,
        request_id: str | None = None,
    ) -> EmbeddingHandle:
        """Queue an embedding request: one mean-pooled, L2-normalised vector per input.

        Raises:
            RequestError: An input is empty, has token ids outside the vocabulary, or is longer
                than the model's context or the pool.
            EngineClosedError: The engine is draining or stopped.
            AdmissionRejected: Colocation's admission control rejected it.
        """
        if self.draining or self.stopped:
            raise EngineClosedError("the engine is shutting down and takes no new request")
        texts = self.intake.embedding_texts(inputs)
        rid = request_id or f"emb-{uuid.uuid4().hex[:16]}"
        handle = EmbeddingHandle(rid)
        deadline_ms = (
            slo_deadline_ms if slo_deadline_ms is not None else self.config.slos_for(tenant)["deadline_ms"]
        )
        now = self.scheduler.clock()
        job = EmbeddingJob(
            request_id=rid,
            texts=texts,
            arrival=now,
            deadline=now + deadline_ms / 1e3,
            finish=handle._finish,
            tenant=tenant,
            priority=priority,
        )
        self._enqueue("embedding", job)
        return handle

    def _enqueue(self, kind: str, item: Sequence | EmbeddingJob) -> None:
        """Hand a new request to the loop: through colocation's admission when it is on."""
        if self.colocation is not None:
            self._admit_on_arrival(kind, item)
            return
        self._inbox.put(("embed" if kind == "embedding" else "add", item))
        self._wake.set()

    def chat_prompt(self, messages: list[ChatMessage], *, add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a conversation, rendered with the model's chat template (without
        the generation prompt: a conversation's prefix, which locates a cache breakpoint).

        Raises:
            RequestError: The model has no chat template, or the template refused the messages.
        """
        return self.intake.chat_prompt(messages, add_generation_prompt=add_generation_prompt)

    def chat_tokenised(self, messages: list[ChatMessage]) -> TokenisedPrompt:
        """A conversation's prompt and its text marks (`RequestIntake.chat_tokenised`)."""
        return self.intake.chat_tokenised(messages)

    def rest_of_context(self, prompt_tokens: int) -> int:
        """A chat request's default ``max_tokens`` (`RequestIntake.rest_of_context`)."""
        return self.intake.rest_of_context(prompt_tokens)

    def abort(self, request_id: str) -> None:
        """End a request with finish_reason "abort"."""
        self._inbox.put(("abort", request_id))
        self._wake.set()
