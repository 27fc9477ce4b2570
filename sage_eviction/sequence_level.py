"""The module spec's sequence-level interface: `select_victims`, `update_access`, `get_metrics`
(docs/architecture.md, "The module spec's interface").

`SequenceLevelInterface` is a mixin of `sage_eviction.base.EvictionPolicy` (its only user): it
orders `EvictionCandidate` sequences by the policy's `candidate_key` and reports the policy's
counters, which `EvictionPolicy` keeps (declared here for the type checker only). The victim
choice runs in the compiled core where it can (`sage_eviction/_core.pyx`, `select_victims`, under
the policy's `candidate_order`), else in `select_in_order`, its pure-Python reference.

- `select_in_order`: the greedy victim choice shared by every policy.
- `seen_once_first_key` / `seen_once_first_up_to`: the sequence-level order of the policies that
  split entries by reuse (ARC, SIEVE, SLRU).

Imports: the standard library and `sage_eviction.native` / `.metrics` / `.types`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from sage_eviction import native
from sage_eviction.metrics import LatencyRecorder, jain_fairness
from sage_eviction.types import EvictionCandidate, EvictionMetrics, EvictionPolicyProtocol

__all__ = [
    "SequenceLevelInterface",
    "seen_once_first_key",
    "seen_once_first_up_to",
    "select_in_order",
]

UpTo = Callable[[list[EvictionCandidate], Any], list[EvictionCandidate]]
"""A class's `candidates_up_to`: the candidates whose key is <= a bound, in list order."""


class SequenceLevelInterface(EvictionPolicyProtocol):
    """The module spec's sequence-level API on top of a policy's incremental state.

    A policy orders candidate sequences by `candidate_key` (LRU unless overridden); a class that
    overrides it overrides `candidates_up_to` too, and names the compiled copy of its key in
    `candidate_order` (or sets it to None).
    """

    # EvictionPolicy's, set in its __init__ (declared for the type checker).
    name: ClassVar[str]
    _compiled: bool
    _evictions: int
    _re_prefills: int
    _tenants: dict[str | None, list[int]]
    _select_latency: LatencyRecorder

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """Sort key of a candidate sequence; smaller is evicted first. LRU unless overridden."""
        return candidate.last_access_time

    candidate_order: ClassVar[tuple[str, tuple[float, ...]] | None] = ("lru", ())
    """The compiled core's copy of `candidate_key`: its name in sage_eviction/_core.pyx and the
    constants it reads, or None for none. Used only when the class that defines
    `candidate_key` defines this too (a subclass overriding the key alone is not misread);
    tests/test_native_core.py holds each copy to its `candidate_key`."""

    @staticmethod
    def candidates_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
        """The candidates whose `candidate_key` is <= `bound`, in list order, in one list
        comprehension (no call per candidate). A class that overrides `candidate_key` must
        override this too, or `select_victims` ignores it and calls `candidate_key` on each."""
        return [c for c in candidates if c.last_access_time <= bound]

    def select_victims(self, candidates: list[EvictionCandidate], required_blocks: int) -> list[int]:
        """Pick sequences in policy order until they free `required_blocks` blocks.

        Pinned candidates are never returned; when the unpinned ones together free fewer than
        `required_blocks`, all of them are returned.
        """
        start = time.perf_counter()
        victims: list[int] | None = None
        if self._compiled and type(candidates) is list:
            order = _order_of(type(self))
            core = native.load(native.CORE)
            if order is not None and core is not None:  # None from the core: only Python orders it
                victims = core.select_victims(candidates, required_blocks, *order)
        if victims is None:
            victims = select_in_order(candidates, required_blocks, self.candidate_key, _up_to_of(type(self)))
        self._select_latency.record(time.perf_counter() - start)
        return victims

    def update_access(self, sequence_id: int) -> None:
        """An access to a running sequence: nothing to keep here.

        The module spec's API has it; what it records lives with the sequence, which the caller
        owns and hands back in each `EvictionCandidate` (`last_access_time`, `access_count`),
        and goes with it. A per-sequence table here would outlive its sequences (the policy is
        never told that one ended) and grow with every sequence served, read by nothing."""

    def get_metrics(self) -> EvictionMetrics:
        """Evictions, `select_victims` latency (ms), re-prefill rate and Jain's fairness over
        the per-tenant hit rates this policy has seen (inserts are misses, accesses hits)."""
        rates = [h / n for h, n in self._tenants.values() if n]
        lookups = sum(n for _, n in self._tenants.values())
        hits = sum(h for h, _ in self._tenants.values())
        p50, p99 = self._select_latency.quantiles(0.5, 0.99)
        return EvictionMetrics(
            total_evictions=self._evictions,
            avg_eviction_time=self._select_latency.mean * 1e3,
            re_prefill_rate=self._re_prefills / self._evictions if self._evictions else 0.0,
            fairness_score=jain_fairness(rates),
            strategy=self.name.upper(),
            p50_eviction_time=p50 * 1e3,
            p99_eviction_time=p99 * 1e3,
            hit_rate=hits / lookups if lookups else 0.0,
            extra={"select_victims_calls": self._select_latency.count},
        )


def seen_once_first_key(candidate: EvictionCandidate) -> tuple[bool, float]:
    """Sequences seen once before sequences seen again, least recent first within each: the
    sequence-level order of the policies that split entries by reuse (ARC's T1/T2, SIEVE's
    visited bit, SLRU's segments) when the candidates carry only counts and times."""
    return (candidate.access_count > 1, candidate.last_access_time)


def seen_once_first_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    """The candidates whose `seen_once_first_key` is <= `bound`, in list order."""
    again, t = bound
    if again:  # every first-timer, and the others up to t
        return [c for c in candidates if c.access_count <= 1 or c.last_access_time <= t]
    return [c for c in candidates if c.access_count <= 1 and c.last_access_time <= t]


# Per class, read once: which `candidates_up_to` and `candidate_order` go with its key.
_UP_TO: dict[type[SequenceLevelInterface], UpTo | None] = {}
_ORDER: dict[type[SequenceLevelInterface], tuple[str, tuple[float, ...]] | None] = {}


def _up_to_of(cls: type[SequenceLevelInterface]) -> UpTo | None:
    """`cls.candidates_up_to` when the class that defines it also defines `candidate_key`."""
    try:
        return _UP_TO[cls]
    except KeyError:
        pass
    owner = next(k for k in cls.__mro__ if "candidate_key" in k.__dict__)
    up_to = cls.candidates_up_to if "candidates_up_to" in owner.__dict__ else None
    _UP_TO[cls] = up_to
    return up_to


def _order_of(cls: type[SequenceLevelInterface]) -> tuple[str, tuple[float, ...]] | None:
    """`cls.candidate_order` when the class that defines `candidate_key` also defines it."""
    try:
        return _ORDER[cls]
    except KeyError:
        pass
    owner = next(k for k in cls.__mro__ if "candidate_key" in k.__dict__)
    order = owner.__dict__.get("candidate_order")
    _ORDER[cls] = order
    return order


def select_in_order(
    candidates: list[EvictionCandidate],
    required_blocks: int,
    key: Callable[[EvictionCandidate], Any],
    up_to: UpTo | None = None,
) -> list[int]:
    """Greedy victim choice shared by every policy: unpinned candidates by `key` (ties by
    position), until enough blocks are freed.

    Only the few candidates that can be chosen are sorted. A sorted sample of about 64 keys
    gives a threshold below which the candidates should hold twice the blocks needed. With
    `up_to` (the policy's `candidates_up_to`, which must keep exactly the candidates whose key
    is <= the threshold, in list order), one list comprehension keeps those, a stable sort
    orders them, and when they free enough that is the answer: every other candidate's key is
    larger. Otherwise, or without `up_to`, the keys of all candidates are computed: one pass
    of comparisons keeps those under the threshold, and the rest are sorted only when they
    turn out to be needed.
    """
    if required_blocks <= 0:
        return []
    n = len(candidates)
    if up_to is not None and n > 128:
        stride = n // 64
        sample = candidates[::stride]
        sample.sort(key=key)  # stable: equal keys keep their positions' order
        sampled_blocks = 0
        for candidate in sample:
            if not candidate.is_pinned:
                sampled_blocks += len(candidate.block_ids) * stride
                if sampled_blocks >= 2 * required_blocks:
                    kept = up_to(candidates, key(candidate))
                    kept.sort(key=key)
                    victims: list[int] = []
                    freed = 0
                    for chosen in kept:
                        if not chosen.is_pinned:
                            victims.append(chosen.sequence_id)
                            freed += len(chosen.block_ids)
                            if freed >= required_blocks:
                                return victims
                    break  # the sample misled: the general pass below
    return _select_by_keys(candidates, required_blocks, key)


def _select_by_keys(
    candidates: list[EvictionCandidate], required_blocks: int, key: Callable[[EvictionCandidate], Any]
) -> list[int]:
    keys = list(map(key, candidates))
    by_key = keys.__getitem__
    n = len(keys)
    threshold: Any = None
    order: list[int] | None = None  # candidate positions, in the order they are taken
    if n > 128:
        stride = n // 64
        sampled_blocks = 0
        for i in sorted(range(0, n, stride), key=by_key):
            if not candidates[i].is_pinned:
                sampled_blocks += len(candidates[i].block_ids) * stride
                if sampled_blocks >= 2 * required_blocks:
                    threshold = keys[i]
                    order = [j for j, k in enumerate(keys) if k <= threshold]
                    break
    if order is None:
        order = list(range(n))
    victims: list[int] = []
    freed = 0

    def take(positions: list[int]) -> bool:
        nonlocal freed
        positions.sort(key=by_key)  # stable: equal keys keep their positions' order
        for i in positions:
            candidate = candidates[i]
            if not candidate.is_pinned:
                victims.append(candidate.sequence_id)
                freed += len(candidate.block_ids)
                if freed >= required_blocks:
                    return True
        return False

    if not take(order) and len(order) < n:  # the sample misled: take the rest too
        take([j for j, k in enumerate(keys) if not k <= threshold])
    return victims
