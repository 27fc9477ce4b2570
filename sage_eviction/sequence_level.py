"""The module spec's sequence-level interface: `select_victims`, `update_access`, `get_metrics`
(docs/architecture.md, "The module spec's interface").

`SequenceLevelInterface` is a mixin of `sage_eviction.base.EvictionPolicy` (its only user): it
orders `EvictionCandidate` sequences by a `PreemptionOrder` (`sage_eviction.preemption`: the
caller's, else the one the policy names) and reports the policy's counters, which
`EvictionPolicy` keeps (declared here for the type checker only). The victim choice runs in the
compiled core where the order has a compiled copy (`sage_eviction/_core.pyx`, `select_victims`),
else in `select_in_order`, its pure-Python reference.

- `select_in_order`: the greedy victim choice shared by every order.

Imports: the standard library and `sage_eviction.native` / `.metrics` / `.preemption` / `.types`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from sage_eviction import native
from sage_eviction.metrics import LatencyRecorder, jain_fairness
from sage_eviction.preemption import PreemptionOrder, UpTo, get_order
from sage_eviction.types import EvictionCandidate, EvictionMetrics, EvictionPolicyProtocol

__all__ = ["SequenceLevelInterface", "select_in_order"]


class SequenceLevelInterface(EvictionPolicyProtocol):
    """The module spec's sequence-level API on top of a policy's incremental state.

    Candidate sequences are ordered by a `PreemptionOrder` (`sage_eviction.preemption`): the
    caller's, else the one the policy class names in `preemption_order` (LRU unless overridden).
    """

    # EvictionPolicy's, set in its __init__ (declared for the type checker).
    name: ClassVar[str]
    _compiled: bool
    _evictions: int
    _re_prefills: int
    _tenants: dict[str | None, list[int]]
    _select_latency: LatencyRecorder

    preemption_order: ClassVar[str] = "lru"
    """The name of this policy's default order over running sequences in
    `sage_eviction.preemption.ORDERS`; the scheduler may choose another
    (tests/test_native_core.py checks every registered policy names one that exists)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a class written for the old per-policy order (`candidate_key` and its
        companions), which nothing reads any more: silently ignoring it would preempt in
        another order than its author wrote."""
        super().__init_subclass__(**kwargs)
        old = [a for a in ("candidate_key", "candidates_up_to", "candidate_order") if a in cls.__dict__]
        if old:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(old)}, which sage no longer reads: register a "
                "PreemptionOrder (sage_eviction.preemption.register_order) and name it in the class's "
                "`preemption_order` (docs/howto.md, 'A preemption order')"
            )

    def select_victims(
        self, candidates: list[EvictionCandidate], required_blocks: int, order: PreemptionOrder | None = None
    ) -> list[int]:
        """Pick sequences in `order` until they free `required_blocks` blocks.

        Pinned candidates are never returned; when the unpinned ones together free fewer than
        `required_blocks`, all of them are returned.

        Args:
            candidates: The running sequences that may be chosen.
            required_blocks: Blocks the caller needs.
            order: The order to take them in; None: the policy's (`preemption_order`).
        """
        start = time.perf_counter()
        if order is None:
            order = get_order(self.preemption_order)
        victims: list[int] | None = None
        if self._compiled and order.compiled is not None and type(candidates) is list:
            core = native.load(native.CORE)
            if core is not None:  # None from the core: only Python orders it
                victims = core.select_victims(candidates, required_blocks, *order.compiled)
        if victims is None:
            victims = select_in_order(candidates, required_blocks, order.key, order.up_to)
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
    `up_to` (the order's, which must keep exactly the candidates whose key
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
