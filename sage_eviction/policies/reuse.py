"""Learned reuse: evict the block least likely to be reused, learnt online per radix feature bucket,
mixed with LRU by regret so that it never does much worse than LRU.

Sources: Wang et al., "KVCache Cache in the Wild: Characterizing and Optimizing KVCache Cache
at a Large Cloud Provider", USENIX ATC 2025 (a per-category reuse probability that decays with
the time since last access; a prompt's head blocks valued over its tail); Vietri et al.,
"Driving Cache Replacement with ML-based LeCaR", HotStorage 2018, and Rodriguez et al.,
"Learning Cache Replacement with CACHEUS", FAST 2021 (two experts mixed by regret learnt from
ghost lists of their victims).

**Features** (`EntryMeta`, filled by the cache manager): each block falls in a bucket of its
prompt's length (`prompt_blocks`), its position from the prompt's end (`pos_from_end`; the depth
is the one less the other), its hits so far, each on a log2 scale, and its reuse-interval class:
for a block entering the cache, how long its request's cached prefix had been idle
(`prefix_idle`, log2 seconds; a class of its own when nothing was cached), for a hit, the gap
since the block's previous request (log2, in sixteenths of a capacity of ticks). The time since
the last access is not bucketed: it is the ranking's age. A flat cache passes `EntryMeta()`, so
there only the hits and the gaps distinguish blocks.

**What is learnt.** Every insert or hit of a block opens a *trial* for the bucket the block is in
after it; the trial succeeds when the key is requested again (a hit, or an insert after it was
evicted) within `window * capacity` ticks (one tick per insert or hit), and fails when the window
passes first. Trials do not depend on which policy evicts what, since a re-insert of an evicted
key counts as a reuse. Per bucket the policy keeps decayed counts of trials and successes
(every count is halved each time `window * capacity` trials have ended: knowledge ages), and,
over all buckets, the mean gap `m` of the successful trials. The reuse probability of a bucket
is its success rate shrunk toward the overall rate by a prior of `_PRIOR` trials.

**Ranking.** With a reuse at probability `p` whose gap is exponential of mean `m`, the odds that a
block idle for `age` ticks is still to be reused are ``p / (1 - p) * exp(-age / m)``, so the
blocks rank by ``tick + m * logit(p)`` (smaller leaves first; the logit is taken relative to the
overall rate and clipped to [-6, 1]: a block expected dead may leave much earlier than LRU would
let it, one expected back is kept only a little longer): a time-invariant score, held in a
binary heap with lazy deletion, O(log n) per operation. A bucket at the overall rate gets LRU's
order; a block that tends not to come back (a prompt's partial tail) leaves as if it had been
idle longer. Scores use the model of the moment they are pushed; the heap is rebuilt with fresh
scores whenever it is compacted.

**Safety.** The evictable keys also sit in an `OrderedDict` in recency order (a block made
evictable again counts as just used): the LRU expert, O(1). Each eviction follows one of the two
experts, the learned one with probability `w` (a seeded generator, so runs repeat). When they
disagree, the victim is remembered with the expert that chose it, and the block the other
expert would have evicted is remembered as spared by it (two lists of `capacity` keys each). A
miss on a remembered victim, or a hit on a spared block, is a regret of the expert responsible
for it: its weight is multiplied by ``exp(-learning_rate)``, then the weights are normalised and
`w` kept within [0.01, 0.99]. When the learned ranking is wrong its victims come back and the
blocks it wanted gone are hit, so `w` falls and the policy evicts as LRU does
(tests/test_reuse_policy.py shows it on a ranking made wrong on purpose).

**Memory.** Per held block: a tick, a bucket, an `OrderedDict` entry and one or more heap items
(stale ones are dropped when the heap outgrows twice the evictable keys). Per key requested in
the last `window * capacity` ticks, held or not: one open trial (a dict entry and a deque item).
Two lists of at most `capacity` keys, and fixed tables of `_BUCKETS` buckets. In CPython that
is about 1.3 to 1.4 kB per held block in steady state (0.45 to 0.5 kB per tracked key), where
`lru` holds 0.55 kB (benchmarks/reuse_memory.py at 1e5 blocks).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator
from itertools import compress
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["ReusePolicy"]

_LENGTHS = 9  # prompt length buckets, in blocks: 0, 1, 2-3, 4-7, ..., 128+
_POSITIONS = 8  # output, then position from the prompt's end 0, 1, 2-3, 4-7, 8-15, 16-31, 32+
_HITS = 4  # hits 0, 1, 2, 3+
_IDLES = 15  # an insert's prefix idle time: none cached, then log2 seconds < 0.25, ..., 2048+
_GAPS = 11  # a hit's gap since its previous request, log2 of 16 * gap / capacity ticks: < 1/16, ..., 32+
_BUCKETS = _LENGTHS * _POSITIONS * _HITS * (_IDLES + _GAPS)
_PRIOR = 8.0  # trials of the overall rate each bucket starts with
# The relative logit is clipped to [-_MAX_DEMOTE, _MAX_PROMOTE]: a block the model expects back is
# kept at most one `m` longer than LRU would keep it, while a block it expects dead may leave up
# to six `m` earlier. Promotions fill the cache with blocks whose reuse comes after they would
# have left anyway; demotions of dead blocks (a prompt's partial tail) are where the hits are.
# Chosen on the synthetic workloads (a symmetric +-6 lost up to 0.25 points to LRU in the flat
# model, where the features are few).
_MAX_PROMOTE = 1.0
_MAX_DEMOTE = 6.0
_NO_KEY: Any = object()
_LEARNED = 0
_LRU = 1


def bucket_of(meta: EntryMeta, gap: int) -> int:
    """The feature bucket of a block: its prompt's length, its position from the prompt's end,
    its hits (the depth is the length less the position, so it is covered), each log2 scaled,
    and `gap`: the class of the block's previous reuse interval (`_gap_class`)."""
    length = meta.prompt_blocks.bit_length()
    pos = meta.pos_from_end
    position = 0 if pos < 0 else min((pos + 1).bit_length(), _POSITIONS - 1)
    hits = meta.hits
    return (
        ((length if length < _LENGTHS else _LENGTHS - 1) * _POSITIONS + position) * _HITS
        + (hits if hits < _HITS else _HITS - 1)
    ) * (_IDLES + _GAPS) + gap


def idle_class(meta: EntryMeta) -> int:
    """The reuse-interval class of a block entering the cache: 0 when its request hit nothing,
    else 1 + log2 of four times the seconds its cached prefix had been idle (clipped)."""
    idle = meta.prefix_idle
    if idle is None:
        return 0
    return 1 + min(int(idle * 4.0).bit_length(), _IDLES - 2)


class ReusePolicy(EvictionPolicy):
    """Evicts the block of least learnt reuse odds given its radix features and idle time, mixed
    with LRU by regret.

    Args:
        capacity: The cache size in blocks (required): it scales the trial window, the ghost
            list and the aging.
        window: A trial lasts this many capacities of ticks (inserts and hits).
        learning_rate: LeCaR's lambda: how fast a regret moves the experts' weights.
        seed: Seed of the generator that picks the expert of each eviction.
    """

    name = "reuse"
    strategy = EvictionStrategy.REUSE
    paper = (
        "Wang et al., KVCache Cache in the Wild, USENIX ATC 2025; regret mixing with LRU as "
        "LeCaR (HotStorage 2018) and CACHEUS (FAST 2021)"
    )
    order_preserving = False  # the learnt tables and weights start afresh after a swap
    explains_by = (
        "its learnt reuse odds (bucket of prompt length, position from the prompt's end, hits and "
        "reuse interval) on top of its idle time, or LRU's order, as the regret-weighted experts pick"
    )
    needs_capacity = True

    def __init__(
        self, capacity: int | None = None, window: float = 4.0, learning_rate: float = 0.01, seed: int = 0
    ) -> None:
        super().__init__(capacity)
        if capacity is None:  # the base already raised; this narrows the type
            raise ValueError("reuse needs capacity")
        if not window > 0:
            raise ValueError(f"window={window} must be a positive number of capacities")
        if not learning_rate > 0:
            raise ValueError(f"learning_rate={learning_rate} must be positive")
        self._window = max(1, int(window * capacity))
        self._capacity = capacity
        self._learning_rate = learning_rate
        self._penalty = math.exp(-learning_rate)
        self._rng = random.Random(seed)
        # per held key
        self._tick: dict[Hashable, int] = {}
        self._bucket: dict[Hashable, int] = {}
        # evictable key -> the tick its heap item carries, in LRU order (the LRU expert: O(1))
        self._live: OrderedDict[Hashable, int] = OrderedDict()
        self._heap: list[tuple[float, int, Hashable]] = []  # (score, tick, key): learned order
        # the model
        self._trials = [0.0] * _BUCKETS
        self._reuses = [0.0] * _BUCKETS
        self._logit = [0.0] * _BUCKETS
        self._all_trials = 0.0
        self._all_reuses = 0.0
        self._gap_sum = 0.0  # ticks between the start and the success of successful trials
        self._ended = 0  # trials ended since the last halving
        self._open: dict[Hashable, tuple[int, int]] = {}  # key -> (bucket, start tick)
        self._starts: deque[tuple[int, Hashable]] = deque()  # (start tick, key), oldest first
        self._mean_gap = float(self._window) / 4.0
        # the experts
        self._weight = 0.5  # of the learned expert; LRU has 1 - w
        # victims of one expert that the other would have kept, and the reverse: held keys the
        # other expert would have evicted instead; key -> the expert that would regret a request
        self._ghosts: OrderedDict[Hashable, int] = OrderedDict()
        self._spared: OrderedDict[Hashable, int] = OrderedDict()
        self._ghost_size = capacity
        self._pending: Any = _NO_KEY

    # ---- the model ---------------------------------------------------------------------------

    def _end_trial(self, bucket: int, reused: bool, gap: int) -> None:
        self._trials[bucket] += 1.0
        self._all_trials += 1.0
        if reused:
            self._reuses[bucket] += 1.0
            self._all_reuses += 1.0
            self._gap_sum += gap
        self._ended += 1
        if self._ended >= self._window:
            self._age_model()
        else:
            self._refresh_logit(bucket)

    def _age_model(self) -> None:
        """Halve every count (older trials weigh less) and recompute every bucket's logit."""
        self._ended = 0
        self._trials = [t * 0.5 for t in self._trials]
        self._reuses = [r * 0.5 for r in self._reuses]
        self._all_trials *= 0.5
        self._all_reuses *= 0.5
        self._gap_sum *= 0.5
        if self._all_reuses > 0:
            self._mean_gap = max(1.0, self._gap_sum / self._all_reuses)
        for bucket in range(_BUCKETS):
            self._refresh_logit(bucket)

    def _refresh_logit(self, bucket: int) -> None:
        overall = (self._all_reuses + 1.0) / (self._all_trials + 2.0)
        p = (self._reuses[bucket] + _PRIOR * overall) / (self._trials[bucket] + _PRIOR)
        p = min(max(p, 1e-6), 1.0 - 1e-6)
        q = overall if 0.0 < overall < 1.0 else 0.5
        # relative to the overall rate: a bucket at the overall rate ranks as LRU does
        logit = math.log(p / (1.0 - p)) - math.log(q / (1.0 - q))
        self._logit[bucket] = min(max(logit, -_MAX_DEMOTE), _MAX_PROMOTE)

    def _expire_trials(self) -> None:
        starts = self._starts
        horizon = self._clock - self._window
        open_trials = self._open
        while starts and starts[0][0] <= horizon:
            start, key = starts.popleft()
            trial = open_trials.get(key)
            if trial is not None and trial[1] == start:
                del open_trials[key]
                self._end_trial(trial[0], False, 0)

    def _request(self, key: Hashable, bucket: int) -> None:
        """A request for `key` (insert or hit): ends its open trial as a reuse, opens a new one."""
        clock = self._clock
        trial = self._open.get(key)
        if trial is not None:
            self._end_trial(trial[0], True, clock - trial[1])
        self._open[key] = (bucket, clock)
        self._starts.append((clock, key))
        self._expire_trials()

    # ---- the experts -------------------------------------------------------------------------

    def _push(self, key: Hashable) -> None:
        """`key` is evictable with its current tick: the most recent for the LRU expert (a block
        made evictable again was in use until now), a new item in the learned heap."""
        tick = self._tick[key]
        live = self._live
        live[key] = tick
        live.move_to_end(key)
        heap = self._heap
        heapq.heappush(heap, (tick + self._mean_gap * self._logit[self._bucket[key]], tick, key))
        if len(heap) > 2 * len(live) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop stale items; every live key rescored with the model of now."""
        gap, logit, bucket = self._mean_gap, self._logit, self._bucket
        self._heap = [(tick + gap * logit[bucket[key]], tick, key) for key, tick in self._live.items()]
        heapq.heapify(self._heap)

    def _top_learned(self) -> Hashable:
        """The key of the learned heap's first live item, dropping stale ones above it."""
        heap, live = self._heap, self._live
        while True:
            _, tick, key = heap[0]
            if live.get(key) == tick:
                return key
            heapq.heappop(heap)

    def _penalise(self, expert: int) -> None:
        """One regret of `expert`: its weight is multiplied by exp(-learning_rate), then the two
        weights are normalised and the learned one kept within [0.01, 0.99]."""
        learned, lru = self._weight, 1.0 - self._weight
        if expert == _LEARNED:
            learned *= self._penalty
        else:
            lru *= self._penalty
        self._weight = min(max(learned / (learned + lru), 0.01), 0.99)

    def _regret(self, key: Hashable) -> None:
        """A miss on `key`: if one expert alone evicted it, that expert regrets it."""
        expert = self._ghosts.pop(key, None)
        if expert is not None:
            self._penalise(expert)

    # ---- hooks -------------------------------------------------------------------------------

    def prepare_insert(self, key: Hashable) -> None:
        """A miss on `key` is about to evict: its regret is applied before the evictions."""
        self._regret(key)
        self._pending = key

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # What the one-by-one inserts build, with C-level updates: each entry opens its trial;
        # no trial can end (fewer entries than a window) and no ghost is held, so the model
        # stays empty, every score is the tick, and the ascending items are already a heap.
        if self._meta or len(keys) >= self._window or not self._inserts_like(ReusePolicy):
            return False
        buckets = list(map(bucket_of, metas, map(idle_class, metas)))
        first = self._add_columns(keys, metas, flags)
        ticks = range(first, self._clock + 1)
        self._tick.update(zip(keys, ticks, strict=True))
        self._bucket.update(zip(keys, buckets, strict=True))
        self._open.update(zip(keys, zip(buckets, ticks, strict=True), strict=True))
        self._starts.extend(zip(ticks, keys, strict=True))
        live_keys = list(compress(keys, flags))
        live_ticks = list(compress(ticks, flags))
        self._live.update(zip(live_keys, live_ticks, strict=True))
        self._heap = [(float(tick), tick, key) for key, tick in zip(live_keys, live_ticks, strict=True)]
        return True

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if self._pending is not _NO_KEY and self._pending == key:
            self._pending = _NO_KEY
        else:
            self._regret(key)
        bucket = bucket_of(meta, idle_class(meta))
        self._tick[key] = self._clock
        self._bucket[key] = bucket
        self._request(key, bucket)
        if evictable:
            self._push(key)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        # the gap since its previous request, in sixteenths of a capacity of ticks, log2 scaled
        gap = ((self._clock - self._tick[key]) * 16 // self._capacity).bit_length()
        bucket = bucket_of(meta, _IDLES + (gap if gap < _GAPS else _GAPS - 1))
        self._tick[key] = self._clock
        self._bucket[key] = bucket
        self._request(key, bucket)
        if self._spared:
            expert = self._spared.pop(key, None)
            if expert is not None:  # a hit the other expert would have lost
                self._penalise(expert)
        if key in self._live:
            self._push(key)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if evictable:
            self._push(key)
        else:
            del self._live[key]

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._tick[key]
        del self._bucket[key]
        if was_evictable:
            del self._live[key]
        self._ghosts.pop(key, None)
        self._spared.pop(key, None)

    def _pop_victim(self) -> Hashable:
        learned = self._top_learned()
        lru = next(iter(self._live))
        if learned is lru or learned == lru:
            key = learned
        else:
            if self._rng.random() < self._weight:
                key, spared, expert, other = learned, lru, _LEARNED, _LRU
            else:
                key, spared, expert, other = lru, learned, _LRU, _LEARNED
            ghosts = self._ghosts
            ghosts[key] = expert
            if len(ghosts) > self._ghost_size:
                ghosts.popitem(last=False)
            kept = self._spared
            kept[spared] = other
            if len(kept) > self._ghost_size:
                kept.popitem(last=False)
        self._spared.pop(key, None)
        del self._live[key]
        del self._tick[key]
        del self._bucket[key]
        return key

    def _learned_in_order(self) -> Iterator[Hashable]:
        """The keys of the learned heap's live items in score order, without changing the heap
        (a best-first walk of its tree: O(k log k) for the first k)."""
        heap, live = self._heap, self._live
        if not heap:
            return
        size = len(heap)
        frontier: list[tuple[tuple[float, int, Hashable], int]] = [(heap[0], 0)]
        while frontier:
            item, i = heapq.heappop(frontier)
            if live.get(item[2]) == item[1]:
                yield item[2]
            for child in (2 * i + 1, 2 * i + 2):
                if child < size:
                    heapq.heappush(frontier, (heap[child], child))

    def _drain_order(self, n: int) -> list[Hashable]:
        """The next `n` victims exactly as `evict` would take them if nothing changed: both
        experts' orders merged with the same draws of the generator (its state is restored)."""
        live = self._live
        n = min(n, len(live))
        if n <= 0:
            return []
        if n > 256:  # most of the order: one C-level sort of the live items beats the walk
            learned: Iterator[Hashable] = iter(
                [item[2] for item in sorted(item for item in self._heap if live.get(item[2]) == item[1])]
            )
        else:
            learned = self._learned_in_order()
        recent = iter(live)
        taken: set[Hashable] = set()
        out: list[Hashable] = []
        rng = self._rng
        state = rng.getstate()
        try:
            first = next(learned)
            oldest = next(recent)
            while len(out) < n:
                while first in taken:
                    first = next(learned)
                while oldest in taken:
                    oldest = next(recent)
                if first is oldest or first == oldest:
                    key = first
                else:
                    key = first if rng.random() < self._weight else oldest
                out.append(key)
                taken.add(key)
        finally:
            rng.setstate(state)
        return out

    def peek(self, n: int) -> list[Hashable]:
        """The next `n` victims, in the order `evict` would take them if nothing changed."""
        return self._drain_order(n)

    def _eviction_order(self) -> list[Hashable]:
        """Every evictable key in the order draining the policy would evict them."""
        return self._drain_order(len(self._live))

    # ---- introspection -----------------------------------------------------------------------

    def reuse_probability(self, bucket: int) -> float:
        """The learnt probability that a block of `bucket` is requested again within the window."""
        overall = (self._all_reuses + 1.0) / (self._all_trials + 2.0)
        return (self._reuses[bucket] + _PRIOR * overall) / (self._trials[bucket] + _PRIOR)

    @property
    def learned_weight(self) -> float:
        """The weight of the learned expert (LRU has the rest)."""
        return self._weight

    @property
    def tracked_keys(self) -> int:
        """Keys with an open trial or a ghost record (the memory beyond the held blocks)."""
        return len(self._open) + len(self._ghosts) + len(self._spared)

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        """The radix features of a held block, its bucket's learnt reuse probability, the score
        the learned expert ranks it by (smaller leaves first) and the experts' weight; `explain`
        adds them to the base's values (its ``order`` is the drain order, both experts merged)."""
        bucket = self._bucket[key]
        tick = self._tick[key]
        return {
            "depth": meta.depth,
            "pos_from_end": meta.pos_from_end,
            "prompt_blocks": meta.prompt_blocks,
            "prefix_idle": meta.prefix_idle,
            "idle_ticks": self._clock - tick,
            "bucket": bucket,
            "reuse_probability": self.reuse_probability(bucket),
            "reuse_gap_ticks": self._mean_gap,
            "score": tick + self._mean_gap * self._logit[bucket],
            "learned_weight": self._weight,
        }

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(learned_weight=self._weight, mean_gap=self._mean_gap, open_trials=len(self._open))
        return out
