"""Slow, list-based reference models of the adaptive policies (arc, slru, s3fifo, sieve).

Each model restates its policy's documented semantics (the module docstrings of
`sage_eviction/policies/{arc,slru,s3fifo,sieve}.py`) with plain lists scanned end to end, so
that a property test can drive a model and the real policy side by side and compare every
victim. Non-evictable entries follow the same documented rules: they keep their segment or
queue and count in its size, are invisible to eviction, and are appended at the MRU end or
head of their list when they become evictable again.

Interface of every model: `__init__(capacity, **params)`, `insert(key, meta=None,
evictable=True)`, `access(key, now=None)`, `set_evictable(key, flag)`, `remove(key)`,
`evict_one() -> key | None` (None when nothing is evictable). ARC and S3-FIFO also have
`prepare_insert(key)`. Lists are ordered LRU (or oldest) first.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sage_eviction import EntryMeta

__all__ = ["REFERENCE_MODELS_ADAPTIVE", "ARCModel", "S3FIFOModel", "SIEVEModel", "SLRUModel"]

_NONE: Any = object()


class ARCModel:
    """ARC (Megiddo and Modha, FAST 2003) as documented in `policies/arc.py`."""

    def __init__(self, capacity: int | None, **params: Any) -> None:
        if capacity is None or params:
            raise ValueError("ARCModel takes a capacity and no params")
        self.c = capacity
        self.p = 0.0
        self.t1: list[Hashable] = []  # evictable keys of T1, LRU first
        self.t2: list[Hashable] = []
        self.b1: list[Hashable] = []  # ghosts, LRU first
        self.b2: list[Hashable] = []
        self.segment: dict[Hashable, int] = {}  # every resident key -> 1 or 2
        self.pinned: set[Hashable] = set()
        self.pending: Any = _NONE
        self.pending_ghost = 0
        self.pending_replace = False

    def _count(self, segment: int) -> int:
        return sum(1 for s in self.segment.values() if s == segment)

    def _adapt(self, ghost: int) -> None:
        b1, b2 = len(self.b1), len(self.b2)
        if ghost == 1:
            self.p = min(self.p + max(b2 / b1, 1.0), float(self.c))
        else:
            self.p = max(self.p - max(b1 / b2, 1.0), 0.0)

    def prepare_insert(self, key: Hashable) -> None:
        self.pending = key
        self.pending_ghost = 0
        if key in self.b1:
            self._adapt(1)
            self.b1.remove(key)
            self.pending_ghost = 1
        elif key in self.b2:
            self._adapt(2)
            self.b2.remove(key)
            self.pending_ghost = 2
        self.pending_replace = self.pending_ghost != 0

    def insert(self, key: Hashable, meta: EntryMeta | None = None, evictable: bool = True) -> None:
        pending, self.pending, self.pending_replace = self.pending, _NONE, False
        if pending is not _NONE and pending == key:
            ghost = self.pending_ghost
        elif key in self.b1:
            self._adapt(1)
            self.b1.remove(key)
            ghost = 1
        elif key in self.b2:
            self._adapt(2)
            self.b2.remove(key)
            ghost = 2
        else:
            ghost = 0
        if not ghost:
            n1, n2 = self._count(1), self._count(2)
            if n1 + len(self.b1) >= self.c and self.b1:
                self.b1.pop(0)
            elif n1 + n2 + len(self.b1) + len(self.b2) >= 2 * self.c and self.b2:
                self.b2.pop(0)
        segment = 2 if ghost else 1
        self.segment[key] = segment
        if evictable:
            (self.t2 if segment == 2 else self.t1).append(key)
        else:
            self.pinned.add(key)

    def access(self, key: Hashable, now: float | None = None) -> None:
        if key not in self.pinned:
            (self.t1 if self.segment[key] == 1 else self.t2).remove(key)
            self.t2.append(key)
        self.segment[key] = 2

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        lru = self.t1 if self.segment[key] == 1 else self.t2
        if flag and key in self.pinned:
            self.pinned.remove(key)
            lru.append(key)
        elif not flag and key not in self.pinned:
            lru.remove(key)
            self.pinned.add(key)

    def remove(self, key: Hashable) -> None:
        segment = self.segment.pop(key)
        if key in self.pinned:
            self.pinned.remove(key)
        else:
            (self.t1 if segment == 1 else self.t2).remove(key)

    def _replace(self, in_b2: bool) -> Hashable:
        n1 = self._count(1)
        if self.t1 and (n1 > self.p or (in_b2 and n1 == self.p) or not self.t2):
            key = self.t1.pop(0)
            self.b1.append(key)
        else:
            key = self.t2.pop(0)
            self.b2.append(key)
        del self.segment[key]
        return key

    def evict_one(self) -> Hashable | None:
        if not self.t1 and not self.t2:
            return None
        if self.pending_replace:
            self.pending_replace = False
            return self._replace(self.pending_ghost == 2)
        n1, n2 = self._count(1), self._count(2)
        if n1 + len(self.b1) >= self.c:
            if n1 >= self.c and self.t1:
                key = self.t1.pop(0)
                del self.segment[key]
                return key
            if self.b1:
                self.b1.pop(0)
        elif n1 + n2 + len(self.b1) + len(self.b2) >= 2 * self.c and self.b2:
            self.b2.pop(0)
        return self._replace(False)


class SLRUModel:
    """Segmented LRU (Karedla, Love and Wherry, 1994) as documented in `policies/slru.py`."""

    def __init__(
        self, capacity: int | None, protected_threshold: int = 2, protected_ratio: float = 0.8
    ) -> None:
        self.threshold = protected_threshold
        self.cap = None if capacity is None else int(capacity * protected_ratio)
        self.probation: list[Hashable] = []  # evictable, LRU first
        self.protected: list[Hashable] = []
        self.segment: dict[Hashable, str] = {}
        self.hits: dict[Hashable, int] = {}
        self.pinned: set[Hashable] = set()

    def _balance(self) -> None:
        while (
            self.cap is not None
            and sum(1 for s in self.segment.values() if s == "protected") > self.cap
            and self.protected
        ):
            key = self.protected.pop(0)
            self.segment[key] = "probation"
            self.probation.append(key)

    def insert(self, key: Hashable, meta: EntryMeta | None = None, evictable: bool = True) -> None:
        self.segment[key] = "probation"
        self.hits[key] = 0 if meta is None else meta.hits
        if evictable:
            self.probation.append(key)
        else:
            self.pinned.add(key)

    def access(self, key: Hashable, now: float | None = None) -> None:
        self.hits[key] += 1
        linked = key not in self.pinned
        if self.segment[key] == "protected":
            if linked:
                self.protected.remove(key)
                self.protected.append(key)
        elif self.hits[key] >= self.threshold:
            self.segment[key] = "protected"
            if linked:
                self.probation.remove(key)
                self.protected.append(key)
            self._balance()
        elif linked:
            self.probation.remove(key)
            self.probation.append(key)

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        lru = self.protected if self.segment[key] == "protected" else self.probation
        if flag and key in self.pinned:
            self.pinned.remove(key)
            lru.append(key)
            if lru is self.protected:
                self._balance()
        elif not flag and key not in self.pinned:
            lru.remove(key)
            self.pinned.add(key)

    def remove(self, key: Hashable) -> None:
        segment = self.segment.pop(key)
        del self.hits[key]
        if key in self.pinned:
            self.pinned.remove(key)
        else:
            (self.protected if segment == "protected" else self.probation).remove(key)

    def evict_one(self) -> Hashable | None:
        lru = self.probation or self.protected
        if not lru:
            return None
        key = lru.pop(0)
        del self.segment[key]
        del self.hits[key]
        return key


class S3FIFOModel:
    """S3-FIFO (Yang et al., SOSP 2023) as documented in `policies/s3fifo.py`."""

    def __init__(
        self,
        capacity: int | None,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_threshold: int = 2,
    ) -> None:
        if capacity is None:
            raise ValueError("S3FIFOModel needs a capacity")
        self.small_size = max(1, int(capacity * small_ratio))
        self.main_size = capacity - self.small_size
        self.ghost_size = int(capacity * ghost_ratio)
        self.threshold = move_threshold
        self.small: list[Hashable] = []  # evictable, oldest (tail) first
        self.main: list[Hashable] = []
        self.ghost: list[Hashable] = []
        self.queue: dict[Hashable, str] = {}
        self.freq: dict[Hashable, int] = {}
        self.pinned: set[Hashable] = set()
        self.has_evicted = False
        self.pending: Any = _NONE
        self.pending_ghost = False

    def _count(self, queue: str) -> int:
        return sum(1 for q in self.queue.values() if q == queue)

    def prepare_insert(self, key: Hashable) -> None:
        self.pending = key
        self.pending_ghost = key in self.ghost
        if self.pending_ghost:
            self.ghost.remove(key)

    def insert(self, key: Hashable, meta: EntryMeta | None = None, evictable: bool = True) -> None:
        pending, self.pending = self.pending, _NONE
        if pending is not _NONE and pending == key:
            to_main = self.pending_ghost
        else:
            to_main = key in self.ghost
            if to_main:
                self.ghost.remove(key)
        if not to_main and not self.has_evicted and self._count("small") >= self.small_size:
            to_main = True
        queue = "main" if to_main else "small"
        self.queue[key] = queue
        self.freq[key] = 0
        if evictable:
            (self.main if to_main else self.small).append(key)
        else:
            self.pinned.add(key)

    def access(self, key: Hashable, now: float | None = None) -> None:
        self.freq[key] = min(self.freq[key] + 1, 3)

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        fifo = self.small if self.queue[key] == "small" else self.main
        if flag and key in self.pinned:
            self.pinned.remove(key)
            fifo.append(key)
        elif not flag and key not in self.pinned:
            fifo.remove(key)
            self.pinned.add(key)

    def remove(self, key: Hashable) -> None:
        queue = self.queue.pop(key)
        del self.freq[key]
        if key in self.pinned:
            self.pinned.remove(key)
        else:
            (self.small if queue == "small" else self.main).remove(key)

    def _forget(self, key: Hashable) -> Hashable:
        del self.queue[key]
        del self.freq[key]
        return key

    def evict_one(self) -> Hashable | None:
        if not self.small and not self.main:
            return None
        self.has_evicted = True
        while True:
            if self.main and (self._count("main") > self.main_size or not self.small):
                while True:  # main: a 2-bit clock
                    key = self.main.pop(0)
                    if self.freq[key] >= 1:
                        self.freq[key] -= 1
                        self.main.append(key)
                    else:
                        return self._forget(key)
            while self.small:
                key = self.small.pop(0)
                if self.freq[key] >= self.threshold:
                    self.freq[key] = 0
                    self.queue[key] = "main"
                    self.main.append(key)
                    continue
                if self.ghost_size > 0 and key not in self.ghost:
                    while len(self.ghost) >= self.ghost_size:
                        self.ghost.pop(0)
                    self.ghost.append(key)
                return self._forget(key)


class SIEVEModel:
    """SIEVE (Zhang et al., NSDI 2024) as documented in `policies/sieve.py`."""

    def __init__(self, capacity: int | None, **params: Any) -> None:
        if params:
            raise ValueError("SIEVEModel takes no params")
        self.queue: list[Hashable] = []  # evictable keys, tail (oldest) first, head last
        self.visited: dict[Hashable, bool] = {}
        self.hand: Any = _NONE  # the key the hand rests on; _NONE: start at the tail

    def _unlink(self, key: Hashable) -> None:
        i = self.queue.index(key)
        if self.hand is not _NONE and self.hand == key:
            self.hand = self.queue[i + 1] if i + 1 < len(self.queue) else _NONE
        self.queue.pop(i)

    def insert(self, key: Hashable, meta: EntryMeta | None = None, evictable: bool = True) -> None:
        self.visited[key] = False
        if evictable:
            self.queue.append(key)

    def access(self, key: Hashable, now: float | None = None) -> None:
        self.visited[key] = True

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        linked = key in self.queue
        if flag and not linked:
            self.queue.append(key)
        elif not flag and linked:
            self._unlink(key)

    def remove(self, key: Hashable) -> None:
        del self.visited[key]
        if key in self.queue:
            self._unlink(key)

    def evict_one(self) -> Hashable | None:
        if not self.queue:
            return None
        i = 0 if self.hand is _NONE else self.queue.index(self.hand)
        while self.visited[self.queue[i]]:
            self.visited[self.queue[i]] = False
            i = (i + 1) % len(self.queue)
        key = self.queue[i]
        self.hand = self.queue[i + 1] if i + 1 < len(self.queue) else _NONE
        self.queue.pop(i)
        del self.visited[key]
        return key


REFERENCE_MODELS_ADAPTIVE: dict[str, type] = {
    "arc": ARCModel,
    "slru": SLRUModel,
    "s3fifo": S3FIFOModel,
    "sieve": SIEVEModel,
}
