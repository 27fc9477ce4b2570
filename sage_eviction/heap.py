"""`HeapPolicy`: evictable entries ordered by a score in a heap with lazy deletion.

A stale heap item is skipped when popped, and the heap is rebuilt when stale items outnumber live
ones, so every operation is O(log n) amortised. `FlatHeapPolicy` keeps the score tuples flat (one
tuple less per comparison) for the policies whose score ends with a unique tick.

The heap itself is a score heap: the compiled `sage_eviction._core.ScoreHeap` (the numbers of
each item in a C array) where it is built, else `_ListHeap` (heapq over the item tuples), the
reference. A compiled heap given an item whose numbers are not exact doubles (a tuple score, a
NaN, a huge int) hands its items to a `_ListHeap` and the policy goes on with that.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections.abc import Hashable, Iterable
from itertools import compress
from typing import Any, ClassVar, Protocol

from sage_eviction import native
from sage_eviction.base import EvictionPolicy, Score
from sage_eviction.types import EntryMeta

__all__ = ["FlatHeapPolicy", "HeapPolicy"]


class _Heap(Protocol):
    """What `HeapPolicy` needs of its heap of item tuples `(..., key)`."""

    def __len__(self) -> int: ...

    def push(self, item: tuple[Any, ...]) -> bool:
        """Add `item`; False, adding nothing, when this heap cannot hold it."""

    def fill(self, items: Iterable[tuple[Any, ...]]) -> bool:
        """Replace the contents with `items`; False, leaving it empty, when it cannot."""

    def pop_live(self, live: dict[Hashable, Any], ticks: dict[Hashable, Any]) -> Any:
        """Pop until an item is `live[item[-1]]`, delete that key from `live` and `ticks`
        (the policy's two per-key maps: one call for the victim's bookkeeping), return it."""

    def items(self) -> list[Any]:
        """Every item held, stale ones too."""


class _ListHeap:
    """The pure-Python score heap: heapq over the item tuples (the reference)."""

    __slots__ = ("heap",)

    def __init__(self, items: Iterable[tuple[Any, ...]] = ()) -> None:
        self.heap: list[tuple[Any, ...]] = list(items)
        heapq.heapify(self.heap)

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, item: tuple[Any, ...]) -> bool:
        heapq.heappush(self.heap, item)
        return True

    def fill(self, items: Iterable[tuple[Any, ...]]) -> bool:
        self.heap = list(items)
        heapq.heapify(self.heap)
        return True

    def pop_live(self, live: dict[Hashable, Any], ticks: dict[Hashable, Any]) -> Any:
        heap = self.heap
        pop = heapq.heappop
        while True:
            item = pop(heap)  # IndexError when empty, as the compiled heap
            key = item[-1]
            if live.get(key) is item:
                del live[key]
                del ticks[key]
                return item

    def items(self) -> list[Any]:
        return list(self.heap)


def _new_heap(compiled: bool) -> _Heap:
    """The compiled score heap, or the reference."""
    core = native.load(native.CORE) if compiled else None
    return core.ScoreHeap() if core is not None else _ListHeap()


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
        self._heap: _Heap = _new_heap(self._compiled)
        self._live: dict[Hashable, tuple[Any, ...]] = {}
        self._tick: dict[Hashable, int] = {}  # key -> tick of its latest insert or access
        self._pushes = 0  # unique tie-breaker of heap items
        # whether `_on_victim` does anything (GDSF, Belady): a call less per eviction otherwise
        self._victim_hook = type(self)._on_victim is not HeapPolicy._on_victim

    @abstractmethod
    def _score(self, key: Hashable, meta: EntryMeta) -> Score:
        """Smaller is evicted sooner; `self._clock` and `self._tick[key]` are current."""

    def _push(self, key: Hashable, meta: EntryMeta) -> None:
        self._pushes += 1
        self._add((self._score(key, meta), self._pushes, key))

    def _add(self, item: tuple[Any, ...]) -> None:
        """Make `item` its key's live item and push it."""
        live = self._live
        live[item[-1]] = item
        heap = self._heap
        if not heap.push(item):  # not numbers the compiled heap holds: on in pure Python
            self._heap = heap = _ListHeap(heap.items())
            heap.push(item)
        if len(heap) > 2 * len(live) + 64:
            self._refill()

    def _refill(self) -> None:
        """The heap again from the live items alone (dropping the stale ones)."""
        if not self._heap.fill(self._live.values()):
            self._heap = _ListHeap(self._live.values())

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
        item = self._heap.pop_live(self._live, self._tick)
        key: Hashable = item[-1]
        if self._victim_hook:
            self._on_victim(key, item[0])
        return key

    def _on_victim(self, key: Hashable, score: Score) -> None:
        """Called with each victim's score (GDSF inflates its clock with it)."""

    def _compiled_scoring(self) -> tuple[str, tuple[float, ...]] | None:
        """How the compiled core scores a bulk load for this policy: the name of its copy of
        `_score` in sage_eviction/_core.pyx and the constants it reads now, or None (Python
        scores; the default). Used only when the class that defines `_score` defines this too
        (`_compiled_scoring_of`); tests/test_native_core.py holds each copy to its `_score`."""
        return None

    def _eviction_order(self) -> list[Hashable]:
        # the hot swap's entries(): a C sort of the scores' doubles where the core has them
        core = native.load(native.CORE) if self._compiled else None
        order = core.sorted_keys(self._live.values()) if core is not None else None
        return order if order is not None else [item[-1] for item in sorted(self._live.values())]

    def rank(self, key: Hashable) -> tuple[Any, ...] | None:
        """`(score, push number)` of the key's live heap item; for a key that is not evictable,
        its score now and a push number after every live one."""
        item = self._live.get(key)
        if item is not None:
            return item[:2]
        return (self._score(key, self.meta(key)), self._pushes + 1)

    def peek(self, n: int) -> list[Hashable]:
        """The `n` smallest live items, O(n log k) (the heap holds stale items too)."""
        return [item[-1] for item in heapq.nsmallest(n, self._live.values())] if n > 0 else []

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # Build the heap once instead of pushing n times; the same live items, each scored with
        # `self._clock` at its own tick, as the one-by-one inserts score them. (Subclasses'
        # `_on_insert` is not called, as before: Belady's `_load` sets its own state.)
        if self._meta:
            return False
        first = self._add_columns(keys, metas, flags)
        end = self._clock
        ticks = range(first, end + 1)
        self._tick.update(zip(keys, ticks, strict=True))
        live = self._live
        score = self._score
        held = zip(compress(keys, flags), compress(metas, flags), compress(ticks, flags), strict=True)
        compiled = _compiled_scoring_of(self) if self._compiled else None
        core = native.load(native.CORE) if compiled is not None else None
        if (
            core is not None
            and compiled is not None
            and all(type(column) is list for column in (keys, metas, flags))
            and core.score_into(live, compiled[0], compiled[1], keys, metas, flags, first)
        ):
            pass  # scored in C, as the loop below would
        elif isinstance(self, FlatHeapPolicy):
            live.clear()  # what a stopped C scoring left
            for key, meta, tick in held:
                self._clock = tick
                live[key] = (*score(key, meta), key)
        else:
            live.clear()
            pushes = self._pushes
            for key, meta, tick in held:
                self._clock = tick
                pushes += 1
                live[key] = (score(key, meta), pushes, key)
            self._pushes = pushes
        self._clock = end
        self._refill()
        return True


def _compiled_scoring_of(policy: HeapPolicy) -> tuple[str, tuple[float, ...]] | None:
    """`policy._compiled_scoring()` when the class that defines `_score` defines it too: a
    subclass that overrides `_score` alone is scored in Python."""
    owner = next(k for k in type(policy).__mro__ if "_score" in k.__dict__)
    if "_compiled_scoring" not in owner.__dict__:
        return None
    scoring: tuple[str, tuple[float, ...]] | None = owner.__dict__["_compiled_scoring"](policy)
    return scoring


class FlatHeapPolicy(HeapPolicy):
    """A `HeapPolicy` whose `_score` is a tuple ending with `self._tick[key]`, unique among
    live items, so heap items are the flat tuples `(*score, key)`: no push number, and one
    tuple less to reach per comparison."""

    @abstractmethod
    def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
        """Smaller is evicted sooner; a tuple ending with `self._tick[key]` (current)."""

    def _push(self, key: Hashable, meta: EntryMeta) -> None:
        self._add((*self._score(key, meta), key))

    def _pop_victim(self) -> Hashable:
        item = self._heap.pop_live(self._live, self._tick)
        key: Hashable = item[-1]
        if self._victim_hook:
            self._on_victim(key, item)
        return key

    def rank(self, key: Hashable) -> tuple[Any, ...] | None:
        """The score tuple of the key's live heap item (it ends with the unique tick); for a key
        that is not evictable, its score now."""
        item = self._live.get(key)
        if item is not None:
            return item[:-1]
        return self._score(key, self.meta(key))
