"""`EvictionPolicy`: the incremental policy interface every policy implements.

The contract is drawn in docs/architecture.md, "Policy interface".

`EvictionPolicy` owns what every policy needs: the entries' metadata, which entries are
evictable, argument checking with clear errors, the counters behind `get_metrics`, and the
explanations of its order ("Explaining an eviction"). A subclass implements five hooks over its
own ordering structure; none of them may pass over all entries. Two mixins, each in its own
module, complete it:

- `sage_eviction.handover.EntryHandover`: the hot-swap handover (`entries` / `from_entries`,
  their column forms and bulk loads);
- `sage_eviction.sequence_level.SequenceLevelInterface`: the module spec's sequence-level API
  (`select_victims`, `update_access`, `get_metrics`).

The bases most policies build on live beside it: `sage_eviction.heap` (scores in a lazy heap)
and `sage_eviction.recency` (O(1) recency queues, per level).

Imports: the standard library and `sage_eviction`'s own modules (never the registry, the
policies or the integrations, which import this one).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar

from sage_eviction import native
from sage_eviction.errors import DuplicateKeyError, UnknownKeyError
from sage_eviction.handover import EntryHandover
from sage_eviction.keyset import new_key_set
from sage_eviction.metrics import LatencyRecorder, count_tenant, reprefill_window
from sage_eviction.sequence_level import SequenceLevelInterface
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["EvictionPolicy", "Score"]

Score = Any  # a float, an int or a tuple of them: anything totally ordered


class EvictionPolicy(EntryHandover, SequenceLevelInterface):
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
        # evicted within the last `reprefill_window(capacity)` evictions and not requested again
        # (bounded: a policy that serves for weeks sees keys without end; the compiled `KeySet`'s
        # window, or `EvictedWindow`: sage_eviction/keyset.py); None once `stop_recording_evicted`
        self._evicted: Any = new_key_set(reprefill_window(capacity))
        self._evictions = 0
        self._re_prefills = 0
        self._tenants: dict[str | None, list[int]] = {}  # tenant -> [hits, lookups], capped: count_tenant
        self._select_latency = LatencyRecorder(4096)
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
        evicted = self._evicted
        if evicted is not None and key in evicted:
            evicted.discard(key)
            self._re_prefills += 1
        count_tenant(self._tenants, meta.tenant, False)
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
        count_tenant(self._tenants, meta.tenant, True)
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
            if self._evicted is not None:
                self._evicted.add(key)
            victims.append(key)
        self._evictions += len(victims)
        return victims

    def stop_recording_evicted(self) -> None:
        """Forget the evicted keys and record no more: for a cache that counts re-prefills
        itself (the engine's cache and the simulator's rows: `ReprefillTracker`), so that one
        tracker holds them, not two. This policy's `get_metrics` then reports no re-prefills;
        nothing else it does depends on them."""
        self._evicted = None

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
