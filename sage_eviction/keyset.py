"""`KeySet`: the set of evicted keys not yet requested again, compact where the compiled core is.

The simulator's compiled loops (the flat state's and the radix loop's re-prefill counts) keep
every key a trace evicts and has not requested since, for one run: on a generated trace of 10^8
lookups, about 15 M keys. (A long-lived cache, and a policy's own record, keep a bounded window
instead: `sage_eviction.metrics.EvictedWindow`.) A
Python set costs about 45 bytes a key and keeps the key's int object alive (32 bytes more); the
compiled core's `KeySet` (sage_eviction/_core_keyset.pxi) holds a trace's dense block ids (ints in
[0, 2^27)) as bits of a bitmap, 1 bit per id up to the largest; other ints within int64 as raw
int64 in one open-addressing table, 11 to 21 bytes a key; and any other key in a Python set beside it.

`new_key_set()` returns the compiled one where the core is used (sage_eviction/native.py, so
`SAGE_PURE_PYTHON=1` and `native.pure_python()` pick the reference) and `PyKeySet` otherwise:
a `set` with the one method the compiled set adds, `remove_present`. Both compare equal to a set
of the same keys (tests/test_keyset.py holds them to the same answers).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from sage_eviction import native

__all__ = ["PyKeySet", "new_key_set"]


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


def new_key_set() -> Any:
    """An empty set of keys: the compiled `KeySet` where the core is used, else `PyKeySet`.

    Typed `Any`: the compiled class has a set's methods that the callers use, not its type."""
    core = native.core()
    return PyKeySet() if core is None else core.KeySet()
