"""The engine's control plane: what the control API's queries and swaps read and change.

`EngineControl` is the base class of `Engine` that answers ``GET /v1/engine``, the
``/v1/eviction/*`` and ``/v1/cache/*`` endpoints and ``/metrics`` (docs/architecture.md,
"Control API"), and swaps the block and token policies. It owns nothing: it reads the parts
the engine builds (declared below) and takes the cache manager's lock, so an answer never sees
half a step and a swap falls between two steps. The few answers that ask torch (the engine
thread's thread count, a CUDA device's free memory) ask it on the engine thread, before taking
the lock (docs/architecture.md, "Threads"): never wait on the engine thread with the lock held,
since the loop takes it to run the jobs. The rest (the cache's bookkeeping, the swaps and the
reset: pure Python) runs on the caller's thread under the lock. `LoopStats` is what the engine
loop has done.

Imports: the cache core, token-level eviction, the policy library, and this package's metrics,
scheduler, colocation and errors; never the engine (which imports this).
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import asdict, dataclass
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.stats import CacheStats
from engine_adapter.cache.tree import MAX_GHOSTS, tree_snapshot
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.serving.colocation import EngineColocation
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine_thread import EngineThread, ThreadSettings, check_threads
from engine_adapter.serving.errors import RequestError
from engine_adapter.serving.metrics import EngineMetrics
from engine_adapter.serving.quota_metrics import SaltQuotaMetrics
from engine_adapter.serving.scheduler import Scheduler
from engine_adapter.token_eviction.pressure import TokenCacheManager
from engine_adapter.token_eviction.registry import token_policy_from_spec
from sage_eviction import describe_policies, get_policy_class
from sage_eviction.native import core_implementation
from sage_eviction.registry import parse_policy_spec

__all__ = ["EngineControl", "LoopStats"]

log = structlog.get_logger("sage.engine")


@dataclass(slots=True)
class LoopStats:
    """What the engine loop has done since start (``GET /v1/engine``)."""

    steps: int = 0
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0
    re_prefills_counted: int = 0  # the cache's re-prefilled blocks already in the metrics
    tier_moves: int = 0  # blocks copied between the pool and its host/disk tiers
    tier_failed_moves: int = 0  # of which failed (an unreadable disk file): misses
    tier_copy_s: float = 0.0  # time in those copies (part of bookkeeping_s)
    error: str | None = None  # the last step that failed, as "Type: message"

    @property
    def bookkeeping_share(self) -> float:
        """Bookkeeping's share of the loop's time in steps (0 before the first forward)."""
        if not self.forward_s:
            return 0.0
        return self.bookkeeping_s / (self.bookkeeping_s + self.forward_s)


class EngineControl:
    """The control plane's queries and swaps over an engine's parts (the base of `Engine`)."""

    # The parts, set by `Engine.__init__`.
    name: str
    config: EngineConfig
    decoder: Decoder
    pool: PagedKVPool
    cache: CacheManager
    events: EvictionEventLog
    metrics: EngineMetrics
    token_manager: TokenCacheManager
    scheduler: Scheduler
    colocation: EngineColocation | None
    started_at: float
    loop: LoopStats
    engine_thread: EngineThread
    thread_settings: ThreadSettings

    @property
    def loop_error(self) -> str | None:
        """The last failed step's error ("Type: message"); None while every step succeeded."""
        return self.loop.error

    def info(self) -> dict[str, Any]:
        """GET /v1/engine (without socket and pid)."""
        threads = self.engine_thread.call(check_threads, self.thread_settings).to_dict()
        with self.cache.lock:
            return {
                "name": self.name,
                "model": self.config.model,
                "pid": os.getpid(),
                "device": str(self.decoder.device),
                **self.decoder.precision(self.pool),  # dtype, kv_dtype, quantization, compile
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
                "steps": self.loop.steps,
                "bookkeeping_share": self.loop.bookkeeping_share,
                "tier_copies": {
                    "moves": self.loop.tier_moves,
                    "failed": self.loop.tier_failed_moves,
                    "seconds": self.loop.tier_copy_s,
                },
                "loop_error": self.loop.error,
                "threads": threads,
            }

    # ---- block-level eviction ----------------------------------------------------------------

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
        return {"active": self.cache.policy_name, "policies": describe_policies(include_offline=False)}

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

    # ---- token-level eviction ----------------------------------------------------------------

    def token_eviction(self) -> dict[str, Any]:
        """GET /v1/eviction/token: the token-level policy, its settings and totals."""
        manager = self.token_manager
        available = self.engine_thread.call(manager.monitor.mem_stats).available
        with self.cache.lock:
            return {
                "policy": manager.policy.name(),
                "params": manager.policy.params(),
                "eviction_window": manager.window,
                "memory_threshold_bytes": manager.threshold_bytes,
                "target_ratio": manager.target_ratio,
                "available_bytes": available,
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
            policy = token_policy_from_spec(name, window=manager.window)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        with self.cache.lock:
            old = manager.policy.name()
            t0 = time.perf_counter()
            manager.policy = policy
            swap = time.perf_counter() - t0
        log.info("token policy swapped", old=old, new=policy.name())
        return {"old": old, "new": policy.name(), "params": policy.params(), "swap_time_s": swap}

    # ---- the cache -----------------------------------------------------------------------------

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

    # ---- per-salt quotas (``/v1/cache/quotas``) --------------------------------------------------

    def set_quota(self, salt: str, device_blocks: int | None, host_blocks: int | None) -> dict[str, Any]:
        """PUT /v1/cache/quotas/{salt}: set (or replace) `salt`'s quota; its view after.

        Raises:
            QuotaLimitError: `salt` is new and the most salts that may have a quota have one.
        """
        with self.cache.lock:
            self.cache.set_quota(salt, device_blocks, host_blocks)
            view = self.cache.quota(salt)
        assert view is not None  # just set, under the lock
        return view

    def quota(self, salt: str) -> dict[str, Any] | None:
        """GET /v1/cache/quotas/{salt}: its quota and use now, or None when it has none."""
        return self.cache.quota(salt)

    def quotas(self) -> list[dict[str, Any]]:
        """GET /v1/cache/quotas: every quota and its use, by salt."""
        return self.cache.quotas()

    def delete_quota(self, salt: str) -> bool:
        """DELETE /v1/cache/quotas/{salt}: whether it had one."""
        return self.cache.delete_quota(salt)

    def cache_request(self, request_id: str) -> dict[str, Any] | None:
        """GET /v1/cache/requests/{id}: a recent request's cache receipt, each missed block's
        reason, and with --explain the evict event of each eviction it names; None: unknown or
        past the receipts' window."""
        receipt = self.cache.request_receipt(request_id)
        if receipt is None or not self.cache.explain:
            return receipt
        ids = {m["eviction_id"] for m in receipt["misses"] if "eviction_id" in m}
        if ids:
            evicts = (e for e in self.events.tail() if e.get("event") == "evict")
            found = {e.get("id"): e for e in evicts if e.get("id") in ids}
            for miss in receipt["misses"]:
                if "eviction_id" in miss:
                    miss["explanation"] = found.get(miss["eviction_id"])
        return receipt

    # ---- metrics -------------------------------------------------------------------------------

    def metrics_registry(self) -> CollectorRegistry:
        """The engine's Prometheus registry (sage:* metrics)."""
        with self.cache.lock:
            self._refresh_gauges()
            self.metrics.set_pool_breakdown(self.cache.usage(), self.cache.tenant_hit_rates())
            self._salt_quota_metrics().set(self.cache.quotas())
            self.metrics.set_cache_accounts(self.cache.cache_accounts())
        return self.metrics.registry

    def _salt_quota_metrics(self) -> SaltQuotaMetrics:
        """The per-salt quota families, registered on the engine's registry at the first scrape."""
        found: SaltQuotaMetrics | None = getattr(self, "_quota_metrics", None)
        if found is None:
            found = self._quota_metrics = SaltQuotaMetrics(self.metrics.registry)
        return found

    def _refresh_gauges(self) -> None:
        """Pool use, the queues and reservations now, and the re-prefills since the last call
        (after each step, and before each scrape; the cache lock is held)."""
        cache = self.cache
        self.metrics.set_usage(cache.allocator.num_used / cache.num_blocks if cache.num_blocks else 0.0)
        self.metrics.set_queue(len(self.scheduler.running), len(self.scheduler.waiting))
        self.metrics.set_reserved(cache.num_reserved_blocks)
        if cache.tiers is not None:
            self.metrics.set_tiers([asdict(t) for t in cache.tiers.stats()])
        compressed = cache.compressed_counters()
        if compressed is not None:
            self.metrics.set_compressed(compressed)
        self.metrics.set_retention(cache.retention_counters())
        reprefills = cache.re_prefill_blocks
        if reprefills > self.loop.re_prefills_counted:
            self.metrics.on_re_prefill(reprefills - self.loop.re_prefills_counted)
            self.loop.re_prefills_counted = reprefills
