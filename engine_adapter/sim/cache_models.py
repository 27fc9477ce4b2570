"""The simulator's two cache models, behind the calls the event loop makes.

- `RadixModel`: the real `CacheManager` (the engine's cache) over a bare block allocator: a hit
  stops at a request's first missing block, only leaves are evicted, running sequences hold
  blocks and can be preempted; with KV tiers, evictions demote and hits below the device load
  back (`loaded`), the moves themselves discarded (the cost model prices them). `RadixBelady`
  gives the radix model Belady's decisions.
- `FlatModel`: independent blocks, `sage_eviction.flat.FlatCache` with forced admission, the
  model libCacheSim simulates.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine_adapter.cache.ages import HistogramSnapshot
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.sim_result import ModelStats, TierLoads
from engine_adapter.sim.workloads import SimRequest, int64_keys, lookup_keys, next_use_positions
from sage_eviction import EntryMeta, native
from sage_eviction.flat import FlatCache
from sage_eviction.heap import HeapPolicy
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker, percentile
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.registry import get_policy_class, parse_policy_spec

__all__ = [
    "FlatLookup",
    "FlatModel",
    "RadixBelady",
    "RadixFigures",
    "RadixModel",
    "array_quantiles",
    "cache_request",
    "window_quantiles",
]


class RadixBelady(BeladyPolicy):
    """Belady for the radix model: next use by position in the arrival-ordered lookup sequence.

    The simulator calls `serve(keys, end)` with the request being allocated before it allocates:
    `cursor` is then `end`, the position just past that request's lookups. An insert or hit of a
    key scores it with the key's first lookup at or after the cursor (never again: evicted
    first); scores are not revised between a key's own calls. That lookup is found from the key's
    position in the request being served and the next-use array (`next_use_positions`, one int64
    per lookup), so no per-key list of positions is held; a key from outside that request (none
    in the simulator's calls) falls back to an index of every key's positions, built once.
    """

    def __init__(self, requests: Sequence[SimRequest]) -> None:
        super().__init__()
        self._requests = requests
        self._after = next_use_positions(requests)
        self._never = len(self._after)
        self._serving: dict[Hashable, int] = {}  # the served request's keys -> their positions
        self._positions: dict[Hashable, list[int]] | None = None  # the fallback index
        self.cursor = 0

    @property
    def next_uses(self) -> array[int]:
        """The next-use array it scores by (`next_use_positions` of its requests): read it, do
        not change it (the compiled radix loop's Belady shares it)."""
        return self._after

    def serve(self, keys: Sequence[Hashable], end: int) -> None:
        """The request whose lookups end at `end` (exclusive) is being allocated."""
        self.cursor = end
        self._serving = dict(zip(keys, range(end - len(keys), end), strict=True))

    def _next(self, key: Hashable) -> int:
        position = self._serving.get(key)
        if position is None:
            return self._next_outside(key)
        # Its last lookup in the served request (`serve` keeps the last of a repeated key), so the
        # next one is at or past the cursor.
        return self._after[position]

    def _next_outside(self, key: Hashable) -> int:
        if self._positions is None:
            self._positions = {}
            for position, looked_up in enumerate(lookup_keys(self._requests)):
                self._positions.setdefault(looked_up, []).append(position)
        positions = self._positions.get(key)
        if not positions:
            return self._never
        at = bisect_left(positions, self.cursor)
        return positions[at] if at < len(positions) else self._never

    def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = True) -> None:
        """A block entered the cache; scored by its next lookup after the cursor."""
        self._incoming = self._next(key)
        HeapPolicy.insert(self, key, meta, evictable=evictable)

    def access(self, key: Hashable, now: float | None = None) -> None:
        """A hit; rescored by its next lookup after the cursor."""
        self._incoming = self._next(key)
        HeapPolicy.access(self, key, now)


@dataclass(frozen=True, slots=True)
class FlatLookup:
    """One request's lookup in the flat model."""

    hit_blocks: int
    served_tokens: int  # the hit blocks' tokens, less a partial last block's padding


class FlatModel:
    """A `sage_eviction.flat.FlatCache` looked up block by block, with the re-prefill rate and the
    decision times recorded through its hooks."""

    def __init__(self, policy: str, capacity: int, requests: Sequence[SimRequest]) -> None:
        # The whole run (the trace bounds its keys): the row's rate is the exact one, counted as
        # the compiled FlatState counts it (it keeps the tracker's window); per run, freed.
        self.reprefill = ReprefillTracker(None)
        self.latency = LatencyRecorder()
        offline = get_policy_class(parse_policy_spec(policy)[0]).offline
        self.cache = FlatCache(
            policy,
            capacity,
            future=lookup_keys(requests) if offline else None,  # only the offline policy needs it
            reprefill=self.reprefill,
            latency=self.latency,
            int_keys=int64_keys(requests),
        )

    @property
    def policy_calls(self) -> str:
        """How the cache runs the policy: "c-state" (in C, its state in C arrays), "compiled" (its
        C table) or "python" (its methods)."""
        return self.cache.policy_calls

    @property
    def evictions(self) -> int:
        return self.cache.evictions

    def stats(self) -> ModelStats:
        """The row's figures as the radix and sglang models give them (`SGLangModel.stats`):
        no pool to fill and no preemption, so utilization is 1 once anything was evicted."""
        p50, p99 = window_quantiles(self.latency, 0.5, 0.99)
        utilization = 1.0 if self.evictions else 0.0
        return ModelStats(self.reprefill.rate, utilization, self.evictions, p50 * 1e6, p99 * 1e6, 0)

    def lookup(self, keys: Sequence[Hashable], input_len: int, block_size: int) -> FlatLookup:
        """Look each block up in order (a miss is admitted): the hit blocks and tokens served."""
        hits, last_hit = self.cache.lookup(keys)
        served = hits * block_size
        if last_hit:
            served -= max(len(keys) * block_size - input_len, 0)  # a partial last block
        return FlatLookup(hits, max(served, 0))


def window_quantiles(latency: LatencyRecorder, *qs: float) -> list[float]:
    """`latency.quantiles(*qs)`, the same floats, without sorting its 65536 times in Python
    (about 7 ms, a seventh of a compiled flat row): `array_quantiles` of its window."""
    times = latency.times()
    return array_quantiles(np.fromiter(times, dtype=np.float64, count=len(times)), *qs)


def array_quantiles(values: npt.NDArray[np.float64], *qs: float) -> list[float]:
    """`percentile` of the sorted `values` at each q: `np.partition` puts the two order
    statistics around each q in their sorted places, which is all `percentile` reads."""
    n = len(values)
    if not n:
        return [0.0 for _ in qs]
    # the places `percentile` reads (a q outside [0, 1] is its to refuse)
    places = {min(math.floor(q * (n - 1)) + d, n - 1) for q in qs if 0.0 <= q <= 1.0 for d in (0, 1)}
    ordered = np.partition(values, sorted(places)).tolist()
    return [percentile(ordered, q) for q in qs]


def cache_request(seq: SimSequence) -> CacheRequest:
    """What a simulated request brings to the cache manager: its block keys (a re-prefill after
    preemption covers its regenerated output too), tenant, priority and session; the last token
    is never recomputed in simulation."""
    r = seq.request
    return CacheRequest(
        seq.sid,
        num_tokens=seq.tokens,
        block_keys=seq.keys,
        tenant=r.tenant,
        priority=r.priority,
        conversation=r.session,
        recompute_last_token=False,
    )


@dataclass(frozen=True, slots=True)
class RadixFigures:
    """A radix row's cache figures counted by the compiled radix loop (`radix_run`), which runs
    the whole row outside the `CacheManager`: what `RadixModel.stats` and `regret` read from the
    manager's `stats()` otherwise, defined the same way (`CacheStats`)."""

    re_prefill_rate: float
    memory_utilization: float  # 0.0 without an eviction, as the row reports it
    evictions: int
    decision_times: npt.NDArray[np.float64]  # the eviction calls' (the window of `LatencyRecorder`)
    preemptions: int
    missed: int
    ghost_hits: int
    regrets: int
    histograms: tuple[HistogramSnapshot, ...]

    def stats(self) -> ModelStats:
        p50, p99 = array_quantiles(self.decision_times, 0.5, 0.99)
        return ModelStats(
            self.re_prefill_rate,
            self.memory_utilization,
            self.evictions,
            p50 * 1e6,
            p99 * 1e6,
            self.preemptions,
        )

    def regret(self) -> dict[str, Any]:
        return {
            "regrets": self.regrets,
            "ghost_hits": self.ghost_hits,
            "regret_ratio": self.regrets / self.missed if self.missed else 0.0,
            "age_histograms": [h.to_dict() for h in self.histograms],
        }


class RadixModel:
    """The radix model through the real `CacheManager` (any policy). A row that ran in the
    compiled radix loop (`radix_run`) leaves the manager as built and its figures in `figures`."""

    def __init__(self, manager: Any, belady: RadixBelady | None) -> None:
        self.manager = manager
        self.belady = belady
        self.figures: RadixFigures | None = None
        self._allocate = manager.allocate
        self._commit = manager.commit_blocks
        self._reserve = manager.reserve_tokens
        self._reserve_many = manager.reserve_tokens_many
        self._requests: dict[int, CacheRequest] = {}  # by sid, until it is freed
        # tokens a sequence admitted on a compressed prefix stands for beyond what its cache holds
        self._shrink: dict[int, int] = {}
        self.loaded = TierLoads()  # the last allocation's blocks loaded back from host and disk

    def _request(self, seq: SimSequence) -> CacheRequest:
        """`seq`'s `CacheRequest`, built once while its tokens stay the same: the head of the queue
        retries each step until it fits, and a protected request is allocated with the same one."""
        request = self._requests.get(seq.sid)
        if request is None or request.num_tokens != seq.tokens:
            request = self._requests[seq.sid] = cache_request(seq)
        return request

    def allocate(self, seq: SimSequence) -> int | None:
        """Blocks of the prompt served from cache, or None when it cannot get its blocks now."""
        if self.belady is not None:
            self.belady.serve(seq.keys, seq.lookup_end)
        try:
            alloc = self._allocate(self._request(seq))
        except NoEvictableBlocksError:
            return None
        self._commit(seq.sid, block_keys=seq.keys, num_computed_tokens=seq.prompt_tokens)
        if self.manager.tiers is not None:
            self.manager.take_moves()  # nothing copies bytes here: the cost model prices the loads
            self.loaded = TierLoads(alloc.num_host_blocks, alloc.num_disk_blocks)
        if alloc.num_compressed_tokens:
            shrink = alloc.num_compressed_tokens - alloc.num_compressed_blocks * self.manager.block_size
            self._shrink[seq.sid] = shrink
        hits: int = alloc.num_cached_tokens // self.manager.block_size  # the prompt's, not the cache's
        return hits

    def prefetch(self, seq: SimSequence) -> TierLoads:
        """Load a queued request's host/disk-resident prefix ahead of time (within the manager's
        prefetch budget); returns the blocks loaded from host and from disk."""
        tiers = self.manager.tiers
        assert tiers is not None
        before = [level.promotions for level in tiers.levels]
        if not self.manager.prefetch(self._request(seq)):
            return TierLoads()
        self.manager.take_moves()
        after = [level.promotions - b for level, b in zip(tiers.levels, before, strict=True)]
        return TierLoads(after[0], sum(after[1:]))

    def protect(self, seq: SimSequence) -> None:
        """Protect the cached prefix a queued request will hit (queue-aware protection)."""
        self.manager.protect_queued_prefix(self._request(seq))

    def reserve(self, seq: SimSequence, tokens: int) -> bool:
        return self._reserve(seq.sid, tokens - self._shrink.get(seq.sid, 0)) is not None

    def reserve_many(self, wants: Sequence[tuple[SimSequence, int]]) -> int:
        """`reserve` of each (sequence, tokens) in order in one call to the manager (a decode
        step's growth), up to the first that cannot get its block; returns how many did."""
        shrink = self._shrink
        done: int = self._reserve_many([(seq.sid, tokens - shrink.get(seq.sid, 0)) for seq, tokens in wants])
        return done

    def select_victims(self, exclude: list[int]) -> list[int]:
        victims: list[int] = self.manager.select_preemption_victims(1, exclude=exclude)
        return victims

    def preempt(self, seq: SimSequence) -> None:
        self._shrink.pop(seq.sid, None)
        self.manager.preempt(seq.sid, block_keys=seq.keys, num_computed_tokens=seq.prompt_tokens)

    def free(self, seq: SimSequence) -> None:
        self._requests.pop(seq.sid, None)
        self._shrink.pop(seq.sid, None)
        self.manager.free_sequence(seq.sid, block_keys=seq.keys, num_computed_tokens=seq.prompt_tokens)

    def compressed(self) -> dict[str, Any]:
        """The row's compress-on-evict fields: its spec, compressions, and the admissions (every
        one, re-admissions too) served from a compressed prefix and their tokens; {} when off."""
        squeeze = self.manager.compressed
        if squeeze is None:
            return {}
        return {
            "compress_on_evict": str(squeeze.spec),
            "compressions": squeeze.compressions,
            "compressed_hits": squeeze.hits,
            "compressed_hit_tokens": squeeze.hit_tokens,
        }

    def regret(self) -> dict[str, Any]:
        """The row's regret and age histograms (`SimResult`), from the cache's accounting."""
        if self.figures is not None:
            return self.figures.regret()
        stats = self.manager.stats()
        return {
            "regrets": stats.regrets,
            "ghost_hits": stats.ghost_hits,
            "regret_ratio": stats.regret_ratio,
            "age_histograms": [h.to_dict() for h in stats.age_histograms],
        }

    @property
    def policy_calls(self) -> str:
        """How the cache calls the policy: "compiled" (its C table), "python" (its methods), or
        "c-state" (the compiled radix loop: the policy's state in C arrays)."""
        if self.figures is not None:
            return "c-state"
        calls: str = self.manager.radix.policy_calls
        return calls

    def prefetch_hits(self) -> int:
        stats = self.manager.stats()
        hits: int = stats.prefetch_hits
        return hits

    def stats(self) -> ModelStats:
        """The row's figures: the compiled loop's, or the manager's."""
        if self.figures is not None:
            return self.figures.stats()
        stats = self.manager.stats()
        utilization = stats.memory_utilization if stats.eviction_calls else 0.0
        return ModelStats(
            stats.re_prefill_rate,
            utilization,
            stats.total_evictions,
            stats.p50_eviction_time_us,
            stats.p99_eviction_time_us,
            stats.preemptions,
        )


# The compiled core calls RadixBelady through BeladyPolicy's C operations, with insert and access
# that call its `_next` through Python; `share_ops` refuses (TypeError) if its methods stop fitting.
_core = native.load(native.CORE)
if _core is not None:
    _core.share_ops(RadixBelady, BeladyPolicy)
