"""The engine's Prometheus metrics (docs/architecture.md, "Metrics"), served as text at `GET /metrics`.

`EngineMetrics` owns a private `prometheus_client.CollectorRegistry` (never the global one, so
two engines in one process, or a test beside a server, never collide) and exposes one method per
thing the engine observes. The engine calls them from its loop thread; prometheus_client's
metrics are thread-safe, and every method is O(1) apart from `on_request_finished`, which is
linear in the number of output tokens it is handed.

Methods the engine calls:

- ``set_active_policy(policy)``: at start, the policy in use (``sage:policy_info{policy} = 1``,
  every other policy seen so far 0); no swap counted.
- ``on_eviction(policy, reason, blocks, seconds)``: one eviction call freed ``blocks`` blocks
  for ``reason`` ("alloc", "watermark", "preempt", ...); ``seconds`` is the wall time of the
  policy decision.
- ``on_lookup(hit_tokens, lookup_tokens)``: one prefix-cache lookup of ``lookup_tokens`` prompt
  tokens of which ``hit_tokens`` were served from cache.
- ``set_usage(frac)``: used blocks / total blocks, 0..1.
- ``on_preemption(count=1)``: running sequences preempted.
- ``on_re_prefill(n)``: ``n`` evicted blocks were requested again and so recomputed.
- ``on_request_finished(reason, ttft, tpots, *, prompt_tokens=0, generation_tokens=0)``: a
  request ended with finish reason ``reason`` ("stop", "length", "abort", ...); ``ttft`` is its
  time to first token in seconds (None when it produced none), ``tpots`` the times between its
  consecutive output tokens in seconds.
- ``on_swap(policy)``: the policy was hot-swapped to ``policy``.
- ``set_queue(running, waiting)``: requests running and waiting right now.
- ``set_batch_limit(n)`` and ``on_batch_change(change)``: the running-batch limit, and each
  change ``--adaptive-batch`` makes (engine_adapter.cache.adaptive_batch).
- ``on_embedding_finished(status, latency, tokens)``: an embedding request ended (HTTP
  ``status``), ``latency`` seconds after it arrived, over ``tokens`` input tokens.
- ``set_reserved(blocks)``: pool blocks held by embedding reservations now.
- ``set_quota(llm, embedding)`` and ``on_admission(kind, decision)``: colocation's quotas
  (Algorithm 2) and each admission decision (Algorithm 1) by request kind.
- ``on_attention_fallback(policy)``: a token-level compression by an attention-scored policy
  found no attention and kept the newest tokens.
- ``set_tiers(tiers)``, ``on_tier_copies(seconds, failed)`` and ``on_tier_load(tier, seconds)``:
  the host/disk tiers' figures after each step, each step's tier copies, and each timed load
  from a tier into the pool (issue 30).
- ``set_pool_breakdown(usage, tenant_hit_rates)``: at each scrape, blocks by tenant and by
  priority class, and each tenant's hit rate with Jain's index over them (O(n): only when
  ``/metrics`` is read).

Metric names (``sage:`` prefix, vLLM's and SGLang's habits): ``sage:evictions_total{policy,
reason}`` (blocks), ``sage:eviction_duration_seconds``, ``sage:prefix_cache_queries_total`` and
``sage:prefix_cache_hits_total`` (tokens), ``sage:kv_cache_usage_perc`` (0..1),
``sage:num_preemptions_total``, ``sage:re_prefill_blocks_total``, ``sage:num_requests_running``,
``sage:num_requests_waiting``, ``sage:request_success_total{finish_reason}``,
``sage:time_to_first_token_seconds``, ``sage:time_per_output_token_seconds``,
``sage:prompt_tokens_total``, ``sage:generation_tokens_total``, ``sage:policy_swaps_total``,
``sage:policy_info{policy}``, ``sage:max_running_batch``, ``sage:batch_changes_total{direction}``,
``sage:kv_cache_blocks_by_tenant{tenant}``, ``sage:kv_cache_blocks_by_class{priority_class}``,
``sage:prefix_cache_tenant_hit_rate{tenant}``, ``sage:tenant_fairness_index``,
``sage:embedding_requests_total{status}``, ``sage:embedding_latency_seconds``,
``sage:embedding_tokens_total``, ``sage:reserved_blocks``, ``sage:quota_blocks{class}`` (``llm``,
``embedding``; only with colocation on), ``sage:admission_decisions_total{kind, decision}`` and
``sage:token_attention_fallbacks_total{policy}``; with KV tiers ``sage:kv_tier_used_blocks{tier}``,
``sage:kv_tier_capacity_blocks{tier}``, ``sage:kv_tier_blocks_total{tier, event}``,
``sage:kv_tier_copy_duration_seconds``, ``sage:kv_tier_load_duration_seconds{tier}`` and
``sage:kv_tier_failed_moves_total``; with compress-on-evict ``sage:compressed_prefix_blocks`` and
``sage:compressed_prefix_total{event}`` (``set_compressed``); the prompt-cache contract's
``sage:prompt_cache_retained_blocks``, ``sage:prompt_cache_retention_blocks_total{event}``
(``set_retention``), ``sage:prompt_cache_written_tokens_total``, and per tenant and salt
``sage:prompt_cache_account_tokens_total{tenant, salt, kind}`` and
``sage:prompt_cache_account_requests_total{tenant, salt, event}`` (``set_cache_accounts``). The
dashboard (dashboards/sage.json) draws them; tests/test_cache_view.py keeps the two in step.
Each family is declared once, in the table `METRIC_FAMILIES` (name, help, labels, buckets).

Imports: prometheus_client, the adaptive batch's record and the library's fairness index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine_adapter.cache.adaptive_batch import BatchChange
from engine_adapter.serving.account_metrics import AccountCounters
from sage_eviction.metrics import jain_fairness

__all__ = [
    "EVICTION_DURATION_BUCKETS",
    "METRIC_FAMILIES",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "EngineMetrics",
    "MetricFamily",
]

# A policy decision takes microseconds; anything past 10 ms lands in +Inf and is a bug to look at.
EVICTION_DURATION_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
)  # fmt: skip
# vLLM's buckets for the same two histograms.
# A step's tier copies: tens of microseconds for a block to host, up to seconds from a cold disk.
TIER_COPY_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """One `sage:*` metric family: its kind, exposed name, help text, labels and buckets.

    `exported_from_start` names the label values whose series exist (at 0) from the moment the
    family is registered: a labelled series is otherwise absent until its first change, and a
    dashboard panel over a closed set of values (``direction``: shrink, grow) would be empty on
    a fresh engine.
    """

    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    exported_from_start: tuple[tuple[str, ...], ...] = ()

    def register(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        """The family's metric, registered in `registry`, with its series exported from start."""
        metric: Counter | Gauge | Histogram
        if self.kind is Histogram:
            buckets = self.buckets if self.buckets is not None else Histogram.DEFAULT_BUCKETS
            metric = Histogram(
                self.name, self.documentation, list(self.labels), registry=registry, buckets=buckets
            )
        else:
            metric = self.kind(self.name, self.documentation, list(self.labels), registry=registry)
        for values in self.exported_from_start:
            metric.labels(*values)
        return metric


# The families, by the attribute of `EngineMetrics` that holds each, in registration (and so
# exposition) order. prometheus_client appends `_total` to counters itself; the names below are
# the exposed ones.
METRIC_FAMILIES: dict[str, MetricFamily] = {
    "evictions": MetricFamily(
        Counter, "sage:evictions_total", "Blocks evicted, by policy and reason.", ("policy", "reason")
    ),
    "eviction_duration": MetricFamily(
        Histogram,
        "sage:eviction_duration_seconds",
        "Wall time of the policy decision per eviction call.",
        buckets=EVICTION_DURATION_BUCKETS,
    ),
    "prefix_cache_queries": MetricFamily(
        Counter, "sage:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."
    ),
    "prefix_cache_hits": MetricFamily(
        Counter, "sage:prefix_cache_hits_total", "Prompt tokens served from the prefix cache."
    ),
    "kv_cache_usage": MetricFamily(
        Gauge, "sage:kv_cache_usage_perc", "KV-cache usage: used blocks / total blocks (0..1)."
    ),
    "preemptions": MetricFamily(Counter, "sage:num_preemptions_total", "Running sequences preempted."),
    "re_prefill_blocks": MetricFamily(
        Counter, "sage:re_prefill_blocks_total", "Evicted blocks requested again and recomputed."
    ),
    "requests_running": MetricFamily(Gauge, "sage:num_requests_running", "Requests running."),
    "requests_waiting": MetricFamily(Gauge, "sage:num_requests_waiting", "Requests waiting."),
    "request_success": MetricFamily(
        Counter, "sage:request_success_total", "Finished requests, by finish reason.", ("finish_reason",)
    ),
    "time_to_first_token": MetricFamily(
        Histogram, "sage:time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS
    ),
    "time_per_output_token": MetricFamily(
        Histogram,
        "sage:time_per_output_token_seconds",
        "Time between consecutive output tokens.",
        buckets=TPOT_BUCKETS,
    ),
    "prompt_tokens": MetricFamily(Counter, "sage:prompt_tokens_total", "Prompt tokens of finished requests."),
    "generation_tokens": MetricFamily(
        Counter, "sage:generation_tokens_total", "Tokens generated by finished requests."
    ),
    "policy_swaps": MetricFamily(Counter, "sage:policy_swaps_total", "Eviction-policy hot swaps."),
    "policy_info": MetricFamily(
        Gauge, "sage:policy_info", "1 for the eviction policy in use, 0 for the others seen.", ("policy",)
    ),
    "max_running_batch": MetricFamily(
        Gauge, "sage:max_running_batch", "Most requests the scheduler runs at once now."
    ),
    "batch_changes": MetricFamily(
        Counter,
        "sage:batch_changes_total",
        "Changes of the running-batch limit by --adaptive-batch, shrink or grow.",
        ("direction",),
        exported_from_start=(("shrink",), ("grow",)),
    ),
    "blocks_by_tenant": MetricFamily(
        Gauge, "sage:kv_cache_blocks_by_tenant", "Pool blocks in use, by tenant ('-': none).", ("tenant",)
    ),
    "blocks_by_class": MetricFamily(
        Gauge,
        "sage:kv_cache_blocks_by_class",
        "Pool blocks in use, by priority class (low, normal, high).",
        ("priority_class",),
    ),
    "tenant_hit_rate": MetricFamily(
        Gauge, "sage:prefix_cache_tenant_hit_rate", "Prefix-cache hit rate of each tenant.", ("tenant",)
    ),
    "tenant_fairness": MetricFamily(
        Gauge, "sage:tenant_fairness_index", "Jain's fairness index over the tenants' hit rates."
    ),
    # Embeddings and colocation (spec 004).
    "embedding_requests": MetricFamily(
        Counter, "sage:embedding_requests_total", "Finished embedding requests, by HTTP status.", ("status",)
    ),
    "embedding_latency": MetricFamily(
        Histogram,
        "sage:embedding_latency_seconds",
        "Embedding request latency, arrival to answer.",
        buckets=TTFT_BUCKETS,
    ),
    "embedding_tokens": MetricFamily(
        Counter, "sage:embedding_tokens_total", "Input tokens of finished embedding requests."
    ),
    "reserved_blocks": MetricFamily(
        Gauge, "sage:reserved_blocks", "Pool blocks reserved as embedding batches' workspace."
    ),
    "quota_blocks": MetricFamily(
        Gauge, "sage:quota_blocks", "Colocation quota in blocks, by class (llm, embedding).", ("class",)
    ),
    "admission_decisions": MetricFamily(
        Counter,
        "sage:admission_decisions_total",
        "Colocation admission decisions, by request kind (llm, embedding) and decision.",
        ("kind", "decision"),
    ),
    # Compress-on-evict (issue 36), from the cache's counters after each step.
    "compressed_prefix_blocks": MetricFamily(
        Gauge, "sage:compressed_prefix_blocks", "Pool blocks held by compressed prefixes (compress-on-evict)."
    ),
    "compressed_prefix": MetricFamily(
        Counter,
        "sage:compressed_prefix_total",
        "Compress-on-evict by event: compressions (chains compacted instead of evicted), hits "
        "(admissions served from a compressed prefix), hit_tokens (the prompt tokens they reused).",
        ("event",),
    ),
    # KV tiers under the pool (issue 30), from the cache's TierStats after each step.
    "kv_tier_used_blocks": MetricFamily(
        Gauge, "sage:kv_tier_used_blocks", "Blocks held in a lower KV tier now, by tier.", ("tier",)
    ),
    "kv_tier_capacity_blocks": MetricFamily(
        Gauge, "sage:kv_tier_capacity_blocks", "Capacity of a lower KV tier in blocks, by tier.", ("tier",)
    ),
    "kv_tier_blocks": MetricFamily(
        Counter,
        "sage:kv_tier_blocks_total",
        "Blocks by tier and event: hits (found there and loaded back), demotions (came down into "
        "it), promotions (copied up to the pool), drops (left every tier), moved_in and moved_out "
        "(block copies written and read), prefetched (loaded for a queued request) and "
        "prefetch_hits (of those, found by their request when it ran).",
        ("tier", "event"),
    ),
    "kv_tier_copy_duration": MetricFamily(
        Histogram,
        "sage:kv_tier_copy_duration_seconds",
        "Time a step spent copying blocks between the pool and its tiers (steps with copies only).",
        buckets=TIER_COPY_BUCKETS,
    ),
    "kv_tier_load_duration": MetricFamily(
        Histogram,
        "sage:kv_tier_load_duration_seconds",
        "Time one load of blocks from a lower tier into the pool took (a step's blocks from that "
        "tier, copied as one batch), by source tier.",
        ("tier",),
        buckets=TIER_COPY_BUCKETS,
    ),
    "kv_tier_failed_moves": MetricFamily(
        Counter,
        "sage:kv_tier_failed_moves_total",
        "Tier copies whose source could not be read (a disk file missing or corrupt): a miss.",
    ),
    # The prompt-cache contract (issue 51): lifetimes and writes.
    "prompt_cache_retained_blocks": MetricFamily(
        Gauge, "sage:prompt_cache_retained_blocks", "Blocks under an unexpired prompt-cache lifetime now."
    ),
    "prompt_cache_retention": MetricFamily(
        Counter,
        "sage:prompt_cache_retention_blocks_total",
        "Prompt-cache lifetimes by event, in blocks: granted (or lengthened by a hit), refused (no "
        "lower tier and the device share full), broken (dropped before expiry), expired.",
        ("event",),
    ),
    "prompt_cache_written_tokens": MetricFamily(
        Counter,
        "sage:prompt_cache_written_tokens_total",
        "Prompt tokens finished requests newly wrote to the prefix cache (whole blocks).",
    ),
    "prompt_cache_account_tokens": MetricFamily(
        Counter,
        "sage:prompt_cache_account_tokens_total",
        "Prompt tokens per tenant and salt (a SHA-256 label; at most 1,024 pairs) by kind: prompt, "
        "read_device, read_host, read_disk, written.",
        ("tenant", "salt", "kind"),
    ),
    "prompt_cache_account_requests": MetricFamily(
        Counter,
        "sage:prompt_cache_account_requests_total",
        "Requests per tenant and salt by event: admitted, retention_granted, retention_refused.",
        ("tenant", "salt", "event"),
    ),
    # Token-level eviction (spec 002).
    "token_attention_fallbacks": MetricFamily(
        Counter,
        "sage:token_attention_fallbacks_total",
        "Compressions by an attention-scored token policy that found no attention and kept the "
        "newest tokens, by policy.",
        ("policy",),
    ),
}


# `sage:kv_tier_blocks_total`'s events and the `TierStats` field each counts.
_TIER_EVENTS = (
    ("hits", "hits"),
    ("demotions", "demotions"),
    ("promotions", "promotions"),
    ("drops", "drops"),
    ("moved_in", "blocks_moved_in"),
    ("moved_out", "blocks_moved_out"),
    ("prefetched", "prefetched_blocks"),
    ("prefetch_hits", "prefetch_hits"),
)


# `sage:prompt_cache_retention_blocks_total`'s events and the `Retention.counters` key each counts.
_RETENTION_EVENTS = (
    ("granted", "retention_granted_blocks"),
    ("refused", "retention_refused_blocks"),
    ("broken", "retention_broken_blocks"),
    ("expired", "retention_expired_blocks"),
)


class EngineMetrics:
    """The engine's `sage:*` Prometheus metrics, in a registry of their own.

    Args:
        registry: where to register the metrics; a new `CollectorRegistry` when None.
        policy: the policy in use at start, if known (see `set_active_policy`).
    """

    # One attribute per family of `METRIC_FAMILIES`, registered in `__init__`.
    evictions: Counter
    eviction_duration: Histogram
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    kv_cache_usage: Gauge
    preemptions: Counter
    re_prefill_blocks: Counter
    requests_running: Gauge
    requests_waiting: Gauge
    request_success: Counter
    time_to_first_token: Histogram
    time_per_output_token: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    policy_swaps: Counter
    policy_info: Gauge
    max_running_batch: Gauge
    batch_changes: Counter
    blocks_by_tenant: Gauge
    blocks_by_class: Gauge
    tenant_hit_rate: Gauge
    tenant_fairness: Gauge
    embedding_requests: Counter
    embedding_latency: Histogram
    embedding_tokens: Counter
    reserved_blocks: Gauge
    quota_blocks: Gauge
    admission_decisions: Counter
    token_attention_fallbacks: Counter
    kv_tier_used_blocks: Gauge
    kv_tier_capacity_blocks: Gauge
    kv_tier_blocks: Counter
    kv_tier_copy_duration: Histogram
    kv_tier_load_duration: Histogram
    kv_tier_failed_moves: Counter
    compressed_prefix_blocks: Gauge
    compressed_prefix: Counter
    prompt_cache_retained_blocks: Gauge
    prompt_cache_retention: Counter
    prompt_cache_written_tokens: Counter
    prompt_cache_account_tokens: Counter
    prompt_cache_account_requests: Counter

    def __init__(self, registry: CollectorRegistry | None = None, policy: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        for attribute, family in METRIC_FAMILIES.items():
            setattr(self, attribute, family.register(self.registry))
        self._lock = threading.Lock()  # guards _policies and the policy_info flip
        self._policies: set[str] = set()
        self._tier_counted: dict[tuple[str, str], int] = {}  # (tier, event) -> already counted
        self._accounts = AccountCounters(self.prompt_cache_account_tokens, self.prompt_cache_account_requests)
        for event, _ in _RETENTION_EVENTS:  # at zero from the start, as the dashboard reads them
            self.prompt_cache_retention.labels(event=event)
        if policy is not None:
            self.set_active_policy(policy)

    def set_active_policy(self, policy: str) -> None:
        """Mark `policy` as the one in use (`sage:policy_info`), without counting a swap."""
        with self._lock:
            for name in self._policies:
                if name != policy:
                    self.policy_info.labels(policy=name).set(0)
            self._policies.add(policy)
            self.policy_info.labels(policy=policy).set(1)

    def on_eviction(self, policy: str, reason: str, blocks: int, seconds: float) -> None:
        """One eviction call of `policy` freed `blocks` blocks for `reason` in `seconds` of decision time."""
        if blocks > 0:
            self.evictions.labels(policy=policy, reason=reason).inc(blocks)
        self.eviction_duration.observe(seconds)

    def on_lookup(self, hit_tokens: int, lookup_tokens: int) -> None:
        """A prefix-cache lookup of `lookup_tokens` prompt tokens, `hit_tokens` of them cached."""
        if lookup_tokens > 0:
            self.prefix_cache_queries.inc(lookup_tokens)
        if hit_tokens > 0:
            self.prefix_cache_hits.inc(hit_tokens)

    def set_usage(self, frac: float) -> None:
        """KV-cache usage, used blocks / total blocks."""
        self.kv_cache_usage.set(frac)

    def on_preemption(self, count: int = 1) -> None:
        """`count` running sequences were preempted."""
        self.preemptions.inc(count)

    def set_tiers(self, tiers: Sequence[Mapping[str, Any]]) -> None:
        """The lower tiers' figures now (`TierStats` as dicts): gauges set, counters advanced by
        what grew since the last call (the cache's counts are cumulative)."""
        for tier in tiers:
            name = str(tier["tier"])
            # Each tier's load histogram exists from the start, at zero, so that a fresh engine's
            # panel reads 0 rather than "no data" (issue 48): labels() makes the series, observing nothing.
            self.kv_tier_load_duration.labels(tier=name)
            self.kv_tier_used_blocks.labels(tier=name).set(tier["used_blocks"])
            self.kv_tier_capacity_blocks.labels(tier=name).set(tier["capacity_blocks"])
            for event, field in _TIER_EVENTS:
                now, before = int(tier[field]), self._tier_counted.get((name, event), 0)
                if now > before:
                    self.kv_tier_blocks.labels(tier=name, event=event).inc(now - before)
                    self._tier_counted[(name, event)] = now

    def set_compressed(self, counters: Mapping[str, int]) -> None:
        """Compress-on-evict's counters now (`CompressedPrefixes.counters`): the blocks gauge
        set, the event counters advanced by what grew since the last call."""
        self.compressed_prefix_blocks.set(counters["blocks"])
        for event in ("compressions", "hits", "hit_tokens"):
            now, before = int(counters[event]), self._tier_counted.get(("compressed", event), 0)
            if now > before:
                self.compressed_prefix.labels(event=event).inc(now - before)
                self._tier_counted[("compressed", event)] = now

    def set_retention(self, counters: Mapping[str, int]) -> None:
        """The prompt-cache lifetimes' counters now (`Retention.counters`): the gauge set, the
        event counters advanced by what grew since the last call."""
        self.prompt_cache_retained_blocks.set(counters["retained_blocks"])
        for event, key in _RETENTION_EVENTS:
            now, before = int(counters[key]), self._tier_counted.get(("retention", event), 0)
            if now > before:
                self.prompt_cache_retention.labels(event=event).inc(now - before)
                self._tier_counted[("retention", event)] = now

    def set_cache_accounts(self, accounts: Sequence[Mapping[str, Any]]) -> None:
        """The per tenant-and-salt totals now (`CacheManager.cache_accounts`, at a scrape)."""
        self._accounts.advance(accounts)

    def on_tier_copies(self, seconds: float, failed: int) -> None:
        """A step copied blocks between the tiers for `seconds`; `failed` copies could not read."""
        self.kv_tier_copy_duration.observe(seconds)
        if failed:
            self.kv_tier_failed_moves.inc(failed)

    def on_tier_load(self, tier: str, seconds: float) -> None:
        """One load of blocks from `tier` into the pool took `seconds`."""
        self.kv_tier_load_duration.labels(tier=tier).observe(seconds)

    def on_re_prefill(self, n: int) -> None:
        """`n` evicted blocks were requested again (and recomputed)."""
        if n > 0:
            self.re_prefill_blocks.inc(n)

    def on_request_finished(
        self,
        reason: str,
        ttft: float | None,
        tpots: Iterable[float],
        *,
        prompt_tokens: int = 0,
        generation_tokens: int = 0,
        written_tokens: int = 0,
    ) -> None:
        """A request finished with `reason`.

        Args:
            reason: its finish reason ("stop", "length", "abort", "timeout", "dropped", "error").
            ttft: time to first token in seconds; None when no token was produced.
            tpots: seconds between its consecutive output tokens.
            prompt_tokens: its prompt length in tokens.
            generation_tokens: tokens it generated.
            written_tokens: prompt tokens it newly wrote to the prefix cache.
        """
        self.request_success.labels(finish_reason=reason).inc()
        if ttft is not None:
            self.time_to_first_token.observe(ttft)
        for tpot in tpots:
            self.time_per_output_token.observe(tpot)
        if prompt_tokens > 0:
            self.prompt_tokens.inc(prompt_tokens)
        if generation_tokens > 0:
            self.generation_tokens.inc(generation_tokens)
        if written_tokens > 0:
            self.prompt_cache_written_tokens.inc(written_tokens)

    def on_swap(self, policy: str) -> None:
        """The eviction policy was hot-swapped to `policy`."""
        self.policy_swaps.inc()
        self.set_active_policy(policy)

    def set_queue(self, running: int, waiting: int) -> None:
        """Requests running and waiting right now."""
        self.requests_running.set(running)
        self.requests_waiting.set(waiting)

    def set_batch_limit(self, limit: int) -> None:
        """The scheduler runs at most `limit` requests at once now."""
        self.max_running_batch.set(limit)

    def on_batch_change(self, change: BatchChange) -> None:
        """--adaptive-batch changed the running-batch limit."""
        self.batch_changes.labels(direction="shrink" if change.new < change.old else "grow").inc()
        self.max_running_batch.set(change.new)

    def on_embedding_finished(self, status: int, latency: float, tokens: int) -> None:
        """An embedding request ended with HTTP `status` after `latency` seconds."""
        self.embedding_requests.labels(status=str(status)).inc()
        if status == 200:
            self.embedding_latency.observe(latency)
            if tokens > 0:
                self.embedding_tokens.inc(tokens)

    def set_reserved(self, blocks: int) -> None:
        """Pool blocks held by reservations now."""
        self.reserved_blocks.set(blocks)

    def set_quota(self, llm: int, embedding: int) -> None:
        """Colocation's current quotas in blocks."""
        self.quota_blocks.labels("llm").set(llm)
        self.quota_blocks.labels("embedding").set(embedding)

    def on_admission(self, kind: str, decision: str) -> None:
        """Colocation admitted, deferred or rejected a request of `kind` (llm, embedding)."""
        self.admission_decisions.labels(kind=kind, decision=decision).inc()

    def on_attention_fallback(self, policy: str) -> None:
        """A compression by `policy` kept the newest tokens: it found no attention to score by."""
        self.token_attention_fallbacks.labels(policy=policy).inc()

    def set_pool_breakdown(
        self, usage: Mapping[str, Any], tenant_hit_rates: Mapping[str | None, float]
    ) -> None:
        """Blocks by tenant and class (`CacheManager.usage()`), and hit rates by tenant."""
        self.blocks_by_tenant.clear()
        for tenant, blocks in usage.get("by_tenant", {}).items():
            self.blocks_by_tenant.labels(tenant=str(tenant)).set(blocks)
        self.blocks_by_class.clear()
        for name, blocks in usage.get("by_class", {}).items():
            self.blocks_by_class.labels(priority_class=str(name)).set(blocks)
        self.tenant_hit_rate.clear()
        for tenant, rate in tenant_hit_rates.items():
            self.tenant_hit_rate.labels(tenant="-" if tenant is None else str(tenant)).set(rate)
        self.tenant_fairness.set(jain_fairness(list(tenant_hit_rates.values())))
