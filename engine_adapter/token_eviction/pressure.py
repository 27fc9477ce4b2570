"""Memory pressure: the spec's ``SystemMonitor`` and ``CacheManager.maybe_evict`` for tokens.

After each generation step the scheduler calls `TokenCacheManager.maybe_evict` with its
decoding sequences; when the monitor reports less than `threshold_bytes` available, sequences
are compressed to `target_ratio` of their tokens, longest first, until memory is back above the
threshold. The engine's monitor is the least of the pool's free and reclaimable blocks and the
device's memory (``/proc/meminfo`` MemAvailable on CPU, ``torch.cuda.mem_get_info`` on CUDA).

A sequence is compressed again only once it has grown back to the length it was compressed
from: a pool smaller than the threshold would otherwise shrink the same sequence every step.

A policy that scores by attention (snapkv, h2o, tova) but finds none for a sequence (one that
started before the policy was swapped in) keeps its newest tokens instead: each such
compression is logged as a warning with the reason, counted by policy in
`TokenEvictionStats.attention_fallbacks` (``/v1/eviction/token``; ``/metrics`` counts the
events' ``fallback``), and its ``compress`` event carries the reason in ``fallback``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
import torch

from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.token_eviction import DEFAULT_TARGET_RATIO
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.sequence_kv import CompactionRefused, SequenceKV

__all__ = [
    "CudaMonitor",
    "EvictionResult",
    "LeastMonitor",
    "MemoryStats",
    "PoolMonitor",
    "ProcMeminfoMonitor",
    "SystemMonitor",
    "TokenCacheManager",
    "TokenEvictionStats",
]

log = structlog.get_logger("sage.token_eviction")


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Memory a monitor sees, in bytes."""

    available: int
    total: int
    source: str


class SystemMonitor(Protocol):
    """The spec's ``SystemMonitor``: ``mem_stats()``."""

    def mem_stats(self) -> MemoryStats: ...


class ProcMeminfoMonitor:
    """CPU memory: ``MemAvailable`` and ``MemTotal`` of ``/proc/meminfo``."""

    def __init__(self, path: str = "/proc/meminfo") -> None:
        self.path = path

    def mem_stats(self) -> MemoryStats:
        fields: dict[str, int] = {}
        with open(self.path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemAvailable", "MemTotal"):
                    fields[name] = int(rest.split()[0]) * 1024  # kB
        return MemoryStats(fields.get("MemAvailable", 0), fields.get("MemTotal", 0), "meminfo")


class CudaMonitor:
    """A CUDA device's free and total memory (``torch.cuda.mem_get_info``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mem_stats(self) -> MemoryStats:
        free, total = torch.cuda.mem_get_info(self.device)
        return MemoryStats(int(free), int(total), "cuda")


class PoolMonitor:
    """The KV pool: its free and reclaimable blocks (what a sequence could still grow into)."""

    def __init__(self, available_blocks: Callable[[], int], num_blocks: int, bytes_per_block: int) -> None:
        self.available_blocks = available_blocks
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block

    def mem_stats(self) -> MemoryStats:
        return MemoryStats(
            self.available_blocks() * self.bytes_per_block, self.num_blocks * self.bytes_per_block, "pool"
        )


class LeastMonitor:
    """The monitor with the least memory available among several."""

    def __init__(self, *monitors: SystemMonitor) -> None:
        if not monitors:
            raise ValueError("LeastMonitor needs at least one monitor")
        self.monitors = monitors

    def mem_stats(self) -> MemoryStats:
        return min((m.mem_stats() for m in self.monitors), key=lambda s: s.available)


@dataclass(slots=True)
class EvictionResult:
    """The spec's ``EvictionResult`` of one `maybe_evict`.

    Attributes:
        evicted: Whether any sequence was compressed.
        tokens_removed: Tokens removed over all sequences (per layer and KV head).
        new_pos: Length of the last sequence compressed (0 if none).
        sequences: Ids of the sequences compressed, in order.
        available: Bytes available before, per the monitor.
    """

    evicted: bool = False
    tokens_removed: int = 0
    new_pos: int = 0
    sequences: list[int] = field(default_factory=list)
    available: int = 0


@dataclass(slots=True)
class TokenEvictionStats:
    """Totals of token-level eviction, by policy (``GET /v1/eviction/stats``, ``token_eviction``)."""

    compressions: int = 0
    tokens_evicted: dict[str, int] = field(default_factory=dict)
    bytes_freed: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    compress_s: float = 0.0
    attention_fallbacks: dict[str, int] = field(default_factory=dict)

    def add(
        self, policy: str, reason: str, tokens: int, nbytes: int, seconds: float, *, fallback: bool = False
    ) -> None:
        self.compressions += 1
        self.tokens_evicted[policy] = self.tokens_evicted.get(policy, 0) + tokens
        self.bytes_freed[policy] = self.bytes_freed.get(policy, 0) + nbytes
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        self.compress_s += seconds
        if fallback:  # scored by recency: the policy found no attention to score by
            self.attention_fallbacks[policy] = self.attention_fallbacks.get(policy, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "compressions": self.compressions,
            "tokens_evicted": dict(self.tokens_evicted),
            "bytes_freed": dict(self.bytes_freed),
            "tokens_evicted_total": sum(self.tokens_evicted.values()),
            "bytes_freed_total": sum(self.bytes_freed.values()),
            "by_reason": dict(self.by_reason),
            "compress_s": round(self.compress_s, 6),
            "attention_fallbacks": dict(self.attention_fallbacks),
            "attention_fallbacks_total": sum(self.attention_fallbacks.values()),
        }


class TokenCacheManager:
    """The spec's ``CacheManager`` for token-level eviction: policy + monitor + threshold.

    Args:
        policy: The engine's token policy (hot-swappable: `policy` is a plain attribute).
        monitor: Where available memory is read.
        threshold_bytes: Compress when less than this is available.
        target_ratio: Fraction of its tokens a compressed sequence keeps.
        window: ``--eviction-window``, for policies built by name on a swap.
        events: Where ``compress`` events go.
    """

    def __init__(
        self,
        policy: TokenEvictionPolicy,
        monitor: SystemMonitor,
        threshold_bytes: int,
        target_ratio: float = DEFAULT_TARGET_RATIO,
        *,
        window: int = 1024,
        events: EvictionEventLog | None = None,
    ) -> None:
        if not 0.0 < target_ratio < 1.0:
            raise ValueError(f"target_ratio {target_ratio!r} must be in (0, 1)")
        if threshold_bytes < 0:
            raise ValueError("threshold_bytes must be >= 0")
        self.policy = policy
        self.monitor = monitor
        self.threshold_bytes = threshold_bytes
        self.target_ratio = target_ratio
        self.window = window
        self.events = events
        self.stats = TokenEvictionStats()
        self._compressed_from: dict[int, int] = {}  # sequence -> length it was last compressed from

    def target_len(self, policy: TokenEvictionPolicy, length: int) -> int:
        """What pressure shrinks a sequence of `length` tokens to under `policy`."""
        return policy.target_len(length, max(1, int(length * self.target_ratio)))

    def eligible(
        self, sequence_id: int, cache: SequenceKV, policy: TokenEvictionPolicy, available: int
    ) -> bool:
        """Whether pressure may compress this sequence now."""
        if cache.length < self._compressed_from.get(sequence_id, 0):
            return False  # not grown back since its last compression
        if self.target_len(policy, cache.length) >= cache.length:
            return False
        return policy.should_evict(cache, available)

    def compress(
        self,
        sequence_id: int,
        cache: SequenceKV,
        target_len: int,
        *,
        policy: TokenEvictionPolicy | None = None,
        reason: str,
        ratio: float | None = None,
    ) -> int:
        """Compress one sequence to `target_len` tokens, counting it; returns tokens removed.
        `ratio`: the compression ratio a request asked for (the presses that weigh by it)."""
        policy = policy or self.policy
        before, blocks_before = cache.length, cache.num_blocks()
        fallback = policy.attention_missing(cache)  # read before the compaction changes it
        t0 = time.perf_counter()
        removed = policy.evict(cache, target_len, ratio=ratio)
        seconds = time.perf_counter() - t0
        if removed <= 0:
            return 0
        self._compressed_from[sequence_id] = before
        blocks_freed = blocks_before - cache.num_blocks()
        nbytes = blocks_freed * cache.pool.bytes_per_block
        self.stats.add(policy.name(), reason, removed, nbytes, seconds, fallback=fallback is not None)
        if fallback is not None:
            log.warning(
                "token policy fell back to recency",
                policy=policy.name(),
                sequence_id=sequence_id,
                reason=fallback,
            )
        if self.events is not None:
            self.events.compress(
                sequence_id=sequence_id,
                policy=policy.name(),
                reason=reason,
                tokens_before=before,
                tokens_after=cache.length,
                blocks_freed=blocks_freed,
                bytes_freed=nbytes,
                duration_us=round(seconds * 1e6, 1),
                fallback=fallback,
            )
        return removed

    def maybe_evict(
        self,
        caches: Sequence[tuple[int, SequenceKV]],
        policy_for: Callable[[int], TokenEvictionPolicy | None] | None = None,
        *,
        reason: str = "pressure",
        force: bool = False,
    ) -> EvictionResult:
        """Compress sequences, longest first, while available memory is under the threshold.

        Args:
            caches: ``(sequence_id, cache)`` of the sequences that may be compressed now.
            policy_for: A sequence's own policy (a request's ``kv_compression``), else the
                engine's.
            force: Compress one eligible sequence whatever the monitor says (the scheduler
                is about to preempt for want of blocks).

        A sequence whose compaction is refused (`CompactionRefused`) is skipped.
        """
        stats = self.monitor.mem_stats()
        result = EvictionResult(available=stats.available)
        if not force and stats.available >= self.threshold_bytes:
            return result
        available = stats.available
        for sequence_id, cache in sorted(caches, key=lambda item: -item[1].length):
            policy = (policy_for(sequence_id) if policy_for else None) or self.policy
            if not self.eligible(sequence_id, cache, policy, available):
                continue
            try:
                removed = self.compress(
                    sequence_id, cache, self.target_len(policy, cache.length), policy=policy, reason=reason
                )
            except CompactionRefused:
                continue  # e.g. it holds mostly shared prefix blocks: its copy would cost more
            if removed <= 0:
                continue
            result.evicted = True
            result.tokens_removed += removed
            result.new_pos = cache.length
            result.sequences.append(sequence_id)
            if force:
                break
            available = self.monitor.mem_stats().available
            if available >= self.threshold_bytes:
                break
        return result

    def forget(self, sequence_id: int) -> None:
        """The sequence left (finished or preempted): drop what was kept about it."""
        self._compressed_from.pop(sequence_id, None)
