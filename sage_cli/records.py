"""Typed records of the control API's answers, for Python callers of `ControlClient`.

One record per object the API documents (docs/openapi.json's ``components.schemas``, which
tests/test_client_records.py keeps equal to these fields): the fields the schema lists, typed,
and ``raw``, the answer as the engine sent it (the stats carry more than the schema promises,
and ``--json`` prints it as is). `ControlClient`'s typed methods (``stats``, ``policies``,
``info``, ``usage``, ``token_policy``, ``swap_policy``) return them; its JSON methods return
the answers unparsed.

```python
with ControlClient() as engine:  # the default engine's socket
    stats = engine.stats()
    print(stats.policy, f"{stats.hit_rate:.1%}", [t.tier for t in stats.tiers])
```
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "CacheUsage",
    "EngineInfo",
    "EvictionStats",
    "Policies",
    "Policy",
    "PolicySwap",
    "RecordError",
    "TierStats",
    "TokenEviction",
]

JSONObject = dict[str, Any]
R = TypeVar("R", bound="_Record")


class RecordError(ValueError):
    """An answer lacks a field its schema requires (the engine and the client disagree)."""


@dataclass(frozen=True, kw_only=True)
class _Record:
    """A record parsed from an answer; `required` lists the schema's required fields."""

    required: ClassVar[tuple[str, ...]] = ()
    raw: JSONObject = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls: type[R], answer: JSONObject) -> R:
        """The record of `answer` (unknown fields stay in ``raw`` only).

        Raises:
            RecordError: A required field is missing.
        """
        missing = [name for name in cls.required if name not in answer]
        if missing:
            raise RecordError(f"{cls.__name__}: the answer lacks {', '.join(missing)}")
        names = {f.name for f in dataclasses.fields(cls)} - {"raw"}
        values = {name: cls._convert(name, answer[name]) for name in names if name in answer}
        return cls(**values, raw=answer)

    @classmethod
    def _convert(cls, name: str, value: Any) -> Any:
        """A nested record's field as its record (overridden where there is one)."""
        return value


@dataclass(frozen=True, kw_only=True)
class TierStats(_Record):
    """One KV tier below the device pool (``host`` or ``disk``): its size, traffic and loads."""

    required: ClassVar[tuple[str, ...]] = (
        *("blocks_moved_in", "blocks_moved_out", "capacity_blocks", "demotions", "drops", "hits"),
        *("load_time_p50_ms", "load_time_p99_ms", "loads", "policy", "policy_swaps", "prefetch_hits"),
        *("prefetched_blocks", "promotions", "tier", "used_blocks"),
    )
    tier: str
    policy: str
    capacity_blocks: int
    used_blocks: int
    hits: int
    loads: int
    promotions: int
    demotions: int
    drops: int
    blocks_moved_in: int
    blocks_moved_out: int
    load_time_p50_ms: float
    load_time_p99_ms: float
    policy_swaps: int
    prefetch_hits: int
    prefetched_blocks: int


@dataclass(frozen=True, kw_only=True)
class TokenEviction(_Record):
    """The token-level policy (``GET /v1/eviction/token``), its settings and totals."""

    required: ClassVar[tuple[str, ...]] = (
        *("attention_fallbacks", "attention_fallbacks_total", "available_bytes", "by_reason"),
        *("bytes_freed", "bytes_freed_total", "compress_s", "compressions", "eviction_window"),
        *("memory_threshold_bytes", "params", "policy", "target_ratio", "tokens_evicted"),
        "tokens_evicted_total",
    )
    policy: str
    params: JSONObject
    target_ratio: float
    eviction_window: int
    memory_threshold_bytes: int
    available_bytes: int
    compressions: int
    compress_s: float
    tokens_evicted: JSONObject
    tokens_evicted_total: int
    bytes_freed: JSONObject
    bytes_freed_total: int
    by_reason: JSONObject
    attention_fallbacks: JSONObject
    attention_fallbacks_total: int


@dataclass(frozen=True, kw_only=True)
class EvictionStats(_Record):
    """``GET /v1/eviction/stats``: the cache's figures (docs/architecture.md, "Metrics")."""

    required: ClassVar[tuple[str, ...]] = (
        *("evictions_by_policy", "evictions_by_reason", "free_blocks", "hit_rate", "memory_utilization"),
        *("policy", "policy_swaps", "preemptions", "re_prefill_rate", "total_blocks", "total_evictions"),
        "used_blocks",
    )
    policy: str
    hit_rate: float
    re_prefill_rate: float
    memory_utilization: float
    total_blocks: int
    used_blocks: int
    free_blocks: int
    total_evictions: int
    evictions_by_policy: dict[str, int]
    evictions_by_reason: dict[str, int]
    preemptions: int
    policy_swaps: int
    reserved_blocks: int | None = None
    prefetched_blocks: int | None = None
    prefetch_hits: int | None = None
    missed_blocks: int | None = None
    ghost_hits: int | None = None
    ghost_capacity: int | None = None
    regrets: int | None = None
    regret_ratio: float | None = None
    window_regret_ratio: float | None = None
    re_prefill_window: int | None = None
    thrashing: bool | None = None
    thrashing_threshold: float | None = None
    tiers: list[TierStats] = field(default_factory=list)
    token_eviction: TokenEviction | None = None
    age_histograms: list[JSONObject] = field(default_factory=list)
    colocation: JSONObject | None = None
    retained_blocks: int | None = None
    retention_granted_blocks: int | None = None
    retention_refused_blocks: int | None = None
    retention_broken_blocks: int | None = None
    retention_expired_blocks: int | None = None
    cache_accounts: list[JSONObject] = field(default_factory=list)

    @classmethod
    def _convert(cls, name: str, value: Any) -> Any:
        if name == "tiers":
            return [TierStats.from_json(tier) for tier in value]
        if name == "token_eviction" and value is not None:
            return TokenEviction.from_json(value)
        return value


@dataclass(frozen=True, kw_only=True)
class Policy(_Record):
    """One policy of the registry (``GET /v1/eviction/policies``)."""

    required: ClassVar[tuple[str, ...]] = ("name", "offline", "params", "strategy")
    name: str
    strategy: str
    params: JSONObject
    offline: bool
    idea: str | None = None
    paper: str | None = None


@dataclass(frozen=True, kw_only=True)
class Policies(_Record):
    """``GET /v1/eviction/policies``: the active policy's name and every policy."""

    required: ClassVar[tuple[str, ...]] = ("active", "policies")
    active: str
    policies: list[Policy]

    @classmethod
    def _convert(cls, name: str, value: Any) -> Any:
        return [Policy.from_json(p) for p in value] if name == "policies" else value


@dataclass(frozen=True, kw_only=True)
class PolicySwap(_Record):
    """``PUT /v1/eviction/policy``: a hot swap, from `old` to `new`, and its pause."""

    required: ClassVar[tuple[str, ...]] = ("entries", "new", "old", "swap_time_s")
    old: JSONObject  # {"name", "params"}
    new: JSONObject
    swap_time_s: float
    entries: int  # cached entries the new policy took over


@dataclass(frozen=True, kw_only=True)
class CacheUsage(_Record):
    """``GET /v1/cache/usage``: the pool by tenant and class, the queue and the batch limit."""

    required: ClassVar[tuple[str, ...]] = (
        *("adaptive_batch", "by_class", "by_tenant", "cached_blocks", "evictable_blocks"),
        *("explain_evictions", "free_blocks", "max_running_batch", "num_blocks", "pinned_blocks"),
        *("policy", "reserved_blocks", "running", "used_blocks", "waiting"),
    )
    policy: str
    num_blocks: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    evictable_blocks: int
    pinned_blocks: int
    reserved_blocks: int
    running: int
    waiting: int
    max_running_batch: int
    adaptive_batch: bool
    explain_evictions: bool
    by_tenant: JSONObject
    by_class: JSONObject


@dataclass(frozen=True, kw_only=True)
class EngineInfo(_Record):
    """``GET /v1/engine``: the engine's name, model, process, pool and requests."""

    required: ClassVar[tuple[str, ...]] = (
        *("block_size", "device", "model", "name", "num_blocks", "pid", "policy", "requests"),
    )
    name: str
    pid: int
    model: str | None
    device: str
    num_blocks: int
    block_size: int
    policy: JSONObject
    requests: JSONObject
    dtype: str | None = None
    kv_dtype: str | None = None
    quantization: str | None = None
    packed_weights: str | None = None
    batch_invariant: str | None = None
    batch_invariant_kernels: str | None = None
    implementation: str | None = None
    compile: str | None = None
    socket: str | None = None
    started_at: float | None = None
    uptime_s: float | None = None
    threads: JSONObject | None = None
    loop_error: str | None = None
