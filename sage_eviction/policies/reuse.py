"""Learned reuse: evict the block least likely to be requested again, learnt online per feature
bucket and idle time, comparing only the heads of per-bucket recency queues; a miniature LRU
cache beside a miniature of the learned ranking decides which of the two the cache follows.

Sources: Wang et al., "KVCache Cache in the Wild: Characterizing and Optimizing KVCache Cache
at a Large Cloud Provider", USENIX ATC 2025 (a per-category reuse probability that decays with
the time since last access; a prompt's head blocks valued over its tail); Beckmann, Chen and
Cidon, "LHD: Improving Cache Hit Rate by Maximizing Hit Density", NSDI 2018 (reuse learnt per
class and age, the age quantised on a log scale); Waldspurger et al., "Cache Modeling and
Optimization using Miniature Simulations", USENIX ATC 2017, and Qureshi et al.'s set dueling
(ISCA 2007) (sampled miniature caches choose the policy the cache follows).

**Buckets.** Each block falls in one of `_BUCKETS` (60) buckets: its position from the end of the
prompt that inserted it (`pos_from_end`: generated output, the last block, 1, 2-3, 4+), its
earlier requests (0, 1, 2+: each request that came within a window of the previous one counts,
whether the block stayed in the cache or came back after an eviction, so frequency survives an
eviction as MQ's history keeps it) and its depth in the radix tree (0-1, 2-5, 6-29, 30+). A flat
cache passes `EntryMeta()`, so there only the requests distinguish blocks. The evictable blocks
of a bucket sit in a queue by the tick of their last request (`sage_eviction.recency`'s
`_TickQueue`: a block made evictable again keeps its tick, as in `lru`): within a bucket the
least recently used is the least valuable, so an eviction compares only the bucket heads.

**What is learnt.** Every insert or hit of a block opens a *trial* for the bucket it is in
after it; the trial succeeds when the key is requested again (a hit, or an insert after it was
evicted) within `window * capacity` ticks (one tick per insert or hit), and fails when the
window passes first. Trials do not depend on which policy evicts what, since a re-insert of an
evicted key counts as a reuse. Per bucket the policy keeps decayed counts of trials, and of
reuses per *age class* of their gap (log2 of the gap in sixteenths of a capacity); every count
is halved each time `window * capacity` trials have ended, so knowledge ages. Every
`capacity / 8` ended trials (at least 64) it recomputes a table: per (bucket, age class `c`), of
the bucket's trials not reused before class `c`, the share reused later (within the window),
shrunk toward all buckets' share at `c` by a prior of `_PRIOR` trials. Between two recomputes
the table is fixed, so an `evict(n)` drains in the order `peek` gives.

**Ranking.** The bucket head whose (bucket, age class of its idle time) has the least reuse
probability leaves (ties: the lower bucket); a block idle past the window leaves first. Each
head's score is cached until its bucket's head changes, its age class changes or the table is
recomputed, so `evict(1)` rescores a bucket or two and scans `_BUCKETS` floats in C. (Tried
and dropped, on the synthetic traces: LHD's hit density, probability over expected time in
cache, and probability over time to reuse; both lost to the plain probability in every cell.)

**Safety.** The evictable keys also sit in one queue by tick: LRU's order. A 1/`S` hash sample
of the keys (`S` a power of two up to `_MAX_SAMPLE`, keeping `capacity / S` at `_MINI` blocks or
more) drives two miniature caches of `capacity / S` blocks: one LRU, one ranking as above with
the same table. Their hits are counted (halved every `_DUEL_WINDOWS` windows); the cache evicts
by the learned ranking once its miniature has `_ENTER_HITS` more hits than the LRU miniature, and
by LRU from the start and again as soon as it has fewer. Where the ranking does not pay, the
cache is LRU up to the miniatures' noise and the cost of a switch.

**Memory.** Per held block: a tick, a bucket, a place in the LRU queue and one in its bucket's
queue. Per key requested in the last `window * capacity` ticks, held or not: one open trial (a
dict entry and a deque item). The miniatures hold at most `2 * capacity / S` keys. Fixed tables
of `_BUCKETS * ages` cells (ages: about 9 at the default window).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator
from itertools import islice
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.recency import _TickQueue
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["ReusePolicy", "bucket_of"]

_INF = float("inf")
_NO_KEY: Any = object()  # an empty bucket's head (None is a valid key)

_POSITIONS = 5  # generated output, then the prompt's last block, 1, 2-3, 4+ from its end
_HITS = 3  # requests before this one, each within a window of the previous: 0, 1, 2+
_DEPTHS = 4  # depth 0-1, 2-5, 6-29, 30+ (log4 steps)
_BUCKETS = _POSITIONS * _HITS * _DEPTHS
_PRIOR = 4.0  # trials at all buckets' rate each (bucket, age) cell starts with
_MINI = 1024  # blocks each miniature cache holds at least (else every key is sampled)
_MAX_SAMPLE = 4  # at most 1 key in 4 drives the miniatures (a sparser sample hid the learned
# ranking's gain on the Mooncake synthetic trace: its miniature lost to LRU's where the cache won)
_DUEL_WINDOWS = 8  # the miniatures' hit counts are halved every this many windows of ticks
_ENTER_HITS = 8.0  # the learned ranking takes over when its miniature hits this many more than
# LRU's, and gives back as soon as it hits fewer: the gap between the two damps flapping, which
# costs more than either ranking (each switch leaves a cache shaped for the other)


def bucket_of(meta: EntryMeta, hits: int) -> int:
    """The feature bucket of a block: position from its prompt's end, `hits` (its requests
    before this one that each came within a window of the previous), depth."""
    pos = meta.pos_from_end
    position = 0 if pos < 0 else min((pos + 1).bit_length(), _POSITIONS - 1)
    depth = (meta.depth + 2).bit_length() >> 1  # 0-1: 0, 2-5: 1, 6-29: 2 ... (log4 steps)
    return (position * _HITS + (hits if hits < _HITS else _HITS - 1)) * _DEPTHS + (
        depth if depth < _DEPTHS else _DEPTHS - 1
    )


class _Queue(_TickQueue):
    """One bucket's evictable keys by tick (`_TickQueue`, oldest first), with its head."""

    __slots__ = ()

    def head(self) -> Hashable:
        """The key `pop` would take, left in place."""
        order = self.order
        side = self.side
        if side:
            side_live = self.side_live
            while side:
                tick, key = side[0]
                if side_live.get(key) == tick:
                    if not order or tick < self.ticks[next(iter(order))]:
                        return key
                    break
                heapq.heappop(side)  # stale
        return next(iter(order))


class _Ranked:
    """Evictable keys in per-bucket queues by tick (the time of their last request); the victim
    is the bucket head of least value in the policy's table (ties: the lower bucket).

    Each bucket's head score is cached (`scores`, +inf when empty) with the tick at which the
    head's age class changes; a bucket whose head may have changed is `dirty`. `victim` rescores
    only dirty or expired buckets, then takes the minimum of the cached scores (C-level), so
    `evict(1)` costs O(1) Python steps plus a scan of `_BUCKETS` floats."""

    def __init__(self, ticks: dict[Hashable, int]) -> None:
        self.ticks = ticks
        self.queues = [_Queue(bucket, ticks, False) for bucket in range(_BUCKETS)]
        self.where: dict[Hashable, int] = {}
        self.scores = [_INF] * _BUCKETS
        self.heads: list[Any] = [_NO_KEY] * _BUCKETS  # each clean bucket's head
        self.until = [0] * _BUCKETS  # the tick at which the cached head score expires
        self.expiry = 0  # min(until): a cached score may expire from then
        self.dirty: set[int] = set()
        self.version = -1  # the table version the cached scores were read from

    def add(self, key: Hashable, bucket: int) -> None:
        """`key` (its tick set) joins `bucket`'s queue; its tick may be older than others'."""
        queue = self.queues[bucket]
        order = queue.order
        if order and not queue.side_live and self.ticks[key] > self.ticks[next(reversed(order))]:
            order[key] = None  # the newest: the head stays
        else:
            queue.add_old(key, self.ticks[key])
            self.dirty.add(bucket)
        self.where[key] = bucket

    def discard(self, key: Hashable) -> None:
        bucket = self.where.pop(key, None)
        if bucket is not None:
            self.queues[bucket].discard(key)
            if self.heads[bucket] == key:  # else the head stays (or the bucket is dirty already)
                self.dirty.add(bucket)

    def _rescore(self, buckets: Iterable[int], now: int, model: _Model) -> None:
        ticks, scores, heads, until = self.ticks, self.scores, self.heads, self.until
        value, ages, scale, class_end = model.value, model.ages, model.scale, model.class_end
        last = ages - 1
        expiry = self.expiry
        for bucket in buckets:
            queue = self.queues[bucket]
            if queue.order or queue.side_live:
                key = queue.head()
                tick = ticks[key]
                cls = ((now - tick) * 16 // scale).bit_length()
                if cls > last:
                    cls = last
                scores[bucket] = value[bucket * ages + cls]
                heads[bucket] = key
                until[bucket] = end = tick + class_end[cls]
                if end < expiry:
                    expiry = end
            else:
                scores[bucket] = _INF
                heads[bucket] = _NO_KEY
                until[bucket] = 1 << 62
        # a lower bound: a bucket whose expiry moved later leaves it early, and the full rescore
        # it then causes sets it exactly
        self.expiry = expiry

    def victim(self, now: int, model: _Model) -> Hashable:
        if self.version != model.version or now >= self.expiry:
            self.version = model.version
            self.dirty.clear()
            self.expiry = 1 << 62
            self._rescore(range(_BUCKETS), now, model)
        elif self.dirty:
            self._rescore(self.dirty, now, model)
            self.dirty.clear()
        scores = self.scores
        key: Hashable = self.heads[scores.index(min(scores))]
        return key

    def order(self, now: int, model: _Model) -> Iterator[Hashable]:
        """Every key in the order repeated `victim` calls would take them."""
        ticks = self.ticks
        value = model.value
        ages = model.ages
        heap: list[tuple[float, int, Hashable, Iterator[Hashable]]] = []

        def push(bucket: int, keys: Iterator[Hashable]) -> None:
            key = next(keys, None)
            if key is not None:
                score = value[bucket * ages + model.age_class(now - ticks[key])]
                heapq.heappush(heap, (score, bucket, key, keys))

        for bucket, queue in enumerate(self.queues):
            push(bucket, iter(queue.in_order()))
        while heap:
            _, bucket, key, keys = heapq.heappop(heap)
            yield key
            push(bucket, keys)


class _Model:
    """The learnt table: per (bucket, age class), the probability that a block of the bucket
    idle that long is requested again within the window. Counts of trials (per bucket) and of
    reuses (per bucket and age class of the gap), halved every window of ended trials; the
    table is recomputed from them every `refresh_every` ended trials (`version` counts it)."""

    def __init__(self, capacity: int, window: int) -> None:
        self.scale = capacity
        self.window = window
        # age classes: log2 of 16 * age / capacity; the last one is past the window
        self.ages = (window * 16 // capacity).bit_length() + 2
        # the first age (ticks) of the next class, per class
        self.class_end = [-(-(capacity << cls) // 16) for cls in range(self.ages)]
        self.class_end[-1] = 1 << 62
        self.trials = [0.0] * _BUCKETS
        self.reuses = [0.0] * (_BUCKETS * self.ages)
        # all equal until the first refresh: the lowest nonempty bucket's head leaves
        self.value = [0.0] * (_BUCKETS * self.ages)
        self.version = 0
        self.ended = 0
        self.since = 0
        self.refresh_every = max(64, capacity // 8)

    def age_class(self, age: int) -> int:
        cls = (age * 16 // self.scale).bit_length()
        return cls if cls < self.ages - 1 else self.ages - 1

    def end_trial(self, bucket: int, gap: int) -> None:
        """A trial of `bucket` ended: reused after `gap` ticks, or (gap < 0) not in the window."""
        self.trials[bucket] += 1.0
        if gap >= 0:
            self.reuses[bucket * self.ages + self.age_class(gap)] += 1.0
        self.ended += 1
        if self.ended >= self.window:  # knowledge ages: every count halves
            self.ended = 0
            self.trials = [t * 0.5 for t in self.trials]
            self.reuses = [r * 0.5 for r in self.reuses]
        self.since += 1
        if self.since >= self.refresh_every:
            self.refresh()

    def refresh(self) -> None:
        """Per (bucket, age class c): of the bucket's trials that were not reused before class
        c, the share reused later, shrunk toward all buckets' share by `_PRIOR` trials."""
        self.since = 0
        self.version += 1
        ages = self.ages
        reuses = self.reuses
        all_reuses = [sum(reuses[c::ages]) for c in range(ages)]
        prior = []
        survived, after = sum(self.trials), sum(all_reuses)
        for c in range(ages):
            prior.append(_PRIOR * (after + 0.5) / (survived + 1.0))
            survived -= all_reuses[c]
            after -= all_reuses[c]
        value = self.value
        for bucket in range(_BUCKETS):
            base = bucket * ages
            survived = self.trials[bucket]
            after = sum(reuses[base : base + ages])
            for c in range(ages):
                value[base + c] = (after + prior[c]) / (max(survived, after) + _PRIOR)
                survived -= reuses[base + c]
                after -= reuses[base + c]
        value[ages - 1 :: ages] = [-1.0] * _BUCKETS  # idle past the window: nothing to expect


class ReusePolicy(EvictionPolicy):
    """Evicts the bucket head least likely to be requested again (bucket of position from the
    prompt's end, earlier requests and depth; its idle time), or LRU's victim while a miniature
    LRU cache hits more than a miniature of the learned ranking.

    Args:
        capacity: The cache size in blocks (required): it scales the trial window, the age
            classes and the miniature caches.
        window: A trial lasts this many capacities of ticks (inserts and hits).
        seed: Which keys the miniature caches sample.
        follow: ``"auto"``: the ranking the miniatures choose; ``"learned"`` or ``"lru"``: that
            ranking always, without the miniatures (to measure or pin one).
    """

    name = "reuse"
    strategy = EvictionStrategy.REUSE
    paper = (
        "Wang et al., KVCache Cache in the Wild, USENIX ATC 2025; per-class, per-age learning as "
        "LHD (NSDI 2018); the ranking chosen by miniature simulations (USENIX ATC 2017)"
    )
    order_preserving = False  # the learnt tables start afresh after a swap
    explains_by = (
        "its bucket's learnt reuse probability at its idle time (bucket of position from the prompt's "
        "end, earlier requests and depth), or LRU's order while the miniature LRU hits more"
    )
    needs_capacity = True

    def __init__(
        self, capacity: int | None = None, window: float = 4.0, seed: int = 0, follow: str = "auto"
    ) -> None:
        super().__init__(capacity)
        if capacity is None:  # the base already raised; this narrows the type
            raise ValueError("reuse needs capacity")
        if not window > 0:
            raise ValueError(f"window={window} must be a positive number of capacities")
        if follow not in ("auto", "learned", "lru"):
            raise ValueError(f"follow={follow!r} must be 'auto', 'learned' or 'lru'")
        self._window = max(1, int(window * capacity))
        self._model = _Model(capacity, self._window)
        # per held key
        self._tick: dict[Hashable, int] = {}  # its last request
        self._bucket: dict[Hashable, int] = {}
        self._live = _TickQueue(None, self._tick, False)  # the evictable keys: the LRU order
        self._ranked = _Ranked(self._tick)  # the same keys by bucket: the learned order
        # trials
        self._open: dict[Hashable, tuple[int, int, int]] = {}  # key -> (bucket, start tick, hits)
        self._starts: deque[tuple[int, Hashable]] = deque()  # (start tick, key), oldest first
        # the miniatures
        sample = 1
        while sample < _MAX_SAMPLE and capacity // (2 * sample) >= _MINI:
            sample *= 2
        self._duel = follow == "auto"
        self._mask = sample - 1
        self._salt = seed
        self._mini_size = max(1, capacity // sample)
        self._mini_lru: OrderedDict[Hashable, None] = OrderedDict()
        self._mini_ticks: dict[Hashable, int] = {}
        self._mini_ranked = _Ranked(self._mini_ticks)
        self._mini_hits = [0.0, 0.0]  # learned, LRU
        self._mini_clock = 0
        self._learned = follow == "learned"

    # ---- trials ------------------------------------------------------------------------------

    def _expire_trials(self) -> None:
        starts = self._starts
        horizon = self._clock - self._window
        open_trials = self._open
        while starts and starts[0][0] <= horizon:
            start, key = starts.popleft()
            trial = open_trials.get(key)
            if trial is not None and trial[1] == start:
                del open_trials[key]
                self._model.end_trial(trial[0], -1)

    def _request(self, key: Hashable, meta: EntryMeta) -> int:
        """A request for `key` (insert or hit): ends its open trial as a reuse, opens a new one,
        and is a lookup of the miniatures when the key is sampled. Returns its bucket."""
        clock = self._clock
        trial = self._open.get(key)
        if trial is not None:
            self._model.end_trial(trial[0], clock - trial[1])
            hits = trial[2] + 1
        else:
            hits = 0
        bucket = bucket_of(meta, hits)
        self._open[key] = (bucket, clock, hits)
        self._starts.append((clock, key))
        self._expire_trials()
        # a mixed hash: block ids may be striped (consecutive in a prompt)
        if self._duel and ((hash(key) + self._salt) * 0x9E3779B1 >> 20) & self._mask == 0:
            self._mini_lookup(key, bucket)
        return bucket

    # ---- the miniatures ----------------------------------------------------------------------

    def _mini_lookup(self, key: Hashable, bucket: int) -> None:
        hits = self._mini_hits
        lru = self._mini_lru
        if key in lru:
            lru.move_to_end(key)
            hits[1] += 1.0
        else:
            lru[key] = None
            if len(lru) > self._mini_size:
                lru.popitem(last=False)
        ranked = self._mini_ranked
        if key in ranked.where:
            ranked.discard(key)
            hits[0] += 1.0
        self._mini_ticks[key] = self._clock
        ranked.add(key, bucket)
        if len(ranked.where) > self._mini_size:
            victim = ranked.victim(self._clock, self._model)
            ranked.discard(victim)
            del self._mini_ticks[victim]
        self._mini_clock += 1
        if self._mini_clock * (self._mask + 1) >= _DUEL_WINDOWS * self._window:
            self._mini_clock = 0
            hits[0] *= 0.5
            hits[1] *= 0.5
        if self._learned:
            self._learned = hits[0] >= hits[1]
        else:
            self._learned = hits[0] > hits[1] + _ENTER_HITS

    # ---- hooks -------------------------------------------------------------------------------

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._tick[key] = self._clock
        bucket = self._bucket[key] = self._request(key, meta)
        if evictable:
            self._live.order[key] = None
            self._ranked.add(key, bucket)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._tick[key] = self._clock
        bucket = self._bucket[key] = self._request(key, meta)
        if key in self._ranked.where:
            self._live.touch(key)
            self._ranked.discard(key)
            self._ranked.add(key, bucket)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        # a key made evictable again keeps the tick of its last request, as in `lru` (in the
        # radix cache a parent freed by its child's eviction is as old as the child, and leaves
        # next; pushed as new, the stubs of old chains would stay)
        if evictable:
            self._live.add_old(key, self._tick[key])
            self._ranked.add(key, self._bucket[key])
        else:
            self._live.discard(key)
            self._ranked.discard(key)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        if was_evictable:
            self._live.discard(key)
            self._ranked.discard(key)
        del self._tick[key]
        del self._bucket[key]

    def _pop_victim(self) -> Hashable:
        if self._learned:
            key = self._ranked.victim(self._clock, self._model)
            self._live.discard(key)
        else:
            key = self._live.pop()
        self._ranked.discard(key)
        del self._tick[key]
        del self._bucket[key]
        return key

    def _drain(self) -> Iterator[Hashable]:
        if self._learned:
            return self._ranked.order(self._clock, self._model)
        return iter(self._live.in_order())

    def peek(self, n: int) -> list[Hashable]:
        """The next `n` victims, in the order `evict` would take them if nothing changed."""
        return list(islice(self._drain(), max(0, n)))

    def _eviction_order(self) -> list[Hashable]:
        """Every evictable key in the order draining the policy would evict them."""
        return list(self._drain())

    # ---- introspection -----------------------------------------------------------------------

    def reuse_probability(self, bucket: int, idle: int = 0) -> float:
        """The learnt probability that a block of `bucket`, idle for `idle` ticks, is requested
        again within the window (-1 past the window)."""
        model = self._model
        return model.value[bucket * model.ages + model.age_class(idle)]

    @property
    def learned(self) -> bool:
        """Whether the cache evicts by the learned ranking now (else by LRU)."""
        return self._learned

    @property
    def tracked_keys(self) -> int:
        """Keys with an open trial or in a miniature (the memory beyond the held blocks)."""
        return len(self._open) + len(self._mini_lru) + len(self._mini_ranked.where)

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        """The radix features of a held block, its bucket, idle ticks and learnt reuse
        probability, and which ranking the cache follows; `explain` adds them to the base's
        values (its ``order`` is the drain order)."""
        bucket = self._bucket[key]
        idle = self._clock - self._tick[key]
        return {
            "depth": meta.depth,
            "pos_from_end": meta.pos_from_end,
            "prompt_blocks": meta.prompt_blocks,
            "idle_ticks": idle,
            "bucket": bucket,
            "reuse_probability": self.reuse_probability(bucket, idle),
            "learned": self._learned,
            "miniature_hits": {"learned": self._mini_hits[0], "lru": self._mini_hits[1]},
        }

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(learned=self._learned, open_trials=len(self._open))
        return out
