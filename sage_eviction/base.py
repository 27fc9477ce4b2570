"""The incremental policy interface (DESIGN 2.1) and the heap base most policies build on.

`EvictionPolicy` owns what every policy needs: the entries' metadata, which entries are
evictable, argument checking with clear errors, the counters behind `get_metrics`, and the
module spec's `select_victims`. A subclass implements five hooks over its own ordering
structure; none of them may pass over all entries.

`HeapPolicy` orders evictable entries by a score in a binary heap with lazy deletion: a stale
heap item is skipped when popped, and the heap is rebuilt when stale items outnumber live ones,
so every operation is O(log n) amortised.
"""

from __future__ import annotations

import heapq
import time
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar, TypeVar

from sage_eviction.errors import DuplicateKeyError, UnknownKeyError
from sage_eviction.metrics import LatencyRecorder, jain_fairness
from sage_eviction.types import (
    EntryMeta,
    EvictionCandidate,
    EvictionMetrics,
    EvictionPolicyProtocol,
    EvictionStrategy,
    PolicyEntry,
)

__all__ = ["EvictionPolicy", "HeapPolicy", "Score"]

Score = Any  # a float, an int or a tuple of them: anything totally ordered
P = TypeVar("P", bound="EvictionPolicy")


class EvictionPolicy(EvictionPolicyProtocol):
    """Orders cached blocks for eviction; the cache tells it every change.

    Subclasses set `name`, `strategy` and `paper`, take their params as keyword arguments of
    `__init__` with defaults and type annotations (the registry reads them), and implement the
    hooks `_on_insert`, `_on_access`, `_on_evictable`, `_on_remove` and `_pop_victim`.

    Attributes:
        name: Registry name.
        strategy: The `EvictionStrategy` member.
        paper: Where the algorithm comes from.
        order_preserving: `from_entries(p.entries())` evicts in the same order as `p`.
        offline: Needs the future; simulation only.
        needs_capacity: `capacity` (in blocks) must be given.
    """

    name: ClassVar[str] = ""
    strategy: ClassVar[EvictionStrategy] = EvictionStrategy.CUSTOM
    paper: ClassVar[str] = ""
    order_preserving: ClassVar[bool] = True
    offline: ClassVar[bool] = False
    needs_capacity: ClassVar[bool] = False

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"capacity={capacity} must be a positive number of blocks")
        if self.needs_capacity and capacity is None:
            raise ValueError(f"policy {self.name!r} needs capacity (in blocks)")
        self.capacity = capacity
        self._meta: dict[Hashable, EntryMeta] = {}
        self._evictable: set[Hashable] = set()
        self._clock = 0  # logical time: one tick per insert or access
        self._evicted: set[Hashable] = set()  # evicted and not yet requested again
        self._evictions = 0
        self._re_prefills = 0
        self._tenants: dict[str | None, list[int]] = {}  # tenant -> [hits, lookups]
        self._select_latency = LatencyRecorder(4096)
        self._sequence_access: dict[int, list[float]] = {}  # sequence id -> [count, last time]

    # ---- the incremental interface -------------------------------------------------------

    def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = True) -> None:
        """A block entered the cache (a miss).

        Args:
            key: The block's content hash.
            meta: What is known of it; `EntryMeta()` when omitted.
            evictable: Whether it may be chosen at once (a block in use is not).

        Raises:
            DuplicateKeyError: The key is already held.
        """
        if key in self._meta:
            raise DuplicateKeyError(f"{self.name}: key {key!r} is already in the policy")
        if meta is None:
            meta = EntryMeta()
        self._clock += 1
        self._meta[key] = meta
        if evictable:
            self._evictable.add(key)
        if key in self._evicted:
            self._evicted.discard(key)
            self._re_prefills += 1
        counts = self._tenants.get(meta.tenant)
        if counts is None:
            self._tenants[meta.tenant] = [0, 1]
        else:
            counts[1] += 1
        self._on_insert(key, meta, evictable)

    def access(self, key: Hashable, now: float | None = None) -> None:
        """A hit on `key` at time `now` (wall time when omitted).

        Raises:
            UnknownKeyError: The key is not held.
        """
        meta = self._meta.get(key)
        if meta is None:
            raise UnknownKeyError(f"{self.name}: access of key {key!r}, which is not in the policy")
        self._clock += 1
        meta.hits += 1
        meta.last_access = time.time() if now is None else now
        counts = self._tenants.get(meta.tenant)
        if counts is None:
            self._tenants[meta.tenant] = [1, 1]
        else:
            counts[0] += 1
            counts[1] += 1
        self._on_access(key, meta)

    def set_evictable(self, key: Hashable, evictable: bool) -> None:
        """The block became evictable (ref count 0, not pinned, no cached child) or stopped being so.

        Raises:
            UnknownKeyError: The key is not held.
        """
        meta = self._meta.get(key)
        if meta is None:
            raise UnknownKeyError(f"{self.name}: set_evictable of key {key!r}, which is not in the policy")
        if evictable:
            if key in self._evictable:
                return
            self._evictable.add(key)
        else:
            if key not in self._evictable:
                return
            self._evictable.discard(key)
        self._on_evictable(key, meta, evictable)

    def remove(self, key: Hashable) -> EntryMeta:
        """The block left the cache for a reason other than eviction; returns its meta.

        Raises:
            UnknownKeyError: The key is not held.
        """
        meta = self._meta.pop(key, None)
        if meta is None:
            raise UnknownKeyError(f"{self.name}: remove of key {key!r}, which is not in the policy")
        was_evictable = key in self._evictable
        self._evictable.discard(key)
        self._on_remove(key, meta, was_evictable)
        return meta

    def prepare_insert(self, key: Hashable) -> None:
        """A cache is about to evict to make room for missed `key`, then insert it.

        A no-op here; policies with ghost lists (ARC, S3-FIFO) override it so that a ghost hit
        adapts them before the evictions, as their papers and libCacheSim order it. Calling it
        is optional: without it the ghost hit is seen at `insert`.
        """

    def evict(self, n: int = 1) -> list[Hashable]:
        """Choose and forget up to `n` evictable victims, in eviction order."""
        victims: list[Hashable] = []
        evictable = self._evictable
        while len(victims) < n and evictable:
            key = self._pop_victim()
            evictable.discard(key)
            del self._meta[key]
            self._evicted.add(key)
            victims.append(key)
        self._evictions += len(victims)
        return victims

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, key: object) -> bool:
        return key in self._meta

    @property
    def num_evictable(self) -> int:
        """How many entries may be chosen now."""
        return len(self._evictable)

    def is_evictable(self, key: Hashable) -> bool:
        """Whether `key` is held and may be chosen."""
        return key in self._evictable

    def meta(self, key: Hashable) -> EntryMeta:
        """The meta of a held key.

        Raises:
            UnknownKeyError: The key is not held.
        """
        meta = self._meta.get(key)
        if meta is None:
            raise UnknownKeyError(f"{self.name}: key {key!r} is not in the policy")
        return meta

    def entries(self) -> list[PolicyEntry]:
        """Every entry, for a hot swap: non-evictable ones first, then the evictable ones in
        eviction order (the next victim first), so that inserting them in this order, each one
        newer than the last, rebuilds the same order in an order-preserving policy."""
        evictable = self._evictable
        held = [PolicyEntry(k, m, False) for k, m in self._meta.items() if k not in evictable]
        held.extend(PolicyEntry(k, self._meta[k], True) for k in self._eviction_order())
        return held

    @classmethod
    def from_entries(cls: type[P], entries: Iterable[PolicyEntry], **params: Any) -> P:
        """A new policy holding `entries` (as returned by `entries()`), built with `params`."""
        policy = cls(**params)
        policy._load(entries)
        return policy

    def _load(self, entries: Iterable[PolicyEntry]) -> None:
        """Insert `entries` in order without counting lookups or re-prefills."""
        for key, meta, evictable in entries:
            if key in self._meta:
                raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
            self._clock += 1
            self._meta[key] = meta
            if evictable:
                self._evictable.add(key)
            self._on_insert(key, meta, evictable)

    # ---- hooks -------------------------------------------------------------------------

    @abstractmethod
    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        """`key` was added to `_meta` (and to `_evictable` when `evictable`)."""

    @abstractmethod
    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        """A hit; `meta.hits` and `meta.last_access` are already updated."""

    @abstractmethod
    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        """The evictable flag changed (`_evictable` is already updated)."""

    @abstractmethod
    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        """`key` left `_meta` and `_evictable`; forget it."""

    @abstractmethod
    def _pop_victim(self) -> Hashable:
        """Unlink and return the next victim; called only while `_evictable` is not empty.

        The base removes the key from `_meta` and `_evictable` afterwards.
        """

    @abstractmethod
    def _eviction_order(self) -> list[Hashable]:
        """The evictable keys, next victim first (for `entries()`; may be O(n log n))."""

    # ---- the module spec's interface (DESIGN 2.2) ----------------------------------------

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """Sort key of a candidate sequence; smaller is evicted first. LRU unless overridden."""
        return candidate.last_access_time

    def select_victims(self, candidates: list[EvictionCandidate], required_blocks: int) -> list[int]:
        """Pick sequences in policy order until they free `required_blocks` blocks.

        Pinned candidates are never returned; when the unpinned ones together free fewer than
        `required_blocks`, all of them are returned.
        """
        start = time.perf_counter()
        victims = select_in_order(candidates, required_blocks, self.candidate_key)
        self._select_latency.record(time.perf_counter() - start)
        return victims

    def update_access(self, sequence_id: int) -> None:
        """Record an access to a sequence (count and wall time)."""
        record = self._sequence_access.get(sequence_id)
        if record is None:
            self._sequence_access[sequence_id] = [1.0, time.time()]
        else:
            record[0] += 1.0
            record[1] = time.time()

    def get_metrics(self) -> EvictionMetrics:
        """Evictions, `select_victims` latency (ms), re-prefill rate and Jain's fairness over
        the per-tenant hit rates this policy has seen (inserts are misses, accesses hits)."""
        rates = [h / n for h, n in self._tenants.values() if n]
        lookups = sum(n for _, n in self._tenants.values())
        hits = sum(h for h, _ in self._tenants.values())
        p50, p99 = self._select_latency.quantiles(0.5, 0.99)
        return EvictionMetrics(
            total_evictions=self._evictions,
            avg_eviction_time=self._select_latency.mean * 1e3,
            re_prefill_rate=self._re_prefills / self._evictions if self._evictions else 0.0,
            fairness_score=jain_fairness(rates),
            strategy=self.name.upper(),
            p50_eviction_time=p50 * 1e3,
            p99_eviction_time=p99 * 1e3,
            hit_rate=hits / lookups if lookups else 0.0,
            extra={"select_victims_calls": self._select_latency.count},
        )

    def describe(self) -> dict[str, Any]:
        """Name, params and sizes, for stats and logs."""
        return {
            "name": self.name,
            "capacity": self.capacity,
            "entries": len(self),
            "evictable": self.num_evictable,
        }


def select_in_order(
    candidates: list[EvictionCandidate], required_blocks: int, key: Callable[[EvictionCandidate], Any]
) -> list[int]:
    """Greedy victim choice shared by every policy: unpinned candidates by `key` (ties by
    position), until enough blocks are freed.

    Only the few candidates that can be chosen are sorted. A sorted sample of about 64 keys
    gives a threshold below which the candidates should hold twice the blocks needed; one
    pass of comparisons keeps those, and the rest are sorted only when they turn out to be
    needed. Besides the key calls this costs about one comparison per candidate, against
    about two, and a tuple each, for a heap of all of them.
    """
    if required_blocks <= 0:
        return []
    keys = list(map(key, candidates))
    by_key = keys.__getitem__
    n = len(keys)
    threshold: Any = None
    order: list[int] | None = None  # candidate positions, in the order they are taken
    if n > 128:
        stride = n // 64
        sampled_blocks = 0
        for i in sorted(range(0, n, stride), key=by_key):
            if not candidates[i].is_pinned:
                sampled_blocks += len(candidates[i].block_ids) * stride
                if sampled_blocks >= 2 * required_blocks:
                    threshold = keys[i]
                    order = [j for j, k in enumerate(keys) if k <= threshold]
                    break
    if order is None:
        order = list(range(n))
    victims: list[int] = []
    freed = 0

    def take(positions: list[int]) -> bool:
        nonlocal freed
        positions.sort(key=by_key)  # stable: equal keys keep their positions' order
        for i in positions:
            candidate = candidates[i]
            if not candidate.is_pinned:
                victims.append(candidate.sequence_id)
                freed += len(candidate.block_ids)
                if freed >= required_blocks:
                    return True
        return False

    if not take(order) and len(order) < n:  # the sample misled: take the rest too
        take([j for j, k in enumerate(keys) if not k <= threshold])
    return victims


class HeapPolicy(EvictionPolicy):
    """A policy that evicts the evictable entry of smallest `_score`.

    The heap holds `(score, push number, key)` items; `_live[key]` is the item that currently
    stands for an evictable key, and an item popped that is not its key's live item is stale.
    The push number is unique, so keys are never compared. Subclasses implement `_score`; set
    `rescore_on_access = False` when a hit does not change the order (FIFO).
    """

    rescore_on_access: ClassVar[bool] = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._heap: list[tuple[Score, int, Hashable]] = []
        self._live: dict[Hashable, tuple[Score, int, Hashable]] = {}
        self._tick: dict[Hashable, int] = {}  # key -> tick of its latest insert or access
        self._pushes = 0  # unique tie-breaker of heap items

    @abstractmethod
    def _score(self, key: Hashable, meta: EntryMeta) -> Score:
        """Smaller is evicted sooner; `self._clock` and `self._tick[key]` are current."""

    def _push(self, key: Hashable, meta: EntryMeta) -> None:
        self._pushes += 1
        item = (self._score(key, meta), self._pushes, key)
        self._live[key] = item
        heap = self._heap
        heapq.heappush(heap, item)
        if len(heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._tick[key] = self._clock
        if evictable:
            self._push(key, meta)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._tick[key] = self._clock
        if self.rescore_on_access and key in self._live:
            self._push(key, meta)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if evictable:
            self._push(key, meta)
        else:
            del self._live[key]

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._tick[key]
        if was_evictable:
            del self._live[key]

    def _pop_victim(self) -> Hashable:
        heap = self._heap
        live = self._live
        pop = heapq.heappop
        while True:
            item = pop(heap)
            key = item[2]
            if live.get(key) is item:
                del live[key]
                del self._tick[key]
                self._on_victim(key, item[0])
                return key

    def _on_victim(self, key: Hashable, score: Score) -> None:
        """Called with each victim's score (GDSF inflates its clock with it)."""

    def _eviction_order(self) -> list[Hashable]:
        return [item[2] for item in sorted(self._live.values())]

    def _load(self, entries: Iterable[PolicyEntry]) -> None:
        # Build the heap once instead of pushing n times.
        live = self._live
        tick = self._tick
        meta_of = self._meta
        evictable_set = self._evictable
        for key, meta, evictable in entries:
            if key in meta_of:
                raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
            self._clock += 1
            meta_of[key] = meta
            tick[key] = self._clock
            if evictable:
                evictable_set.add(key)
                self._pushes += 1
                live[key] = (self._score(key, meta), self._pushes, key)
        self._heap = list(live.values())
        heapq.heapify(self._heap)
