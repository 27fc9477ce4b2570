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
over these lookups, exact up to its horizon; `ReuseTimes` counts every lookup (the reuse
distance at a hit: block lookups since the block's previous lookup).

`new_ghost_set` gives this module's `GhostSet` or, where every key is an int64 and the compiled
core is built, its twin in C (`engine_adapter.cache._ghosts.IntGhostSet`: same API, same results,
nothing per ghost a Python object). Imports nothing of the cache.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from sage_eviction import native

__all__ = [
    "GHOSTS_CORE",
    "Ghost",
    "GhostRecord",
    "GhostSet",
    "GhostStore",
    "ReuseClock",
    "ReuseTimes",
    "new_ghost_set",
]

GHOSTS_CORE = "engine_adapter.cache._ghosts"
"""The compiled ghost set for int64 keys (engine_adapter/cache/_ghosts.pyx)."""

_RUN = 1024
"""Positions per run of `ReuseClock`'s marks (a query counts one run's bytes, sums the rest)."""


class ReuseClock:
    """Distinct keys looked up since a moment, exact below `horizon` (capped at it).

    Each access takes the next position and marks it, clearing the key's previous mark, so the
    distinct keys since a position are the marks at or after it: O(1) per access; a query sums
    the marks of each run of `_RUN` positions after the stamp's and counts those of its own run
    (both at C speed). When the positions run out, the `horizon` most recent keys are
    renumbered from 0 and the others forgotten (a count reaching them is at least `horizon`
    anyway); `stamp`s taken before are mapped onto the new numbering with `compact`'s return
    value. Memory O(horizon).
    """

    __slots__ = ("_last", "_marks", "_now", "_runs", "_size", "horizon")

    def __init__(self, horizon: int) -> None:
        self.horizon = max(1, horizon)
        self._size = 8 * self.horizon + 64  # a byte each: compactions (a sort) stay rare
        self._marks = bytearray(self._size)
        self._runs = [0] * (self._size // _RUN + 1)  # marks per run of _RUN positions
        self._last: dict[Hashable, int] = {}
        self._now = 0

    def stamp(self) -> int:
        """The position the next access takes: `distinct_since` counts from here."""
        return self._now

    def distinct_since(self, stamp: int) -> int:
        """Distinct keys accessed at or after `stamp` (capped at `horizon`; a negative stamp:
        one from before the positions were renumbered, `horizon`)."""
        if stamp < 0:
            return self.horizon
        end = (stamp // _RUN + 1) * _RUN
        if end >= self._now:
            return min(self.horizon, self._marks.count(1, stamp, self._now))
        head = self._marks.count(1, stamp, end)
        return min(self.horizon, head + sum(self._runs[end // _RUN :]))

    def room(self, n: int) -> bool:
        """Whether `n` more accesses fit before `compact` is needed."""
        return self._now + n <= self._size

    @property
    def full(self) -> bool:
        """The next access needs `compact` first."""
        return self._now >= self._size

    def access_many(self, keys: Sequence[Hashable]) -> None:
        """`access` of each key in order (the caller made `room` for them). The keys of one
        prompt are distinct (chained hashes); a key given twice would count twice."""
        last, marks, runs, pos, n = self._last, self._marks, self._runs, self._now, len(keys)
        for prev in map(last.get, keys):
            if prev is not None:
                marks[prev] = 0
                runs[prev // _RUN] -= 1
        marks[pos : pos + n] = b"\x01" * n
        end = pos + n
        while pos < end:  # each run the new positions fall in
            step = min(end, (pos // _RUN + 1) * _RUN) - pos
            runs[pos // _RUN] += step
            pos += step
        last.update(zip(keys, range(end - n, end), strict=True))
        self._now = end

    def access(self, key: Hashable) -> None:
        """Record an access of `key` (call `compact` first when `full`)."""
        prev = self._last.get(key)
        if prev is not None:
            self._marks[prev] = 0
            self._runs[prev // _RUN] -= 1
        pos = self._now
        self._marks[pos] = 1
        self._runs[pos // _RUN] += 1
        self._last[key] = pos
        self._now = pos + 1

    def compact(self) -> Callable[[int], int]:
        """Keep the `horizon` most recent keys, renumbered from 0; returns the map of an old
        stamp onto the new numbering (-1 for one older than every key kept, whose count is
        then `horizon` or more)."""
        keep = sorted(self._last.items(), key=lambda item: item[1])[-self.horizon :]
        self._last = {}
        self._marks = bytearray(self._size)
        self._runs = [0] * len(self._runs)
        self._now = 0
        self.access_many([key for key, _ in keep])
        old = [pos for _, pos in keep]
        dropped = len(keep) == self.horizon  # older keys were forgotten

        def remap(stamp: int) -> int:
            if stamp < 0 or (dropped and stamp < old[0]):
                return -1
            return bisect_left(old, stamp)

        return remap


class ReuseTimes:
    """Block lookups since a key's previous lookup (its reuse time), O(1) per lookup.

    Remembers the keys looked up in the last `horizon` lookups or so: past 2 * `horizon` keys the
    older half is forgotten, and a forgotten key's reuse time is reported as `horizon` (the
    histogram's top buckets).
    """

    __slots__ = ("_last", "_now", "horizon")

    def __init__(self, horizon: int) -> None:
        self.horizon = max(1, horizon)
        self._last: dict[Hashable, int] = {}
        self._now = 0

    def access(self, key: Hashable) -> int | None:
        """Record a lookup of `key`; returns lookups since its previous one (None: new or forgotten)."""
        return self.access_many((key,))[0]

    def access_many(self, keys: Sequence[Hashable], n_timed: int | None = None) -> list[int | None]:
        """`access` of each key in order (distinct keys, as one prompt's); the reuse times of
        the first `n_timed` (all by default)."""
        last, now, n = self._last, self._now, len(keys)
        timed = keys if n_timed is None else keys[:n_timed]
        out = [None if prev is None else now + i - prev - 1 for i, prev in enumerate(map(last.get, timed))]
        last.update(zip(keys, range(now, now + n), strict=True))
        self._now = now + n
        if len(last) > 2 * self.horizon:
            cut = sorted(last.values())[len(last) // 2]
            self._last = {k: p for k, p in last.items() if p >= cut}
        return out


@dataclass(slots=True)
class Ghost:
    """An evicted block remembered (what `GhostSet.lookup` and `peek` give back).

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


class _Eviction:
    """What the victims of one eviction call share: its time, the clock's position, the blocks
    kept and the policy. The set stores one of these per call and, per victim, only the tuple
    (eviction id, tenant, this), so that an eviction of many blocks builds no object per victim
    (a `Ghost` is made only when a lookup finds one)."""

    __slots__ = ("evicted_at", "kept", "policy", "stamp")

    def __init__(self, evicted_at: float, stamp: int, kept: int, policy: str) -> None:
        self.evicted_at = evicted_at
        self.stamp = stamp
        self.kept = kept
        self.policy = policy


GhostRecord = tuple[int, "str | None", _Eviction]
"""A ghost as stored: its eviction id, its tenant, its eviction call's shared fields."""


def _ghost(record: GhostRecord) -> Ghost:
    eviction_id, tenant, call = record
    return Ghost(eviction_id, call.evicted_at, call.stamp, call.kept, call.policy, tenant)


class GhostSet:
    """At most `capacity` evicted keys, oldest dropped first, and the clocks of the lookups.

    Args:
        capacity: Ghosts kept (at least 1).
        horizon: The clocks' horizon: distinct counts are exact below it (at least the cache's
            capacity, so that any `kept` count is within it), reuse times remembered about as far.
    """

    __slots__ = ("_counted", "_ghosts", "capacity", "times")

    def __init__(self, capacity: int, horizon: int) -> None:
        if capacity < 1:
            raise ValueError(f"ghost capacity {capacity} must be at least 1")
        self.capacity = capacity
        self.times = ReuseTimes(horizon)  # every lookup: reuse times
        self._counted = ReuseClock(horizon)  # hits and ghost misses: regrets
        self._ghosts: OrderedDict[Hashable, GhostRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ghosts)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._ghosts

    def _room(self, n: int) -> None:
        regret = self._counted
        if not regret.room(n):
            remap = regret.compact()
            # each eviction call's stamp once, however many of its victims are still ghosts
            calls = {id(call): call for _, _, call in self._ghosts.values()}
            for call in calls.values():
                call.stamp = remap(call.stamp)

    def lookup(
        self, keys: Sequence[Hashable], n_hit: int
    ) -> tuple[list[int | None], list[tuple[int, Ghost, bool]]]:
        """A lookup of `keys` that hit the first `n_hit`: the hits' reuse times (`ReuseTimes`),
        and for each missed key that was a ghost its index, its ghost (removed) and whether its
        return is a regret. Hits and ghost misses count for later regrets, in order."""
        n = len(keys)
        self._room(n)
        regret = self._counted
        if n_hit:
            regret.access_many(keys[:n_hit])
        ghosts: list[tuple[int, Ghost, bool]] = []
        records = self._ghosts
        # most lookups miss no ghost: one set intersection (a C loop) says which keys to visit
        back = records.keys() & keys[n_hit:] if n > n_hit and records else None
        if back:
            pop = records.pop
            for i in range(n_hit, n):
                key = keys[i]
                if key not in back:
                    continue
                record = pop(key, None)  # None: a key given twice, popped the first time
                if record is not None:  # counted from its eviction, before this lookup of it
                    call = record[2]
                    ghosts.append((i, _ghost(record), regret.distinct_since(call.stamp) < call.kept))
                    regret.access(key)
        return self.times.access_many(keys, n_hit), ghosts

    def stamp(self) -> int:
        """The counted lookups' position now: a ghost made now counts from here."""
        return self._counted.stamp()

    def add(self, key: Hashable, ghost: Ghost) -> None:
        """`key` was evicted (a ghost again if it already was, with the new eviction)."""
        call = _Eviction(ghost.evicted_at, ghost.stamp, ghost.kept, ghost.policy)
        self.add_records(((key, (ghost.eviction_id, ghost.tenant, call)),))

    def add_records(self, evicted: Sequence[tuple[Hashable, GhostRecord]]) -> None:
        """`add` of each (key, record), in order; a record is (eviction id, tenant, the
        eviction call's shared fields from `eviction`)."""
        ghosts = self._ghosts
        pop, popitem = ghosts.pop, ghosts.popitem
        for key, record in evicted:
            pop(key, None)
            ghosts[key] = record
        for _ in range(len(ghosts) - self.capacity):
            popitem(last=False)

    def add_many(
        self, keys: Sequence[Hashable], ids: Sequence[int], tenants: Sequence[str | None], call: _Eviction
    ) -> None:
        """`add_records` of one eviction call's victims: each key with its eviction id (`ids`) and
        tenant (the same order), all sharing `call` (from `eviction`)."""
        if not len(keys) == len(ids) == len(tenants):
            raise ValueError("add_many: keys, eviction ids and tenants differ in length")
        records = zip(ids, tenants, itertools.repeat(call), strict=False)  # repeat: no end
        self.add_records(list(zip(keys, records, strict=True)))

    @staticmethod
    def eviction(evicted_at: float, stamp: int, kept: int, policy: str) -> _Eviction:
        """The shared fields of one eviction call's ghosts (for `add_records`)."""
        return _Eviction(evicted_at, stamp, kept, policy)

    def peek(self, key: Hashable) -> Ghost | None:
        """The ghost of `key`, left in place, or None."""
        record = self._ghosts.get(key)
        return None if record is None else _ghost(record)

    def clear(self) -> None:
        """Forget every ghost (a cache reset: what comes back then was not evicted)."""
        self._ghosts.clear()


class _Horizon(Protocol):
    @property
    def horizon(self) -> int: ...


class GhostStore(Protocol):
    """What the accounting uses of a ghost set: `GhostSet`'s API, which the compiled
    `IntGhostSet` has too."""

    @property
    def capacity(self) -> int: ...
    @property
    def times(self) -> _Horizon: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: Hashable) -> bool: ...
    def lookup(
        self, keys: Sequence[Hashable], n_hit: int
    ) -> tuple[list[int | None], list[tuple[int, Ghost, bool]]]: ...
    def stamp(self) -> int: ...
    def add(self, key: Hashable, ghost: Ghost) -> None: ...
    def add_records(self, evicted: Sequence[tuple[Hashable, GhostRecord]]) -> None: ...
    def add_many(
        self, keys: Sequence[Hashable], ids: Sequence[int], tenants: Sequence[str | None], call: _Eviction
    ) -> None: ...
    def eviction(self, evicted_at: float, stamp: int, kept: int, policy: str) -> _Eviction: ...
    def peek(self, key: Hashable) -> Ghost | None: ...
    def clear(self) -> None: ...


def new_ghost_set(capacity: int, horizon: int, int_keys: bool = False) -> GhostStore:
    """A ghost set of `capacity` keys (`GhostSet`'s arguments): the compiled one when the caller
    knows every key is an int64 (`int_keys`) and the core is built (not `SAGE_PURE_PYTHON`, not
    inside `native.pure_python()`), else `GhostSet`. A non-int key given to the compiled one
    raises TypeError or OverflowError, so the flag is a promise, checked once by the caller
    (the simulator asks `workloads.int64_keys`)."""
    if int_keys and native.implementation(GHOSTS_CORE) == "compiled":
        module = native.load(GHOSTS_CORE)
        if module is not None:
            return cast(GhostStore, module.IntGhostSet(capacity, horizon))
    return GhostSet(capacity, horizon)
