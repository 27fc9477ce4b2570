"""`KeySet`: the set of evicted keys not yet requested again, compact where the compiled core is.

The simulator's rows (the flat state's and the radix loop's re-prefill counts, compiled or
not) keep every key a trace evicts and has not requested since, for one run: on a generated trace
of 10^8 lookups, about 15 M keys. A long-lived cache (the engine's re-prefill tracker, a
policy's own record, the bridges') keeps a bounded window instead: `new_key_set(window)`, the
last `window` evictions (`EvictedWindow`, and the compiled `KeySet`'s window). A
Python set costs about 45 bytes a key and keeps the key's int object alive (32 bytes more); the
compiled core's `KeySet` (sage_eviction/_core_keyset.pxi) holds a trace's dense block ids (ints in
[0, 2^27)) as bits of a bitmap, 1 bit per id up to the largest; other ints within int64 as raw
int64 in one open-addressing table, 11 to 21 bytes a key; and any other key in a Python set beside it.

`new_key_set()` returns the compiled one where the core is used (sage_eviction/native.py, so
`SAGE_PURE_PYTHON=1` and `native.pure_python()` pick the reference) and `PyKeySet` otherwise:
a `set` with the one method the compiled set adds, `remove_present`; `new_key_set(window)` the
compiled `KeySet(window=window)` or `EvictedWindow(window)`. All compare equal to a set of the
same keys (tests/test_keyset.py holds them to the same answers).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from sage_eviction import native

__all__ = ["EvictedWindow", "PyKeySet", "new_key_set"]


class PyKeySet(set[Hashable]):
    """The reference `KeySet`: a Python set, plus `remove_present`."""

    __slots__ = ()

    def remove_present(self, keys: Iterable[Hashable]) -> int:
        """Discard each of `keys` that is held; returns how many were (each key once)."""
        if not self:
            return 0
        back = self.intersection(keys)
        if back:
            self.difference_update(back)
        return len(back)


class EvictedWindow:
    """The last `window` evicted keys not requested since: a bounded set, first in first out.

    Why bounded: a long-lived engine evicts keys without end (every unique prompt brings new
    ones), and most never come back; a set of every evicted key grows with the requests served.
    Like a ghost list, this one remembers the last `window` evictions: a ring of the evicted keys
    in eviction order, and a dict from each key still waiting to its place in the ring. `add`,
    `discard` and `in` are O(1); memory is at most `window` ring slots and `window` dict
    entries, whatever the number of keys seen. The reference of the compiled `KeySet(window=)`
    (sage_eviction/_core_keyset.pxi), which keeps the same ring and the same slots
    (tests/test_keyset.py holds the two to the same answers); `new_key_set(window)` picks one.
    """

    __slots__ = ("_at", "_next", "_ring", "window")

    def __init__(self, window: int) -> None:
        if window <= 0:
            raise ValueError(f"window={window} must be a positive number of keys")
        self.window = window
        self._ring: list[Hashable] = []  # grows to `window`, then each eviction takes the oldest slot
        self._next = 0  # the ring's oldest slot once it is full
        self._at: dict[Hashable, int] = {}  # key -> its slot (its latest eviction)

    def add(self, key: Hashable) -> None:
        """`key` was evicted: remember it, forgetting the oldest eviction when the window is full."""
        ring = self._ring
        if len(ring) < self.window:
            self._at[key] = len(ring)
            ring.append(key)
            return
        slot = self._next
        old = ring[slot]
        if self._at.get(old) == slot:  # else `old` came back, or was evicted again since
            del self._at[old]
        ring[slot] = key
        self._at[key] = slot
        self._next = slot + 1 if slot + 1 < self.window else 0

    def update(self, keys: Iterable[Hashable]) -> None:
        """`add` each of `keys`, in order."""
        for key in keys:
            self.add(key)

    def discard(self, key: Hashable) -> bool:
        """`key` was requested: True when it was waiting (evicted within the window), and forget it."""
        return self._at.pop(key, None) is not None

    def remove_present(self, keys: Iterable[Hashable]) -> int:
        """`discard` each of `keys`; returns how many were waiting (each key once)."""
        at = self._at
        if not at:
            return 0
        return sum(1 for key in keys if at.pop(key, None) is not None)

    def clear(self) -> None:
        """Forget every key (the window's size stays)."""
        self._ring = []
        self._next = 0
        self._at = {}

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def __len__(self) -> int:
        """Keys waiting (evicted within the window and not requested since)."""
        return len(self._at)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._at)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EvictedWindow):
            return self._at.keys() == other._at.keys()
        if isinstance(other, (set, frozenset)):
            return self._at.keys() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def held(self) -> int:
        """Slots in use (at most `window`): the structure's size, for the bound's tests."""
        return len(self._ring)


def new_key_set(window: int | None = None) -> Any:
    """An empty set of keys: the compiled `KeySet` where the core is used, else `PyKeySet`;
    with a `window`, one that holds only the keys of the last `window` adds (`EvictedWindow`).

    Typed `Any`: the compiled class has a set's methods that the callers use, not its type."""
    core = native.core()
    if core is not None:
        return core.KeySet(window=window)
    return PyKeySet() if window is None else EvictedWindow(window)
