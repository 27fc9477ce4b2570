"""The engine: model, paged KV pool, cache manager and scheduler behind one thread-safe facade.

The engine loop runs in its own thread and calls `Scheduler.step()` with the cache manager's
lock held, so a hot swap (`set_policy`), which takes the same lock, happens between two steps:
no step sees half a swap, and no cached block or request is lost. The server is the only
caller (docs/architecture.md, "Layers"); tests drive the facade directly too.

    engine = Engine(EngineConfig(num_blocks=256, device="cpu"))
    engine.start()
    out = engine.submit("Hello", SamplingParams(max_tokens=8)).result()
    engine.shutdown()
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import SageCacheError
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.stats import CacheStats
from engine_adapter.cache.tree import MAX_GHOSTS, tree_snapshot
from engine_adapter.colocation import ColocationController, Decision
from engine_adapter.model.chat_template import ChatMessage, ChatTemplateError, render_chat
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.loader import load_model
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.model.tokenizer import IncrementalDetokenizer
from engine_adapter.serving.colocation import Deferred, EngineColocation, colocation_params
from engine_adapter.serving.config import EngineConfig, colocation_switches
from engine_adapter.serving.embedding_batch import (
    EmbeddingHandle,
    EmbeddingJob,
    EmbeddingResult,
    EmbeddingText,
)
from engine_adapter.serving.metrics import EngineMetrics
from engine_adapter.serving.scheduler import RequestOutput, Scheduler, SchedulerLimits, Sequence
from engine_adapter.token_eviction import KVCompression
from engine_adapter.token_eviction.policies import make_token_policy
from engine_adapter.token_eviction.pressure import (
    CudaMonitor,
    LeastMonitor,
    PoolMonitor,
    ProcMeminfoMonitor,
    SystemMonitor,
    TokenCacheManager,
)
from sage_eviction import (
    available_policies,
    get_policy_class,
    policy_params,
)
from sage_eviction.native import core_implementation
from sage_eviction.registry import parse_policy_spec

__all__ = [
    "DEFAULT_NUM_BLOCKS",
    "Engine",
    "AdmissionRejected",
    "EngineClosedError",
    "RequestError",
    "RequestHandle",
    "RequestOutput",
]

# The pool size when the config sets none: enough for sage-tiny on a CPU; pass --num-blocks,
# --kv-cache-memory or --gpu-memory-utilization for a real model.
DEFAULT_NUM_BLOCKS = 2048


log = structlog.get_logger("sage.engine")


class RequestError(ValueError):
    """A request that can never be served (empty prompt, too long for the pool, bad values)."""


class EngineClosedError(RuntimeError):
    """The engine is draining or stopped and takes no new request."""


class AdmissionRejected(RuntimeError):
    """Colocation's admission control rejected the request (the message is its reason): a 429."""


class RequestHandle:
    """A submitted request: iterate its deltas (blocking or async), or wait for the result."""

    def __init__(self, request_id: str, engine: Engine) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: queue.Queue[RequestOutput] = queue.Queue()
        self._done = threading.Event()
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._final: RequestOutput | None = None

    def _put(self, output: RequestOutput) -> None:
        self._text.append(output.text)
        self._tokens.extend(output.token_ids)
        if output.finished:
            self._final = RequestOutput(
                request_id=output.request_id,
                text="".join(self._text),
                token_ids=list(self._tokens),
                finished=True,
                finish_reason=output.finish_reason,
                error=output.error,
                prompt_tokens=output.prompt_tokens,
                cached_tokens=output.cached_tokens,
                completion_tokens=output.completion_tokens,
            )
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
        self._engine.abort(self.request_id)


def _pool_blocks(config: EngineConfig, decoder: Any, device: str) -> int:
    cfg = decoder.config
    shape = {
        "num_layers": cfg.num_hidden_layers,
        "num_kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "block_size": config.block_size,
        "dtype": decoder.dtype,
    }
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_memory is not None:
        return PagedKVPool.blocks_for_memory(config.kv_cache_memory, **shape)
    if config.gpu_memory_utilization is not None:
        return PagedKVPool.blocks_for_utilization(config.gpu_memory_utilization, device=device, **shape)
    return DEFAULT_NUM_BLOCKS


class Engine:
    """An LLM engine with a paged prefix cache whose eviction policy can be swapped while it serves.

    Args:
        config: The engine's configuration.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.name = config.name
        get_policy_class(config.eviction_policy, online=True)  # before the model loads
        self.decoder, self.tokenizer, self.model_config = load_model(config.model, device=config.device)
        device = str(self.decoder.device)
        self.pool = self.decoder.make_pool(
            num_blocks=_pool_blocks(config, self.decoder, device), block_size=config.block_size
        )
        self.events = EvictionEventLog(
            config.eviction_log_path if config.log_evictions else None, ring_size=10_000
        )
        self.cache = CacheManager(
            self.pool.allocator,
            policy=config.eviction_policy,
            policy_params=dict(config.policy_params),
            max_pinned_ratio=config.max_pinned_ratio,
            eviction_threshold=config.eviction_threshold,
            event_log=self.events,
            protect_queued=config.protect_queued,
            explain=config.explain_evictions,
        )
        self.metrics = EngineMetrics(policy=self.cache.policy_name)
        self.events.subscribe(self._on_event)
        self.scheduler = Scheduler(
            self.cache,
            self.decoder,
            self.pool,
            self.tokenizer,
            SchedulerLimits(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_queued_requests=config.max_queued_requests,
                queued_timeout=config.queued_timeout,
                embedding_chunk_tokens=config.embedding_chunk_tokens,
            ),
        )
        self.scheduler.on_admitted = self._on_admitted
        self.token_manager = self._token_manager(config)
        self.scheduler.token_eviction = self.token_manager
        if config.adaptive_batch:
            self.scheduler.adaptive = AdaptiveBatch(config.max_num_seqs)
            self.scheduler.on_batch_change = self.metrics.on_batch_change
        self.metrics.set_batch_limit(config.max_num_seqs)
        self.scheduler.on_finished = self._on_finished
        self.scheduler.on_embedding_finished = self._on_embedding_finished
        self.colocation = self._colocation(config)
        # Mean time per output token, learnt from finished requests (a first guess until then).
        self.tpot_estimate_s = 0.02
        if config.enable_lifetime_prediction:
            self.scheduler.estimate_lifetime = self._estimate_lifetime
        self.started_at = time.time()
        self.draining = False
        self.stopped = False
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._last_reprefills = 0
        self._steps = 0
        self._forward_s = 0.0
        self._bookkeeping_s = 0.0
        self.loop_error: str | None = None

    def _colocation(self, config: EngineConfig) -> EngineColocation | None:
        """Spec 004's controller over the pool, wired into the scheduler; None when off."""
        if config.colocation == "off":
            return None
        try:
            params, system = colocation_params(config.colocation_params)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        controller = ColocationController(
            self.cache.num_blocks, self.cache.block_size, params, config.colocation, system=system
        )
        switches = colocation_switches(config.colocation_params)
        colocation = EngineColocation(controller, self.scheduler, self.cache.block_size, **switches)
        quota = controller.quota
        self.metrics.set_quota(quota.llm_blocks, quota.embedding_blocks)
        return colocation

    def _token_manager(self, config: EngineConfig) -> TokenCacheManager:
        """Token-level eviction (spec 002): the policy, and pressure from the least of the pool's
        available blocks and the device's memory."""
        cache = self.cache
        monitors: list[SystemMonitor] = [
            PoolMonitor(lambda: cache.num_available_blocks, cache.num_blocks, self.pool.bytes_per_block)
        ]
        if self.pool.device.type == "cuda":
            monitors.append(CudaMonitor(self.pool.device))
        elif self.pool.device.type == "cpu":
            monitors.append(ProcMeminfoMonitor())
        return TokenCacheManager(
            make_token_policy(config.token_eviction, window=config.eviction_window),
            LeastMonitor(*monitors),
            config.memory_threshold * 1024 * 1024,
            config.token_target_ratio,
            window=config.eviction_window,
            events=self.events,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine loop thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=f"sage-engine-{self.name}", daemon=True)
        self._thread.start()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; finish (drain) or abort the ones in flight; flush the log."""
        self.draining = True
        if not drain:
            self._inbox.put(("abort_all", None))
        self._inbox.put(("stop", None))
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.stopped = True
        self.events.close()

    def _loop(self) -> None:
        stopping = False
        while True:
            with self.cache.lock:
                stopping = self._drain_inbox() or stopping
                if self.colocation is not None:
                    self._colocation_tick()
                if self.scheduler.has_work():
                    try:
                        stats = self.scheduler.step()
                    except Exception as exc:  # keep serving: fail the running requests, not the engine
                        self.loop_error = f"{type(exc).__name__}: {exc}"
                        # The traceback and the requests it ended go to the engine's log, so the
                        # cause survives the one-line error the clients get.
                        log.error(
                            "engine step failed",
                            request_ids=[seq.request_id for seq in self.scheduler.running],
                            exc_info=exc,
                        )
                        self._fail_running(self.loop_error)
                        continue
                    self._steps += 1
                    self._forward_s += stats.forward_s
                    self._bookkeeping_s += stats.bookkeeping_s
                    if stats.preempted:
                        self.metrics.on_preemption(stats.preempted)
                    if self.cache.eviction_threshold is not None:
                        self.cache.evict_to_threshold()
                    self._update_gauges()
                    continue
                if stopping and not (self.colocation is not None and self.colocation.deferred):
                    return
            self._wake.wait(0.05)
            self._wake.clear()

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
                self.scheduler.add_embedding(arg)
            elif op == "admitted":  # colocation admitted it on arrival (with preemptions, maybe)
                self._enqueue_admitted(*arg)
            elif op == "defer":
                assert self.colocation is not None
                self.colocation.deferred.append(arg)
            elif op == "abort":
                if not self.scheduler.abort(arg) and self.colocation is not None:
                    self._abort_deferred(arg)
            elif op == "abort_all":
                for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
                    self.scheduler.abort(seq.request_id, "abort", "engine shut down")
                for job in list(self.scheduler.embedding_queue):
                    self.scheduler.abort_embedding(job.request_id, "engine shut down", 503)
                if self.colocation is not None:
                    for deferred in list(self.colocation.deferred):
                        self.colocation.deferred.remove(deferred)
                        self._reject(deferred.item, "engine shut down", 503)
            elif op == "stop":
                stop = True

    # ---- colocation (engine_adapter.serving.colocation) --------------------------------------

    def _enqueue_admitted(self, item: Sequence | EmbeddingJob, preempt: tuple[str, ...]) -> None:
        for request_id in preempt:
            if self.scheduler.preempt_request(request_id):
                self.metrics.on_preemption(1)
        if isinstance(item, EmbeddingJob):
            self.scheduler.add_embedding(item)
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
            self._on_embedding_finished(item, result)
            item.finish(result)
        else:
            self.scheduler._finish(item, "rejected" if status == 429 else "abort", reason)

    def _abort_deferred(self, request_id: str) -> None:
        """A deferred request whose client went away leaves the deferred list at once."""
        assert self.colocation is not None
        for deferred in list(self.colocation.deferred):
            item = deferred.item
            if isinstance(item, Sequence) and item.request_id == request_id:
                self.colocation.deferred.remove(deferred)
                self.scheduler._finish(item, "abort", "aborted by the client")

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
                self.scheduler.embedding_queue.remove(item)
            else:
                self.scheduler.waiting.remove(item)
            self._reject(item, reason)
        for deferred in list(colocation.deferred):
            item = deferred.item
            is_embedding = isinstance(item, EmbeddingJob)
            admission = (
                colocation.admit_embedding(item, now, count=False)
                if isinstance(item, EmbeddingJob)
                else colocation.admit_llm(item, now, count=False)
            )
            kind = "embedding" if is_embedding else "llm"
            if admission.decision is Decision.DEFER and now < deferred.until:
                continue
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

    def _fail_running(self, message: str) -> None:
        for seq in list(self.scheduler.running):
            try:
                self.scheduler.abort(seq.request_id, "error", message)
            except SageCacheError:
                self.scheduler.running.remove(seq)
        self.scheduler.fail_embeddings(message)

    def _update_gauges(self) -> None:
        cache = self.cache
        self.metrics.set_usage(cache.allocator.num_used / cache.num_blocks if cache.num_blocks else 0.0)
        self.metrics.set_queue(len(self.scheduler.running), len(self.scheduler.waiting))
        self.metrics.set_reserved(cache.num_reserved_blocks)
        reprefills = cache.re_prefill_blocks
        if reprefills > self._last_reprefills:
            self.metrics.on_re_prefill(reprefills - self._last_reprefills)
            self._last_reprefills = reprefills

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "freed":
            self.metrics.on_eviction(
                str(event["policy"]),
                str(event["reason"]),
                int(event["blocks_freed"]),
                float(event["duration_us"]) / 1e6,
            )

    # ---- requests -----------------------------------------------------------------------

    def submit(
        self,
        prompt: str | list[int],
        sampling: SamplingParams,
        *,
        priority: int = 0,
        tenant: str | None = None,
        cache_salt: str | None = None,
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
        """
        if self.draining or self.stopped:
            raise EngineClosedError("the engine is shutting down and takes no new request")
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt is empty")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if not ids:
            raise RequestError("prompt is empty")
        total = len(ids) + sampling.max_tokens
        max_tokens_in_pool = self.cache.num_blocks * self.cache.block_size
        # With a token policy a sequence shrinks as it grows: only its prompt must fit the pool.
        compresses = self.token_manager.policy.name() != "none"
        if (len(ids) + 1 if compresses else total) > max_tokens_in_pool:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the KV pool "
                f"({self.cache.num_blocks} blocks of {self.cache.block_size} tokens = {max_tokens_in_pool})"
            )
        limit = self.model_config.max_position_embeddings
        if total > limit:
            raise RequestError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) exceeds the model's "
                f"context of {limit} tokens"
            )
        rid = request_id or f"cmpl-{uuid.uuid4().hex[:16]}"
        handle = RequestHandle(rid, self)
        seq_id = next(self._ids)
        if sampling.seed is None and not sampling.greedy:
            # The engine's seed makes an unseeded sampled request reproducible, as vLLM's --seed does.
            sampling = dataclasses.replace(sampling, seed=self.config.seed * 1_000_003 + seq_id)
        seq = Sequence(
            seq_id=seq_id,
            request_id=rid,
            prompt_ids=ids,
            sampling=sampling,
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids),
            emit=handle._put,
            priority=priority,
            tenant=tenant,
            cache_salt=cache_salt,
            kv_compression=kv_compression,
        )
        self._set_slo(seq, slo_ttft_ms, slo_tpot_ms)
        if self.colocation is not None:
            self._admit_on_arrival("llm", seq)
            return handle
        self._inbox.put(("add", seq))
        self._wake.set()
        return handle

    def _set_slo(self, seq: Sequence, ttft_ms: float | None, tpot_ms: float | None) -> None:
        """The request's SLOs (its own, else its tenant's defaults) and, when it gave one or
        colocation is on, the deadline its blocks carry for the `slo` policy: the time by which
        it would finish if it met both (arrival + TTFT + TPOT for each further token). With
        colocation off and no SLO given, no deadline: the engine behaves as before SLOs."""
        defaults = self.config.slos_for(seq.tenant)
        seq.slo_ttft_ms = ttft_ms if ttft_ms is not None else defaults["ttft_ms"]
        seq.slo_tpot_ms = tpot_ms if tpot_ms is not None else defaults["tpot_ms"]
        if ttft_ms is not None or tpot_ms is not None or self.config.colocation != "off":
            budget_ms = seq.slo_ttft_ms + seq.slo_tpot_ms * max(seq.sampling.max_tokens - 1, 0)
            seq.deadline = self.cache.clock() + budget_ms / 1e3

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
        """
        if self.draining or self.stopped:
            raise EngineClosedError("the engine is shutting down and takes no new request")
        if not inputs:
            raise RequestError("input is empty")
        texts: list[EmbeddingText] = []
        limit = min(self.model_config.max_position_embeddings, self.cache.num_blocks * self.cache.block_size)
        vocab = self.model_config.vocab_size
        for i, item in enumerate(inputs):
            ids = self.tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
            if not ids:
                raise RequestError(f"input {i} is empty")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"input {i}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            if len(ids) > limit:
                raise RequestError(
                    f"input {i} has {len(ids)} tokens; at most {limit} fit the model's context and the pool"
                )
            texts.append(EmbeddingText(ids=ids))
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
        if self.colocation is not None:
            self._admit_on_arrival("embedding", job)
            return handle
        self._inbox.put(("embed", job))
        self._wake.set()
        return handle

    def chat_prompt(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt ids of a conversation, rendered with the model's chat template.

        Raises:
            RequestError: The model has no chat template, or the template refused the messages.
        """
        template = self.tokenizer.chat_template
        if template is None:
            raise RequestError(
                f"model {self.config.model!r} has no chat template; send a prompt to /v1/completions"
            )
        tokenizer = self.tokenizer
        try:
            text = render_chat(
                template,
                messages,
                bos_token=tokenizer.token_text(tokenizer.bos_token_id),
                eos_token=tokenizer.token_text(tokenizer.eos_token_id),
            )
        except ChatTemplateError as exc:
            raise RequestError(str(exc)) from exc
        # The rendered text holds its special tokens already.
        return tokenizer.encode(text, add_special_tokens=False)

    def _on_admitted(self, seq: Sequence, hit_tokens: int) -> None:
        self.metrics.on_lookup(hit_tokens, seq.num_tokens)

    def _estimate_lifetime(self, seq: Sequence) -> float:
        """Seconds a sequence has left: its remaining output tokens at the learnt time per token."""
        remaining = max(seq.sampling.max_tokens - len(seq.output_ids), 0)
        return remaining * self.tpot_estimate_s

    def _on_finished(self, seq: Sequence) -> None:
        if self.colocation is not None and seq.finish_reason in ("stop", "length"):
            self.colocation.controller.observe_llm_finished(len(seq.prompt_ids), len(seq.output_ids))
        times = seq.token_times
        if len(times) > 1:  # an exponential moving average of the time per output token
            tpot = (times[-1] - times[0]) / (len(times) - 1)
            self.tpot_estimate_s = 0.8 * self.tpot_estimate_s + 0.2 * tpot
        ttft = seq.first_token_time - seq.arrival if seq.first_token_time is not None else None
        self.metrics.on_request_finished(
            seq.finish_reason or "error",
            ttft,
            [b - a for a, b in itertools.pairwise(times)],
            prompt_tokens=len(seq.prompt_ids),
            generation_tokens=len(seq.output_ids),
        )

    def _on_embedding_finished(self, job: EmbeddingJob, result: EmbeddingResult) -> None:
        self.metrics.on_embedding_finished(result.status, result.latency_s, result.prompt_tokens)
        if self.colocation is not None and result.status == 200:
            self.colocation.controller.observe_embedding_finished(
                result.prompt_tokens, result.latency_s - result.queued_s
            )

    def abort(self, request_id: str) -> None:
        """End a request with finish_reason "abort"."""
        self._inbox.put(("abort", request_id))
        self._wake.set()

    # ---- what the server shows -------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """GET /v1/engine (without socket and pid)."""
        with self.cache.lock:
            return {
                "name": self.name,
                "model": self.config.model,
                "pid": os.getpid(),
                "device": str(self.decoder.device),
                # compiled core or pure-Python reference (sage_eviction.native), as this process loaded it
                "implementation": core_implementation(),
                "started_at": self.started_at,
                "uptime_s": time.time() - self.started_at,
                "policy": {"name": self.cache.policy_name, "params": dict(self.cache.policy_params)},
                "num_blocks": self.cache.num_blocks,
                "block_size": self.cache.block_size,
                "requests": {
                    "running": len(self.scheduler.running),
                    "waiting": len(self.scheduler.waiting),
                    "finished": self.scheduler.finished_count,
                },
                "steps": self._steps,
                "bookkeeping_share": self._bookkeeping_s / (self._bookkeeping_s + self._forward_s)
                if self._forward_s
                else 0.0,
                "loop_error": self.loop_error,
            }

    def eviction_stats(self) -> CacheStats:
        """GET /v1/eviction/stats (its JSON is `CacheStats.to_dict()`)."""
        return self.cache.stats()

    def colocation_stats(self) -> dict[str, Any] | None:
        """The ``colocation`` object of GET /v1/eviction/stats: mode, quotas, use, decisions;
        None when colocation is off."""
        if self.colocation is None:
            return None
        with self.cache.lock:
            return self.colocation.stats()

    def policies(self) -> dict[str, Any]:
        """GET /v1/eviction/policies: the online policies with their params and defaults."""
        listing = []
        for name in available_policies(include_offline=False):
            cls = get_policy_class(name)
            params = {k: p.default for k, p in policy_params(cls).items() if k != "capacity"}
            listing.append(
                {
                    "name": name,
                    "strategy": cls.strategy.name,
                    "paper": cls.paper,
                    "offline": cls.offline,
                    "params": params,
                }
            )
        return {"active": self.cache.policy_name, "policies": listing}

    def set_policy(self, policy: str, params: dict[str, Any]) -> dict[str, Any]:
        """Hot swap between two steps.

        Raises:
            UnknownPolicyError, OfflinePolicyError: No such policy, or one that needs the future;
                the message lists those an engine can serve.
            PolicyParamError: A bad param, or `capacity`, which is the pool's to give
                (`sage_eviction.resolve_policy`).
        """
        get_policy_class(parse_policy_spec(policy)[0], online=True)
        with self.cache.lock:
            result = self.cache.swap_policy(policy, **params)
        self.metrics.on_swap(result.new_name)
        return result.to_dict()

    def token_eviction(self) -> dict[str, Any]:
        """GET /v1/eviction/token: the token-level policy, its settings and totals."""
        manager = self.token_manager
        with self.cache.lock:
            return {
                "policy": manager.policy.name(),
                "params": manager.policy.params(),
                "eviction_window": manager.window,
                "memory_threshold_bytes": manager.threshold_bytes,
                "target_ratio": manager.target_ratio,
                "available_bytes": manager.monitor.mem_stats().available,
                **manager.stats.to_dict(),
            }

    def set_token_policy(self, name: str) -> dict[str, Any]:
        """Hot swap of the token-level policy between two steps (running sequences keep what
        their attention observed; one the new policy cannot score by keeps its newest tokens).

        Raises:
            RequestError: Unknown name (the message lists them).
        """
        manager = self.token_manager
        try:
            policy = make_token_policy(name, window=manager.window)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        with self.cache.lock:
            old = manager.policy.name()
            t0 = time.perf_counter()
            manager.policy = policy
            swap = time.perf_counter() - t0
        log.info("token policy swapped", old=old, new=policy.name())
        return {"old": old, "new": policy.name(), "params": policy.params(), "swap_time_s": swap}

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request uses (not counted as evictions); returns how many."""
        with self.cache.lock:
            return self.cache.reset_prefix_cache()

    def cache_tree(self, depth: int, max_nodes: int) -> dict[str, Any]:
        """GET /v1/cache/tree: the radix tree cut to `depth` and `max_nodes`, with ghosts."""
        evicted = self.events.tail(4 * MAX_GHOSTS)
        with self.cache.lock:
            tree = tree_snapshot(
                self.cache.radix,
                block_size=self.cache.block_size,
                depth=depth,
                max_nodes=max_nodes,
                evicted=evicted,
            )
        tree["policy"] = self.cache.policy_name
        tree["num_blocks"] = self.cache.num_blocks
        return tree

    def cache_usage(self) -> dict[str, Any]:
        """GET /v1/cache/usage: pool use by tenant and class, the queue and the batch limit."""
        with self.cache.lock:
            out = self.cache.usage()
            out["policy"] = self.cache.policy_name
            out["running"] = len(self.scheduler.running)
            out["waiting"] = len(self.scheduler.waiting)
            adaptive = self.scheduler.adaptive
            out["max_running_batch"] = adaptive.current if adaptive is not None else self.config.max_num_seqs
            out["adaptive_batch"] = adaptive is not None
            out["explain_evictions"] = self.cache.explain
        return out

    def eviction_events(self, tail: int) -> list[dict[str, Any]]:
        """The last `tail` eviction events, oldest first."""
        return self.events.tail(tail)

    def subscribe_events(self) -> queue.Queue[dict[str, Any]]:
        """A queue that receives every later event (a slow reader loses events, never stalls eviction)."""
        q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=10_000)
        self.events.subscribe(q)
        return q

    def unsubscribe_events(self, q: queue.Queue[dict[str, Any]]) -> None:
        self.events.unsubscribe(q)

    def metrics_registry(self) -> CollectorRegistry:
        """The engine's Prometheus registry (sage:* metrics)."""
        with self.cache.lock:
            self._update_gauges()
            self.metrics.set_pool_breakdown(self.cache.usage(), self.cache.tenant_hit_rates())
        return self.metrics.registry
