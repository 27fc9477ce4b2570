"""The incremental policy interface and the heap base most policies build on.

The contract is drawn in docs/architecture.md, "Policy interface".

`EvictionPolicy` owns what every policy needs: the entries' metadata, which entries are
evictable, argument checking with clear errors, the counters behind `get_metrics`, and the
module spec's `select_victims`. A subclass implements five hooks over its own ordering
structure; none of them may pass over all entries.

The bases most policies build on live beside it: `sage_eviction.heap` (scores in a lazy heap)
and `sage_eviction.recency` (O(1) recency queues, per level).
"""

from __future__ import annotations

import operator
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from itertools import compress, filterfalse, repeat
from typing import Any, ClassVar, TypeVar

from sage_eviction import native
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

__all__ = [
    "seen_once_first_key",
    "seen_once_first_up_to",
    "EvictionPolicy",
    "Score",
]

Score = Any  # a float, an int or a tuple of them: anything totally ordered
P = TypeVar("P", bound="EvictionPolicy")

_new_tuple: Callable[..., PolicyEntry] = tuple.__new__  # C-level PolicyEntry construction
_KEY = operator.itemgetter(0)
_META = operator.itemgetter(1)
_FLAG = operator.itemgetter(2)


def _entries_of(keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> list[PolicyEntry]:
    """`[PolicyEntry(*e) for e in zip(keys, metas, flags)]`, built in C: a NamedTuple's own
    `__new__` is a Python function, twice as slow over a million entries."""
    return list(map(_new_tuple, repeat(PolicyEntry), zip(keys, metas, flags, strict=True)))


def _run(calls: Iterable[object]) -> None:
    """Exhaust an iterator of calls made in C (`map(...)`) for their side effects."""
    deque(calls, maxlen=0)


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
        # Whether this policy uses the compiled core (its score heap, its select_victims) or the
        # pure-Python code; chosen once, here (sage_eviction/native.py). A flag, not the module,
        # so that a policy still pickles and deep-copies.
        self._compiled = native.core() is not None

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
        newer than the last, rebuilds the same order in an order-preserving policy.

        Built with C-level iteration only (a hot swap at 1e6 blocks has 0.5 s in all)."""
        return _entries_of(*self._own_columns())

    def entry_columns(self) -> tuple[list[Hashable], list[EntryMeta], list[bool]]:
        """`entries()` as three lists in the same order: keys, metas and evictable flags.

        What `CacheManager.swap_policy` hands over: no `PolicyEntry` is built per entry (a
        third of a swap at 1e6 blocks). A subclass that overrides `entries()` gets its columns.
        """
        if type(self).entries is not EvictionPolicy.entries:
            items = self.entries()
            return list(map(_KEY, items)), list(map(_META, items)), list(map(_FLAG, items))
        return self._own_columns()

    def _own_columns(self) -> tuple[list[Hashable], list[EntryMeta], list[bool]]:
        meta = self._meta
        evictable = self._evictable
        if not evictable:
            return list(meta), list(meta.values()), [False] * len(meta)
        keys: list[Hashable] = (
            list(filterfalse(evictable.__contains__, meta)) if len(evictable) < len(meta) else []
        )
        flags = [False] * len(keys)
        keys.extend(self._eviction_order())
        flags.extend(repeat(True, len(keys) - len(flags)))
        return keys, list(map(meta.__getitem__, keys)), flags

    @classmethod
    def from_entries(cls: type[P], entries: Iterable[PolicyEntry], **params: Any) -> P:
        """A new policy holding `entries` (as returned by `entries()`), built with `params`."""
        policy = cls(**params)
        policy._load(entries)
        return policy

    @classmethod
    def from_entry_columns(
        cls: type[P], keys: list[Hashable], metas: list[EntryMeta], flags: list[bool], **params: Any
    ) -> P:
        """`from_entries` of the entries `entry_columns()` returned as these three lists."""
        if cls.from_entries.__func__ is not EvictionPolicy.from_entries.__func__:  # type: ignore[attr-defined]
            return cls.from_entries(_entries_of(keys, metas, flags), **params)
        policy = cls(**params)
        if type(policy)._load is EvictionPolicy._load and policy._load_bulk(keys, metas, flags):
            return policy
        policy._load(_entries_of(keys, metas, flags))
        return policy

    def _load(self, entries: Iterable[PolicyEntry]) -> None:
        """Insert `entries` in order without counting lookups or re-prefills.

        Through `_load_bulk` when the class has one that applies, else `_load_each`."""
        if type(self)._load_bulk is EvictionPolicy._load_bulk:
            self._load_each(entries)
            return
        items = entries if isinstance(entries, list) else list(entries)
        keys: list[Hashable] = list(map(_KEY, items))
        metas: list[EntryMeta] = list(map(_META, items))
        flags: list[bool] = list(map(_FLAG, items))
        if not self._load_bulk(keys, metas, flags):
            self._load_each(items)

    def _load_each(self, entries: Iterable[PolicyEntry]) -> None:
        """`_load` one entry at a time through `_on_insert`."""
        for key, meta, evictable in entries:
            if key in self._meta:
                raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
            self._clock += 1
            self._meta[key] = meta
            if evictable:
                self._evictable.add(key)
            self._on_insert(key, meta, evictable)

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        """`_load_each` of these entries built at once from C-level operations (dict and set
        `update` over `zip`, `heapify`), giving exactly the state the one-by-one inserts give
        (tests/test_bulk_load.py checks it); False, having changed nothing, when it does not
        apply (a policy that is not empty, a subclass that hooks inserts). None here."""
        return False

    def _inserts_like(self, owner: type[Any]) -> bool:
        """Whether this object's `_on_insert` is `owner`'s, so that `owner`'s `_load_bulk`
        (which does not call it) builds what the inserts would: a subclass that hooks inserts
        gets the one-by-one load."""
        return type(self)._on_insert is owner._on_insert

    def _add_columns(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> int:
        """The bookkeeping `_load_each` does, for all entries at once, into an empty policy.

        Adds the entries to `_meta` and `_evictable` and advances the clock by one per entry.
        Returns the tick of the first: entry i gets tick `first + i`, the clock its
        `_on_insert` would have seen.

        Raises:
            DuplicateKeyError: A key appears twice (as `_load_each` raises it).
        """
        meta_of = self._meta
        meta_of.update(zip(keys, metas, strict=True))
        if len(meta_of) != len(keys):
            seen: set[Hashable] = set()
            for key in keys:
                if key in seen:
                    raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
                seen.add(key)
        self._evictable.update(compress(keys, flags))
        first = self._clock + 1
        self._clock += len(keys)
        return first

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

    # ---- the module spec's interface (docs/architecture.md, "The module spec's interface") ----

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """Sort key of a candidate sequence; smaller is evicted first. LRU unless overridden."""
        return candidate.last_access_time

    candidate_order: ClassVar[tuple[str, tuple[float, ...]] | None] = ("lru", ())
    """The compiled core's copy of `candidate_key`: its name in sage_eviction/_core.pyx and the
    constants it reads, or None for none. Used only when the class that defines
    `candidate_key` defines this too (a subclass overriding the key alone is not misread);
    tests/test_native_core.py holds each copy to its `candidate_key`."""

    @staticmethod
    def candidates_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
        """The candidates whose `candidate_key` is <= `bound`, in list order, in one list
        comprehension (no call per candidate). A class that overrides `candidate_key` must
        override this too, or `select_victims` ignores it and calls `candidate_key` on each."""
        return [c for c in candidates if c.last_access_time <= bound]

    def select_victims(self, candidates: list[EvictionCandidate], required_blocks: int) -> list[int]:
        """Pick sequences in policy order until they free `required_blocks` blocks.

        Pinned candidates are never returned; when the unpinned ones together free fewer than
        `required_blocks`, all of them are returned.
        """
        start = time.perf_counter()
        victims: list[int] | None = None
        if self._compiled and type(candidates) is list:
            order = _order_of(type(self))
            core = native.load(native.CORE)
            if order is not None and core is not None:  # None from the core: only Python orders it
                victims = core.select_victims(candidates, required_blocks, *order)
        if victims is None:
            victims = select_in_order(candidates, required_blocks, self.candidate_key, _up_to_of(type(self)))
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

    # ---- explanations (docs/architecture.md, "Explaining an eviction") -------------------

    explains_by: ClassVar[str] = "its position in the eviction order"
    """What the policy ranks by, in words, for one-line explanations."""

    def rank(self, key: Hashable) -> tuple[Any, ...] | None:
        """The sort key the policy evicts by (smaller first), or None when the order is not one
        fixed key per entry (adaptive queues: ARC, S3-FIFO, SIEVE, SLRU, MQ).

        For an evictable entry it is the key the policy orders it by now; for one that is not
        evictable, the key it would have if it were made evictable now (so that a skipped,
        referenced block can be compared with the victim).

        Raises:
            UnknownKeyError: The key is not held.
        """
        self.meta(key)
        return None

    def explain(self, key: Hashable) -> dict[str, object]:
        """Why `key` stands where it does: the values the policy ranks it by.

        Always: ``policy``, ``evictable``, ``hits``, ``last_access``, ``priority``, ``tenant``;
        ``rank`` when `rank` gives one (sorting the evictable keys by it gives the eviction
        order); else ``order``, the entry's place in the eviction order (0: the next victim;
        O(n log n)); and the policy's own values (`_explain_values`).

        Raises:
            UnknownKeyError: The key is not held.
        """
        return self._explanation(key, None)

    def explain_next(self, n: int) -> list[tuple[Hashable, dict[str, object]]]:
        """The next `n` victims in eviction order, each with its explanation, without evicting.

        A subclass adds its values by overriding `_explain_values`; one that overrides
        `explain` itself (it should start from `super().explain(key)`) is called per key."""
        keys = self.peek(n)
        if type(self).explain is not EvictionPolicy.explain:
            return [(key, self.explain(key)) for key in keys]
        return [(key, self._explanation(key, i)) for i, key in enumerate(keys)]

    def peek(self, n: int) -> list[Hashable]:
        """The next `n` victims, in the order `evict` would take them if nothing changed."""
        if n <= 0:
            return []
        return self._eviction_order()[:n]

    def _explanation(self, key: Hashable, order: int | None) -> dict[str, object]:
        meta = self.meta(key)
        evictable = key in self._evictable
        out: dict[str, object] = {
            "policy": self.name,
            "evictable": evictable,
            "hits": meta.hits,
            "last_access": meta.last_access,
            "priority": meta.priority,
            "tenant": meta.tenant,
        }
        rank = self.rank(key)
        if rank is not None:
            out["rank"] = rank
        elif evictable:
            out["order"] = self._eviction_order().index(key) if order is None else order
        out.update(self._explain_values(key, meta))
        return out

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        """The policy's own values for a held key (its queue, score parts); none by default."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Name, params and sizes, for stats and logs."""
        return {
            "name": self.name,
            "capacity": self.capacity,
            "entries": len(self),
            "evictable": self.num_evictable,
        }


_UP_TO: dict[
    type[EvictionPolicy], Callable[[list[EvictionCandidate], Any], list[EvictionCandidate]] | None
] = {}


def seen_once_first_key(candidate: EvictionCandidate) -> tuple[bool, float]:
    """Sequences seen once before sequences seen again, least recent first within each: the
    sequence-level order of the policies that split entries by reuse (ARC's T1/T2, SIEVE's
    visited bit, SLRU's segments) when the candidates carry only counts and times."""
    return (candidate.access_count > 1, candidate.last_access_time)


def seen_once_first_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    """The candidates whose `seen_once_first_key` is <= `bound`, in list order."""
    again, t = bound
    if again:  # every first-timer, and the others up to t
        return [c for c in candidates if c.access_count <= 1 or c.last_access_time <= t]
    return [c for c in candidates if c.access_count <= 1 and c.last_access_time <= t]


def _up_to_of(
    cls: type[EvictionPolicy],
) -> Callable[[list[EvictionCandidate], Any], list[EvictionCandidate]] | None:
    """`cls.candidates_up_to` when the class that defines it also defines `candidate_key`."""
    try:
        return _UP_TO[cls]
    except KeyError:
        pass
    owner = next(k for k in cls.__mro__ if "candidate_key" in k.__dict__)
    up_to = cls.candidates_up_to if "candidates_up_to" in owner.__dict__ else None
    _UP_TO[cls] = up_to
    return up_to


_ORDER: dict[type[EvictionPolicy], tuple[str, tuple[float, ...]] | None] = {}


def _order_of(cls: type[EvictionPolicy]) -> tuple[str, tuple[float, ...]] | None:
    """`cls.candidate_order` when the class that defines `candidate_key` also defines it."""
    try:
        return _ORDER[cls]
    except KeyError:
        pass
    owner = next(k for k in cls.__mro__ if "candidate_key" in k.__dict__)
    order = owner.__dict__.get("candidate_order")
    _ORDER[cls] = order
    return order


def select_in_order(
    candidates: list[EvictionCandidate],
    required_blocks: int,
    key: Callable[[EvictionCandidate], Any],
    up_to: Callable[[list[EvictionCandidate], Any], list[EvictionCandidate]] | None = None,
) -> list[int]:
    """Greedy victim choice shared by every policy: unpinned candidates by `key` (ties by
    position), until enough blocks are freed.

    Only the few candidates that can be chosen are sorted. A sorted sample of about 64 keys
    gives a threshold below which the candidates should hold twice the blocks needed. With
    `up_to` (the policy's `candidates_up_to`, which must keep exactly the candidates whose key
    is <= the threshold, in list order), one list comprehension keeps those, a stable sort
    orders them, and when they free enough that is the answer: every other candidate's key is
    larger. Otherwise, or without `up_to`, the keys of all candidates are computed: one pass
    of comparisons keeps those under the threshold, and the rest are sorted only when they
    turn out to be needed.
    """
    if required_blocks <= 0:
        return []
    n = len(candidates)
    if up_to is not None and n > 128:
        stride = n // 64
        sample = candidates[::stride]
        sample.sort(key=key)  # stable: equal keys keep their positions' order
        sampled_blocks = 0
        for candidate in sample:
            if not candidate.is_pinned:
                sampled_blocks += len(candidate.block_ids) * stride
                if sampled_blocks >= 2 * required_blocks:
                    kept = up_to(candidates, key(candidate))
                    kept.sort(key=key)
                    victims: list[int] = []
                    freed = 0
                    for chosen in kept:
                        if not chosen.is_pinned:
                            victims.append(chosen.sequence_id)
                            freed += len(chosen.block_ids)
                            if freed >= required_blocks:
                                return victims
                    break  # the sample misled: the general pass below
    return _select_by_keys(candidates, required_blocks, key)


def _select_by_keys(
    candidates: list[EvictionCandidate], required_blocks: int, key: Callable[[EvictionCandidate], Any]
) -> list[int]:
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
