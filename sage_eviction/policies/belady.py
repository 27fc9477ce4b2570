"""Belady's MIN: evict the block whose next use lies farthest in the future (offline).

Source: Belady, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
Journal 5(2), 1966. With forced admission (every miss is inserted, as in demand paging and in
libCacheSim's `Belady`) it gives the fewest misses of any policy; simulation only.

How it is given the future: `set_future(keys)` with the sequence of block lookups the cache
will serve, in order. Every `insert` (a miss) and every `access` (a hit) consumes the next
position of that sequence, and the entry's priority is the position of the key's next
occurrence after it (never again = farthest). `evict` takes the evictable entry whose next
use is farthest; entries never used again go first (in insertion order among themselves).

- `strict=True` (the default): the call at position i must be for `keys[i]`; anything else
  raises `PolicyStateError` naming the position, the expected key and the key given. The flat
  driver (`sage_eviction.flat`) works this way.
- `strict=False`: a call for a key other than `keys[i]` skips ahead to that key's next
  occurrence (for a cache that does not turn every lookup into a call, e.g. it serves a
  lookup without touching the policy). Entries whose recorded next use was skipped get their
  following occurrence. A key that does not occur again still raises.

Calls past the end of the future, or before `set_future`, raise `PolicyStateError`.
`set_future` may be called again (e.g. after `from_entries`): positions restart at 0 and
the entries held get the first occurrence of their key as their next use.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Sequence

from sage_eviction.base import Score
from sage_eviction.errors import PolicyStateError
from sage_eviction.heap import HeapPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy, PolicyEntry

__all__ = ["BeladyPolicy"]


class BeladyPolicy(HeapPolicy):
    """Offline MIN over blocks; call `set_future(keys)` before the first insert or access."""

    name = "belady"
    strategy = EvictionStrategy.BELADY
    paper = (
        "Belady, A study of replacement algorithms for a virtual-storage computer, IBM Systems Journal 1966"
    )
    order_preserving = False  # the order depends on the position in the future, which a swap resets
    offline = True
    needs_capacity = False

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._future: Sequence[Hashable] | None = None
        # position -> next position of the same key, or len(future): int64s, 8 bytes a lookup
        self._next_pos: array[int] = array("q")
        self._occurrences: dict[Hashable, list[int]] = {}  # lenient mode only
        self._strict = True
        self._pos = 0  # the position the next call consumes
        self._never = 0  # len(future): the "never again" next use
        self._next_use: dict[Hashable, int] = {}  # held key -> position of its next use
        self._due: list[tuple[int, int, Hashable]] = []  # lenient mode: (next use, push, key)
        self._incoming = 0  # next use of the key being inserted or accessed

    # ---- the future ------------------------------------------------------------------------

    def set_future(self, keys: Sequence[Hashable], *, strict: bool = True) -> None:
        """Give the lookups to come, in order; the next insert or access is position 0.

        Args:
            keys: Every lookup the cache will serve (hits and misses), in order.
            strict: Whether each call must be for the next key of `keys` (see the module doc).
        """
        n = len(keys)
        next_pos = array("q", [n]) * n
        seen: dict[Hashable, int] = {}
        for i in range(n - 1, -1, -1):
            key = keys[i]
            next_pos[i] = seen.get(key, n)
            seen[key] = i
        self._future = keys
        self._next_pos = next_pos
        self._never = n
        self._pos = 0
        self._strict = strict
        self._occurrences = {}
        if not strict:
            occurrences = self._occurrences
            for i, key in enumerate(keys):
                occurrences.setdefault(key, []).append(i)
        # Entries already held (e.g. after from_entries) get their key's first occurrence.
        self._next_use = {key: seen.get(key, n) for key in self._meta}
        self._due = []
        self._rebuild()

    @property
    def has_strict_future(self) -> bool:
        """Whether a future is set and each call must be its next key (strict mode)."""
        return self._future is not None and self._strict

    @property
    def position(self) -> int:
        """The position in the future that the next insert or access consumes."""
        return self._pos

    def next_use(self, key: Hashable) -> int | None:
        """The position of the next use of a held key; None when it is never used again."""
        pos = self._next_use[key]
        return None if pos >= self._never else pos

    def _consume(self, key: Hashable) -> int:
        """Check `key` against the future; returns the position it takes (not yet committed)."""
        future = self._future
        if future is None:
            raise PolicyStateError(f"{self.name}: the future is not set; call set_future(keys) first")
        pos = self._pos
        if pos < len(future) and future[pos] == key:
            return pos
        if pos >= len(future):
            raise PolicyStateError(
                f"{self.name}: call for key {key!r} past the end of the future ({len(future)} lookups)"
            )
        if self._strict:
            raise PolicyStateError(
                f"{self.name}: the calls diverge from the future at position {pos}: "
                f"expected key {future[pos]!r}, got {key!r}"
            )
        positions = self._occurrences.get(key, [])
        at = bisect_left(positions, pos)
        if at == len(positions):
            raise PolicyStateError(
                f"{self.name}: key {key!r} does not occur in the future at or after position {pos}"
            )
        return positions[at]

    def _commit(self, pos: int) -> None:
        skipped = pos > self._pos
        self._pos = pos + 1
        if skipped:
            self._refresh(pos)

    def _refresh(self, pos: int) -> None:
        """Lenient mode: entries whose next use lies before `pos` get their next occurrence."""
        due, next_use = self._due, self._next_use
        while due and due[0][0] < pos:
            old, _, key = heapq.heappop(due)
            if next_use.get(key) != old:
                continue  # stale item
            positions = self._occurrences[key]
            at = bisect_left(positions, pos)
            new = positions[at] if at < len(positions) else self._never
            next_use[key] = new
            self._track(key, new)
            if key in self._live:
                self._push(key, self._meta[key])

    def _track(self, key: Hashable, next_use: int) -> None:
        if not self._strict and next_use < self._never:
            self._pushes += 1
            heapq.heappush(self._due, (next_use, self._pushes, key))

    # ---- the incremental interface ---------------------------------------------------------

    def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = True) -> None:
        """A miss on `key`; it must be the next lookup of the future (see the module doc)."""
        pos = self._consume(key)
        self._incoming = self._next_pos[pos]
        super().insert(key, meta, evictable=evictable)
        self._commit(pos)

    def access(self, key: Hashable, now: float | None = None) -> None:
        """A hit on `key`; it must be the next lookup of the future (see the module doc)."""
        if key not in self._meta:
            super().access(key, now)  # raises UnknownKeyError
        pos = self._consume(key)
        self._incoming = self._next_pos[pos]
        super().access(key, now)
        self._commit(pos)

    # ---- hooks -------------------------------------------------------------------------------

    def _score(self, key: Hashable, meta: EntryMeta) -> Score:
        return -self._next_use[key]

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._next_use[key] = self._incoming
        self._track(key, self._incoming)
        super()._on_insert(key, meta, evictable)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._next_use[key] = self._incoming
        self._track(key, self._incoming)
        super()._on_access(key, meta)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._next_use[key]
        super()._on_remove(key, meta, was_evictable)

    def _on_victim(self, key: Hashable, score: Score) -> None:
        del self._next_use[key]

    def _load(self, entries: Iterable[PolicyEntry]) -> None:
        # Next uses are unknown until set_future; "never" until then.
        items = list(entries)
        for entry in items:
            self._next_use.setdefault(entry.key, self._never)
        super()._load(items)

    def _rebuild(self) -> None:
        live = self._live
        for key in list(live):
            self._pushes += 1
            live[key] = (self._score(key, self._meta[key]), self._pushes, key)
            self._track(key, self._next_use[key])
        for key in self._meta:
            if key not in live:
                self._track(key, self._next_use[key])
        self._refill()

    explains_by = "the position of its next use in the future, farthest first"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {"next_use": self.next_use(key), "position": self._pos}

    # ---- the module spec's interface ------------------------------------------------------

    preemption_order = "lru"  # running sequences have no known future here
