"""The records that cross the policy boundary.

`EntryMeta` is what the cache tells a policy about one cached block. The rest are the module
spec's names: `EvictionStrategy`, `EvictionCandidate`, `EvictionPolicyProtocol`, `EvictionResult`
and `EvictionMetrics` (docs/architecture.md, "Policy interface").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, NamedTuple

__all__ = [
    "EntryMeta",
    "EvictionCandidate",
    "EvictionMetrics",
    "EvictionPolicyProtocol",
    "EvictionResult",
    "EvictionStrategy",
    "PolicyEntry",
]


class EvictionStrategy(Enum):
    """The policy families; values are registry names."""

    LRU = "lru"
    MRU = "mru"
    FIFO = "fifo"
    FILO = "filo"
    LFU = "lfu"
    ARC = "arc"
    MQ = "mq"
    REUSE = "reuse"
    SLRU = "slru"
    PRIORITY = "priority"
    QOS_AWARE = "priority"  # the module spec's name for the same policy
    PREDICTIVE = "predictive"
    SLO = "slo"
    S3FIFO = "s3fifo"
    SIEVE = "sieve"
    GDSF = "gdsf"
    BELADY = "belady"
    CUSTOM = "custom"  # third-party policies


@dataclass(slots=True)
class EntryMeta:
    """What a policy knows of one cached block.

    Every field has a default so that a flat simulation can pass `EntryMeta()`.

    Attributes:
        size: Tokens held by the block.
        cost: Recompute cost, e.g. tokens of prefix the block depends on.
        priority: Higher is more important (0 low, 1 normal, 2 high).
        tenant: Isolation or accounting key; `None` for a single tenant.
        created_at: Time the block entered the cache.
        last_access: Time of the latest insert or hit.
        hits: Hits since insert (the insert itself is not a hit).
        estimated_lifetime: Predicted remaining life of the owning sequence, in seconds.
        seq_len: Current length of the owning sequence, in tokens.
        max_len: Maximum length of the owning sequence, in tokens.
        deadline: Absolute time by which the owning request should finish.
        depth: The block's depth in the radix tree (0: a prompt's first block).
        pos_from_end: Blocks from the end of the inserting request's prompt (0: its last
            block; negative: a block of generated output past the prompt).
        prompt_blocks: Blocks of the inserting request's prompt.
        conversation: The conversation (session) of the inserting request; `None` when the
            workload has none.
        prefix_idle: Seconds the inserting request's cached prefix had been idle when the
            request was admitted (how long ago its conversation was last served); `None` when
            nothing of its prompt was cached.

    The last five are the radix features of learned policies (`reuse`); the cache fills them
    when it builds the meta, and a policy that ignores them pays nothing more.
    """

    size: int = 1
    cost: float = 1.0
    priority: int = 0
    tenant: str | None = None
    created_at: float = 0.0
    last_access: float = 0.0
    hits: int = 0
    estimated_lifetime: float | None = None
    seq_len: int = 0
    max_len: int = 0
    deadline: float | None = None
    depth: int = 0
    pos_from_end: int = 0
    prompt_blocks: int = 0
    conversation: str | None = None
    prefix_idle: float | None = None


class PolicyEntry(NamedTuple):
    """One entry as `EvictionPolicy.entries()` hands it to a new policy in a hot swap."""

    key: Hashable
    meta: EntryMeta
    evictable: bool


@dataclass(slots=True)
class EvictionCandidate:
    """A running sequence the scheduler could preempt (module spec)."""

    sequence_id: int
    block_ids: list[int]
    last_access_time: float
    access_count: int
    priority: int
    is_pinned: bool
    estimated_lifetime: float | None = None
    sequence_length: int = 0
    max_length: int = 0


@dataclass(slots=True)
class EvictionResult:
    """The outcome of one eviction decision (module spec); `eviction_time` is in ms."""

    evicted_sequences: list[int]
    freed_blocks: int
    eviction_time: float
    strategy_used: EvictionStrategy


@dataclass(slots=True)
class EvictionMetrics:
    """Eviction counters (module spec); `avg_eviction_time` is in ms.

    The extra fields carry the rest of docs/architecture.md, "Metrics" where the producer knows them.
    """

    total_evictions: int = 0
    avg_eviction_time: float = 0.0
    re_prefill_rate: float = 0.0
    fairness_score: float = 1.0
    strategy: str = ""
    p50_eviction_time: float = 0.0
    p99_eviction_time: float = 0.0
    hit_rate: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


class EvictionPolicyProtocol(ABC):
    """The module spec's sequence-level interface (docs/architecture.md, "The module spec's interface")."""

    @abstractmethod
    def select_victims(self, candidates: list[EvictionCandidate], required_blocks: int) -> list[int]:
        """Choose sequences to evict.

        Args:
            candidates: Sequences that could be evicted; pinned ones never are.
            required_blocks: Blocks to free.

        Returns:
            Sequence ids in policy order, until they free at least `required_blocks`, or every
            unpinned candidate when together they cannot.
        """

    @abstractmethod
    def update_access(self, sequence_id: int) -> None:
        """Record an access to a sequence."""

    @abstractmethod
    def get_metrics(self) -> EvictionMetrics:
        """The policy's eviction counters."""
