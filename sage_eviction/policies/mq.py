"""Multi-Queue: LRU queues by access frequency, lifetimes that demote, a history of the evicted.

Source: Zhou, Philbin and Li, "The Multi-Queue Replacement Algorithm for Second Level Buffer
Caches", USENIX ATC 2001.

MQ keeps `n_queues` LRU queues Q0..Q(m-1). A block seen `f` times lives in queue
QueueNum(f) = min(floor(log2 f), m - 1), so blocks used often sit in higher queues and leave
last: the victim is the LRU block of the lowest non-empty queue. Each block carries an expiry,
`lifetime` ticks of a virtual clock after its last hit or insert; the clock ticks once per hit
and once per insert, and at each tick the LRU block of every queue above Q0 whose expiry has
passed drops one queue (the paper's Adjust), so a block that was hot long ago sinks to Q0 and
can leave. Evicted blocks' frequencies are remembered in a FIFO history Qout of
`qout_ratio * capacity` keys; a block that comes back while remembered resumes at its old
frequency plus one.

The defaults and the order of events are libCacheSim's (n-queue=8, lifetime=10000,
Qout-size-ratio=4): a hit promotes, then Adjust runs; a miss looks the key up in Qout (through
`prepare_insert`, before the evictions that make room, or at `insert` when the cache does not
call it), the victims enter Qout with their frequency, the new block enters its queue, then
Adjust runs. tests/test_libcachesim_oracle.py checks the miss counts against libCacheSim's MQ.

Blocks that are not evictable (in use in the radix cache) keep their frequency, queue and
expiry but are unlinked from their queue, so neither eviction nor Adjust sees them; when one
becomes evictable again it is linked at the MRU end of its queue (it was in use until now).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import DuplicateKeyError
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["MQPolicy"]

_NO_KEY: Any = object()  # "no pending key" (None is a valid key)


class MQPolicy(EvictionPolicy):
    """MQ over blocks: frequency-ranked LRU queues with lifetimes, and a history of the evicted.

    Args:
        capacity: The cache size in blocks (required): it sizes the history Qout.
        n_queues: Number of LRU queues (the paper's m).
        lifetime: Ticks (hits and inserts) a block stays in its queue without a hit before it
            drops one queue.
        qout_ratio: Qout holds this many times `capacity` evicted keys.
    """

    name = "mq"
    strategy = EvictionStrategy.MQ
    paper = (
        "Zhou, Philbin and Li, The Multi-Queue Replacement Algorithm for Second Level Buffer "
        "Caches, USENIX ATC 2001"
    )
    order_preserving = True
    needs_capacity = True

    def __init__(
        self, capacity: int | None = None, n_queues: int = 8, lifetime: int = 10_000, qout_ratio: float = 4.0
    ) -> None:
        super().__init__(capacity)
        if capacity is None:  # the base already raised; this narrows the type
            raise ValueError("mq needs capacity")
        if n_queues < 1:
            raise ValueError(f"n_queues={n_queues} must be at least 1")
        if lifetime < 1:
            raise ValueError(f"lifetime={lifetime} must be at least 1 tick")
        if qout_ratio < 0:
            raise ValueError(f"qout_ratio={qout_ratio} must not be negative")
        self._n_queues = n_queues
        self._lifetime = lifetime
        self._qout_size = int(capacity * qout_ratio)
        # Evictable keys of each queue, LRU first. Keys in use are in _queue_of only.
        self._queues: list[OrderedDict[Hashable, None]] = [OrderedDict() for _ in range(n_queues)]
        self._queue_of: dict[Hashable, int] = {}
        self._freq: dict[Hashable, int] = {}
        self._expire: dict[Hashable, int] = {}
        self._qout: OrderedDict[Hashable, int] = OrderedDict()  # evicted key -> frequency, oldest first
        self._vtime = 0
        self._pending_key: Any = _NO_KEY
        self._pending_freq = 0  # the pending key's remembered frequency; 0: not remembered

    # ---- introspection -----------------------------------------------------------------------

    def queue_of(self, key: Hashable) -> int | None:
        """The queue a held key belongs to, or None."""
        return self._queue_of.get(key)

    def queue_sizes(self) -> list[int]:
        """Evictable keys per queue, Q0 first."""
        return [len(q) for q in self._queues]

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(queues=self.queue_sizes(), qout=len(self._qout), vtime=self._vtime)
        return out

    explains_by = "its queue (by frequency, lowest first), LRU within it; lifetimes demote"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {
            "queue": self._queue_of[key],
            "frequency": self._freq[key],
            "expires_at": self._expire[key],
            "vtime": self._vtime,
        }

    # ---- the paper's QueueNum and Adjust ------------------------------------------------------

    def _queue_num(self, freq: int) -> int:
        return min(freq.bit_length() - 1, self._n_queues - 1)

    def _link(self, key: Hashable, queue: int, evictable: bool) -> None:
        self._queue_of[key] = queue
        self._expire[key] = self._vtime + self._lifetime
        if evictable:
            self._queues[queue][key] = None

    def _adjust(self) -> None:
        self._vtime = vtime = self._vtime + 1
        queues, expire = self._queues, self._expire
        for k in range(1, self._n_queues):
            queue = queues[k]
            if not queue:
                continue
            key = next(iter(queue))
            if expire[key] < vtime:
                del queue[key]
                queues[k - 1][key] = None
                self._queue_of[key] = k - 1
                expire[key] = vtime + self._lifetime

    def _remember(self, key: Hashable, freq: int) -> None:
        if self._qout_size <= 0:
            return
        qout = self._qout
        if len(qout) >= self._qout_size:
            qout.popitem(last=False)
        qout[key] = freq

    # ---- hooks -------------------------------------------------------------------------------

    def prepare_insert(self, key: Hashable) -> None:
        """A miss on `key` will be inserted after the evictions that make room for it.

        Optional: it takes the key's remembered frequency out of Qout before the evictions
        push new keys into it, as libCacheSim orders it.

        Raises:
            DuplicateKeyError: The key is already held.
        """
        if key in self._queue_of:
            raise DuplicateKeyError(f"{self.name}: prepare_insert of key {key!r}, which is held")
        self._pending_key = key
        self._pending_freq = self._qout.pop(key, 0)

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if self._pending_key is not _NO_KEY and self._pending_key == key:
            remembered = self._pending_freq
        else:
            remembered = self._qout.pop(key, 0)
        self._pending_key = _NO_KEY
        self._pending_freq = 0
        freq = remembered + 1
        self._freq[key] = freq
        self._link(key, self._queue_num(freq), evictable)
        self._adjust()

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        old = self._queue_of[key]
        freq = self._freq[key] + 1
        self._freq[key] = freq
        evictable = key in self._evictable
        if evictable:
            del self._queues[old][key]
        self._link(key, self._queue_num(freq), evictable)
        self._adjust()

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        queue = self._queues[self._queue_of[key]]
        if evictable:
            queue[key] = None  # MRU end: it was in use until now
        else:
            del queue[key]

    def _forget(self, key: Hashable) -> int:
        del self._queue_of[key]
        del self._expire[key]
        return self._freq.pop(key)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        if was_evictable:
            del self._queues[self._queue_of[key]][key]
        self._forget(key)
        self._qout.pop(key, None)  # libCacheSim's remove forgets the history too

    def _pop_victim(self) -> Hashable:
        for queue in self._queues:
            if queue:
                key, _ = queue.popitem(last=False)
                self._remember(key, self._forget(key))
                return key
        raise AssertionError("unreachable: the base calls _pop_victim only with evictable entries")

    def _eviction_order(self) -> list[Hashable]:
        order: list[Hashable] = []
        for queue in self._queues:
            order.extend(queue)
        return order
