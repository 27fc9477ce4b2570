"""Recency queues: O(1) LRU/MRU/FIFO/FILO orders, and one such queue per level (LFU, priority).

`RecencyPolicy` keeps the evictable keys in an insertion-ordered dict by logical tick, with a
side heap for keys that come back with an older tick; `LevelledRecencyPolicy` keeps one such
queue per level (hits, priority) and a heap of the levels.
"""

from __future__ import annotations

import heapq
import operator
from abc import abstractmethod
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from itertools import compress, islice, repeat
from typing import Any, ClassVar

from sage_eviction.base import EvictionPolicy
from sage_eviction.types import EntryMeta

__all__ = ["LevelledRecencyPolicy", "RecencyPolicy"]


def _run(calls: Iterable[object]) -> None:
    """Exhaust an iterator of calls made in C (`map(...)`) for their side effects."""
    deque(calls, maxlen=0)


class _TickQueue:
    """Evictable keys of one level, ordered by tick (`ticks[key]`), for `RecencyPolicy`.

    `order` holds keys in increasing tick order: a key appended with the newest tick keeps it
    sorted, and a hit moves a key to the end. A key that comes back with an older tick (made
    evictable again after being in use) goes into the small heap `side` instead, with lazy
    deletion (`side_live[key]` is its tick while it is there). The next victim is the better
    of the two heads. Every key is in `order` or `side_live`, never both.
    """

    __slots__ = ("level", "newest_first", "order", "side", "side_live", "ticks")

    def __init__(self, level: Any, ticks: dict[Hashable, int], newest_first: bool) -> None:
        self.level = level
        self.ticks = ticks
        self.newest_first = newest_first
        self.order: OrderedDict[Hashable, None] = OrderedDict()
        self.side: list[tuple[int, Hashable]] = []  # (tick, key), (-tick, key) when newest first
        self.side_live: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self.order) + len(self.side_live)

    def add_old(self, key: Hashable, tick: int) -> None:
        """Add a key whose tick may be older than some already here."""
        order = self.order
        if not order or tick > self.ticks[next(reversed(order))]:
            order[key] = None
            return
        self.side_live[key] = tick
        side = self.side
        heapq.heappush(side, (-tick if self.newest_first else tick, key))
        if len(side) > 2 * len(self.side_live) + 64:
            sign = -1 if self.newest_first else 1
            self.side = [(sign * t, k) for k, t in self.side_live.items()]
            heapq.heapify(self.side)

    def touch(self, key: Hashable) -> None:
        """A held key got the newest tick."""
        order = self.order
        if key in order:
            order.move_to_end(key)
        else:
            del self.side_live[key]
            order[key] = None

    def discard(self, key: Hashable) -> None:
        order = self.order
        if key in order:
            del order[key]
        else:
            del self.side_live[key]

    def pop(self) -> Hashable:
        """Unlink and return the key of oldest tick (newest when `newest_first`)."""
        order = self.order
        side = self.side
        if side:
            side_live = self.side_live
            newest_first = self.newest_first
            while side:
                tick, key = side[0]
                if newest_first:
                    tick = -tick
                if side_live.get(key) == tick:
                    break
                heapq.heappop(side)  # stale
            if side:
                take_side = not order
                if not take_side:
                    head = next(reversed(order)) if newest_first else next(iter(order))
                    head_tick = self.ticks[head]
                    take_side = tick > head_tick if newest_first else tick < head_tick
                if take_side:
                    heapq.heappop(side)
                    del side_live[key]
                    return key
        return order.popitem(last=self.newest_first)[0]

    def keys(self) -> list[Hashable]:
        keys = list(self.order)
        keys.extend(self.side_live)
        return keys

    def in_order(self) -> list[Hashable]:
        """The keys in the order `pop` takes them. `order` is already sorted by tick, so only
        the side keys need merging (timsort merges the two sorted runs in one pass)."""
        order = self.order
        if self.side_live:
            keys = list(order)
            keys.extend(sorted(self.side_live, key=self.side_live.__getitem__))
            keys.sort(key=self.ticks.__getitem__)
        else:
            keys = list(order)
        if self.newest_first:
            keys.reverse()
        return keys


class RecencyPolicy(EvictionPolicy):
    """A policy that evicts the evictable entry of oldest tick (newest with `newest_first`).

    A key's tick is the clock of its insert, and of each hit when `touch_on_access`. Inserts
    and hits always carry the newest tick, so evictable keys sit in an `OrderedDict` in tick
    order and `evict(1)` is O(1); only a key made evictable again with an older tick pays
    O(log k), k being the number of such keys waiting (see `_TickQueue`).
    """

    newest_first: ClassVar[bool] = False
    touch_on_access: ClassVar[bool] = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._tick: dict[Hashable, int] = {}  # key -> tick of its insert (and latest hit)
        self._queue = _TickQueue(None, self._tick, self.newest_first)

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._tick[key] = self._clock
        if evictable:
            self._queue.order[key] = None

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        if self.touch_on_access:
            self._tick[key] = self._clock
            if key in self._evictable:
                self._queue.touch(key)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if evictable:
            self._queue.add_old(key, self._tick[key])
        else:
            self._queue.discard(key)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._tick[key]
        if was_evictable:
            self._queue.discard(key)

    def _pop_victim(self) -> Hashable:
        queue = self._queue
        key = queue.pop() if queue.side else queue.order.popitem(last=self.newest_first)[0]
        del self._tick[key]
        return key

    def _eviction_order(self) -> list[Hashable]:
        return self._queue.in_order()

    def peek(self, n: int) -> list[Hashable]:
        """The next `n` victims: the head of the queue, O(n), unless keys wait in the side heap."""
        if n <= 0:
            return []
        queue = self._queue
        if queue.side_live:
            return queue.in_order()[:n]
        order = reversed(queue.order) if self.newest_first else iter(queue.order)
        return list(islice(order, n))

    def rank(self, key: Hashable) -> tuple[Any, ...] | None:
        """`(tick,)`, newest first as `(-tick,)`: the logical time of the insert (and of the
        latest hit when hits count)."""
        self.meta(key)
        tick = self._tick[key]
        return (-tick,) if self.newest_first else (tick,)

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {"tick": self._tick[key], "clock": self._clock}

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # What the one-by-one inserts build: ticks first..end in entry order, and the
        # evictable keys appended to the queue's order in entry order (no side keys).
        if self._meta or not self._inserts_like(RecencyPolicy):
            return False
        first = self._add_columns(keys, metas, flags)
        self._tick.update(zip(keys, range(first, self._clock + 1), strict=True))
        self._queue.order.update(zip(compress(keys, flags), repeat(None)))
        return True


class LevelledRecencyPolicy(EvictionPolicy):
    """A policy that evicts the evictable entry of smallest `(_level(meta), tick)`.

    The level is read when the entry is inserted, hit or made evictable; the tick is the clock
    of its latest insert or hit. One `_TickQueue` per level holds its evictable keys, and a
    heap of levels (lazy deletion) finds the lowest: a hit or an insert is O(1) plus
    O(log levels) when it opens a level, `evict(1)` O(1) amortised while the lowest level
    stays. Priority (few levels) and LFU (hit counts, in libCacheSim's frequency lists) use it.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._tick: dict[Hashable, int] = {}  # key -> tick of its latest insert or hit
        self._queues: dict[Any, _TickQueue] = {}  # level -> its non-empty queue
        self._levels: list[Any] = []  # heap of levels; those without a queue are stale
        self._where: dict[Hashable, _TickQueue] = {}  # evictable key -> its queue

    level_attr: ClassVar[str | None] = None
    """When `_level(meta)` is just `getattr(meta, level_attr)`, its name: a bulk load then
    reads levels in C. A subclass that overrides `_level` must set this back to None."""

    @abstractmethod
    def _level(self, meta: EntryMeta) -> Any:
        """The entry's level; lower levels are evicted first."""

    def _queue_of(self, level: Any) -> _TickQueue:
        queue = self._queues.get(level)
        if queue is None:
            queue = self._queues[level] = _TickQueue(level, self._tick, False)
            levels = self._levels
            heapq.heappush(levels, level)
            if len(levels) > 2 * len(self._queues) + 16:
                self._levels = list(self._queues)
                heapq.heapify(self._levels)
        return queue

    def _unlink(self, key: Hashable) -> None:
        queue = self._where.pop(key)
        queue.discard(key)
        if not queue.order and not queue.side_live:
            del self._queues[queue.level]

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._tick[key] = self._clock
        if evictable:
            queue = self._queue_of(self._level(meta))
            queue.order[key] = None
            self._where[key] = queue

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._tick[key] = self._clock
        queue = self._where.get(key)
        if queue is None:
            return
        level = self._level(meta)
        if level == queue.level:
            queue.touch(key)
            return
        self._unlink(key)
        queue = self._queue_of(level)
        queue.order[key] = None
        self._where[key] = queue

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if evictable:
            queue = self._queue_of(self._level(meta))
            queue.add_old(key, self._tick[key])
            self._where[key] = queue
        else:
            self._unlink(key)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._tick[key]
        if was_evictable:
            self._unlink(key)

    def _pop_victim(self) -> Hashable:
        levels = self._levels
        queues = self._queues
        queue = queues.get(levels[0])
        while queue is None:
            heapq.heappop(levels)
            queue = queues.get(levels[0])
        key = queue.pop() if queue.side else queue.order.popitem(last=False)[0]
        if not queue.order and not queue.side_live:
            del queues[queue.level]
        del self._where[key]
        del self._tick[key]
        return key

    def rank(self, key: Hashable) -> tuple[Any, ...] | None:
        """`(level, tick)`: the level the key is queued at (read now when it is not evictable),
        then the logical time of its latest insert or hit."""
        meta = self.meta(key)
        queue = self._where.get(key)
        level = queue.level if queue is not None else self._level(meta)
        return (level, self._tick[key])

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        queue = self._where.get(key)
        return {"level": queue.level if queue is not None else self._level(meta), "tick": self._tick[key]}

    def _eviction_order(self) -> list[Hashable]:
        # Ticks are unique, so this is the order of (level, tick): each level's queue in turn.
        order: list[Hashable] = []
        queues = self._queues
        for level in sorted(queues):
            order.extend(queues[level].in_order())
        return order

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # What the one-by-one inserts build: ticks in entry order; levels opened (and pushed on
        # the level heap) in order of first appearance; each key appended to its level's queue
        # and entered in `_where` in entry order.
        if self._meta or not self._inserts_like(LevelledRecencyPolicy):
            return False
        first = self._add_columns(keys, metas, flags)
        self._tick.update(zip(keys, range(first, self._clock + 1), strict=True))
        held = list(compress(keys, flags))
        attr = self.level_attr
        level_of = operator.attrgetter(attr) if attr is not None else self._level
        levels = list(map(level_of, compress(metas, flags)))
        queues = self._queues
        for level in dict.fromkeys(levels):
            self._queue_of(level)
        if len(queues) == 1:
            queue = next(iter(queues.values()))
            queue.order.update(zip(held, repeat(None)))
            self._where.update(zip(held, repeat(queue)))
            return True
        set_in = {level: queue.order.__setitem__ for level, queue in queues.items()}
        _run(map(operator.call, map(set_in.__getitem__, levels), held, repeat(None)))
        self._where.update(zip(held, map(queues.__getitem__, levels), strict=True))
        return True
