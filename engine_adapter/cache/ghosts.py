"""The regret ghost set: recently evicted block keys, and which of their returns were avoidable.

A lookup that misses a block evicted not long before is the policy's regret. ARC and S3-FIFO keep
such ghost lists inside for their own decisions; this one is the cache's, whatever the policy,
and only counts (docs/architecture.md, "Ages and regret").

`GhostSet` holds at most `capacity` evicted keys (a multiple of the cache's capacity, first in
first out). A miss on a ghost is a *ghost hit*; it is a *regret* when the eviction was
avoidable by the pigeonhole: when the victim left, `kept` other blocks stayed reclaimable
(cached, unpinned, held by no running request); if fewer than `kept` distinct blocks that could
be among them were looked up between its eviction and its return, one of those kept blocks was
not used before the victim came back, so keeping the victim in its place would have saved this
miss. Belady (the furthest next use) makes such a choice only where the radix tree forbids the
better one (only leaves go), so its regrets are 0 on a loop one block larger than the cache,
where LRU regrets every miss (tests/test_cache_regret.py), and on the synthetic workloads
tried (tests/test_cache_ages.py).

Which lookups count: a hit (the block is cached), or a miss on a ghost (cached until an
eviction). A miss on a block neither cached nor remembered cannot be one of the kept blocks:
had it been, it was evicted after the victim and then pushed out of the first-in first-out
ghost set, and the victim, older, would be gone from it too. Counting only these keeps new
content (a prompt's fresh blocks) from hiding regrets. The distinct count is a `ReuseClock`
of its own over these lookups, exact up to its horizon; `clock` counts every lookup (the
reuse distance at a hit).

Imports nothing of the cache.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["Ghost", "GhostSet", "ReuseClock"]


class ReuseClock:
    """Distinct keys looked up since a moment, exact below `horizon` (capped at it).

    Each access takes the next position; a Fenwick tree marks each key's latest position, so the
    distinct keys since a position are the marks at or after it: O(log n) per access and query.
    When the positions run out, the `horizon` most recent keys are renumbered from 0 and the
    others forgotten (a count reaching them is at least `horizon` anyway); `stamp`s taken before
    are mapped onto the new numbering by `compact`'s return value. Memory O(horizon).
    """

    __slots__ = ("_last", "_now", "_size", "_tree", "horizon")

    def __init__(self, horizon: int) -> None:
        self.horizon = max(1, horizon)
        self._size = 4 * self.horizon + 64
        self._tree = [0] * (self._size + 1)
        self._last: dict[Hashable, int] = {}
        self._now = 0

    def _add(self, pos: int, delta: int) -> None:
        i, tree, size = pos + 1, self._tree, self._size
        while i <= size:
            tree[i] += delta
            i += i & -i

    def _before(self, pos: int) -> int:
        """Keys whose latest access is before `pos`."""
        i, tree, total = pos, self._tree, 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    def stamp(self) -> int:
        """The position the next access takes: `distinct_since` counts from here."""
        return self._now

    def distinct_since(self, stamp: int) -> int:
        """Distinct keys accessed at or after `stamp` (capped at `horizon`)."""
        return min(self.horizon, len(self._last) - self._before(stamp))

    @property
    def full(self) -> bool:
        """The next access needs `compact` first."""
        return self._now >= self._size

    def access(self, key: Hashable) -> int | None:
        """Record an access of `key`; returns its reuse distance (distinct keys accessed since its
        previous access, capped at `horizon`), or None when it is new or forgotten. Call
        `compact` first when `full`."""
        prev = self._last.get(key)
        distance = None
        if prev is not None:
            distance = min(self.horizon, len(self._last) - self._before(prev + 1))
            self._add(prev, -1)
        pos = self._now
        self._now = pos + 1
        self._last[key] = pos
        self._add(pos, 1)
        return distance

    def compact(self) -> list[int]:
        """Keep the `horizon` most recent keys, renumbered from 0; returns their old positions in
        order, so that an old stamp ``s`` becomes ``bisect_left(old, s)``."""
        keep = sorted(self._last.items(), key=lambda item: item[1])[-self.horizon :]
        self._last = {key: i for i, (key, _) in enumerate(keep)}
        self._tree = [0] * (self._size + 1)
        for i in range(len(keep)):
            self._add(i, 1)
        self._now = len(keep)
        return [pos for _, pos in keep]


@dataclass(slots=True)
class Ghost:
    """An evicted block remembered.

    Attributes:
        eviction_id: Its eviction's number (the cache's count of evicted blocks, 1 first; the
            ``id`` of its ``evict`` event).
        evicted_at: When, on the cache's clock.
        stamp: The counted lookups' clock position at its eviction (`GhostSet.stamp`).
        kept: Reclaimable blocks that stayed when it went.
        policy: The policy that evicted it.
        tenant: Its tenant.
    """

    eviction_id: int
    evicted_at: float
    stamp: int
    kept: int
    policy: str
    tenant: str | None


class GhostSet:
    """At most `capacity` evicted keys, oldest dropped first, and the clocks of the lookups.

    Args:
        capacity: Ghosts kept (at least 1).
        horizon: The clock's horizon: distinct counts are exact below it (at least the cache's
            capacity, so that any `kept` count is within it).
    """

    __slots__ = ("_counted", "_ghosts", "capacity", "clock")

    def __init__(self, capacity: int, horizon: int) -> None:
        if capacity < 1:
            raise ValueError(f"ghost capacity {capacity} must be at least 1")
        self.capacity = capacity
        self.clock = ReuseClock(horizon)  # every lookup: reuse distances
        self._counted = ReuseClock(horizon)  # hits and ghost misses: regrets
        self._ghosts: OrderedDict[Hashable, Ghost] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ghosts)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._ghosts

    def access(self, key: Hashable, counted: bool) -> int | None:
        """A lookup of `key`; `counted` when it hit or missed a ghost. Returns its reuse
        distance (`ReuseClock.access` of `clock`)."""
        if counted:
            regret = self._counted
            if regret.full:
                old = regret.compact()
                for ghost in self._ghosts.values():
                    ghost.stamp = bisect_left(old, ghost.stamp)
            regret.access(key)
        clock = self.clock
        if clock.full:
            clock.compact()
        return clock.access(key)

    def stamp(self) -> int:
        """The counted lookups' position now: a ghost made now counts from here."""
        return self._counted.stamp()

    def add(self, key: Hashable, ghost: Ghost) -> None:
        """`key` was evicted (a ghost again if it already was, with the new eviction)."""
        ghosts = self._ghosts
        ghosts.pop(key, None)
        ghosts[key] = ghost
        if len(ghosts) > self.capacity:
            ghosts.popitem(last=False)

    def peek(self, key: Hashable) -> Ghost | None:
        """The ghost of `key`, left in place, or None."""
        return self._ghosts.get(key)

    def take(self, key: Hashable) -> tuple[Ghost, bool] | None:
        """A miss on `key`: its ghost (removed) and whether its return is a regret, or None."""
        ghost = self._ghosts.pop(key, None)
        if ghost is None:
            return None
        return ghost, self._counted.distinct_since(ghost.stamp) < ghost.kept

    def clear(self) -> None:
        """Forget every ghost (a cache reset: what comes back then was not evicted)."""
        self._ghosts.clear()
