"""A flat block cache: independent blocks of size 1, a fixed capacity, every miss admitted.

This is the cache model libCacheSim simulates (demand paging with forced admission), so the
policies that both have (LRU, FIFO, LFU, ARC, S3-FIFO, SIEVE, Belady) must give the same
misses here as there; `tests/test_libcachesim_oracle.py` checks it. The simulator uses it as
its `flat` cache model (docs/architecture.md, "Simulator").

One request for key k:

- k is held: a hit, `policy.access(k, now)` (now = the request's number, from 1).
- otherwise a miss: `policy.prepare_insert(k)` when the policy has it (ARC and S3-FIFO use it
  to see a ghost hit before evicting, as their papers do), then `policy.evict(1)` when the
  cache is full, then `policy.insert(k)`.

An offline policy (Belady) gets the whole key sequence as `future`. `FlatCache.request` is the
one loop, and `FlatCache.lookup` runs it over many keys: `simulate_flat` over a key sequence,
the simulator's flat model over each request's blocks, observing misses and evictions through
sage's own records (`reprefill`, `latency`) or any hooks. Where the compiled core is built,
`lookup` is one call into it (`sage_eviction._core.flat_lookup`): `request` per key in C, the
policy called through its C table when it has one (sage_eviction/native.py); the same counts,
victims and records (tests/test_flat_lookup.py).

With `int_keys=True` (the keys are ints within int64, as the simulator's block keys are) and no
per-block hooks, a policy of `_core.flat_state_policies()` (lru, fifo, mru, filo, sieve, s3fifo,
arc; belady given its future here) runs with its state in C too (`sage_eviction._core.FlatState`:
an int64 hash table, linked lists, ghosts, a heap, the re-prefill tracker's evicted keys in a
second table), which removes the Python containers' operations that are most of the cost of the
other paths (docs/performance.md). The policy object then stays empty: it names the policy, and
the cache's `keys()` gives the held keys; the counts, victims and records are the other paths'
(tests/test_flat_state.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sage_eviction import native
from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import PolicyStateError
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.registry import create_policy

__all__ = ["FlatCache", "FlatResult", "int64_keys", "simulate_flat"]


@dataclass(frozen=True, slots=True)
class FlatResult:
    """Counts of one flat simulation."""

    policy: str
    capacity: int
    requests: int
    hits: int
    misses: int
    evictions: int

    @property
    def hit_ratio(self) -> float:
        """hits / requests (0.0 for no request)."""
        return self.hits / self.requests if self.requests else 0.0

    @property
    def miss_ratio(self) -> float:
        """misses / requests (0.0 for no request)."""
        return self.misses / self.requests if self.requests else 0.0


def _build(policy: EvictionPolicy | str, capacity: int, params: dict[str, Any]) -> EvictionPolicy:
    if capacity <= 0:
        raise ValueError(f"capacity={capacity} must be a positive number of blocks")
    if isinstance(policy, EvictionPolicy):
        if params:
            raise ValueError("params are for a policy given by name, not for a policy instance")
        return policy
    return create_policy(policy, capacity=capacity, **params)


def _prepare_hook(policy: EvictionPolicy) -> Callable[[Hashable], None] | None:
    """The policy's `prepare_insert`, or None where it is `EvictionPolicy`'s own (a no-op)."""
    if getattr(type(policy), "prepare_insert", None) is EvictionPolicy.prepare_insert:
        return None
    hook = getattr(policy, "prepare_insert", None)
    return hook if callable(hook) else None


_INT64 = range(-(2**63), 2**63)


def int64_keys(keys: Sequence[Any]) -> bool:
    """Whether every key is an int within int64 (what `FlatCache(int_keys=True)` asks): the
    types in one pass, then the two ends."""
    if set(map(type, keys)) - {int}:
        return False
    return min(keys, default=0) in _INT64 and max(keys, default=0) in _INT64


class FlatCache:
    """A cache of `capacity` independent unit-size blocks ordered by `policy`: the one flat loop.

    Args:
        policy: A policy instance (empty) or a spec for `create_policy`, e.g. `"slru:protected_threshold=3"`.
        capacity: Blocks the cache holds.
        future: The whole key sequence, handed to Belady (`set_future`; or call it yourself);
            ignored by the other policies.
        on_miss: Called with each missed key before the evictions that make room for it.
        on_evict: Called with each victim and the wall seconds of the policy's decision (it is
            timed only when this or `latency` is given).
        reprefill: Told each miss (before the evictions for it) and each victim, in order: the
            re-prefill rate (`on_request`, `on_evict`), without a hook call per block.
        latency: Records the wall seconds of each eviction decision.
        int_keys: The keys are ints within int64: the policy's state may then live in C (module
            docstring); a key that is not such an int raises TypeError or OverflowError.
        **params: Params for a policy given by name.

    Raises:
        ValueError: An offline policy other than Belady, or a policy that is not empty.
    """

    def __init__(
        self,
        policy: EvictionPolicy | str,
        capacity: int,
        *,
        future: Sequence[Hashable] | None = None,
        on_miss: Callable[[Hashable], object] | None = None,
        on_evict: Callable[[Hashable, float], None] | None = None,
        reprefill: ReprefillTracker | None = None,
        latency: LatencyRecorder | None = None,
        int_keys: bool = False,
        **params: Any,
    ) -> None:
        self.policy = _build(policy, capacity, params)
        if len(self.policy):
            raise ValueError(
                f"the policy already holds {len(self.policy)} entries; a flat cache starts empty"
            )
        if isinstance(self.policy, BeladyPolicy) and future is not None:
            self.policy.set_future(future)
        elif self.policy.offline and not isinstance(self.policy, BeladyPolicy):
            raise ValueError(f"offline policy {self.policy.name!r} needs a future the flat cache cannot give")
        self.capacity = capacity
        self.requests = 0
        self.hits = 0
        self.evictions = 0
        self._held = 0  # the policy's len, without the call
        self._prepare = _prepare_hook(self.policy)
        self._on_miss = on_miss  # its result, if any, is not used
        self._on_evict = on_evict
        self.reprefill = reprefill
        self.latency = latency
        # one compiled call per `lookup` (chosen once, as a policy chooses: native.py)
        core = native.core()
        self._lookup_in_c: Callable[[FlatCache, Iterable[Hashable]], tuple[int, bool]] | None = (
            None if core is None else core.flat_lookup
        )
        self._state: Any = None  # the cache with the policy's state in C (`_core.FlatState`)
        hooked = on_miss is not None or on_evict is not None  # a hook per block: the Python loop
        if int_keys and core is not None and not hooked and core.flat_state_runs(self.policy):
            self._state = core.FlatState(self.policy, capacity, reprefill=reprefill, latency=latency)
        self.policy_calls = (
            "c-state"
            if self._state is not None
            else "compiled"
            if core is not None and core.has_compiled_ops(self.policy)
            else "python"
        )
        """How `lookup` runs the policy: "c-state" (in C, its state in C arrays), "compiled" (its
        C table over its Python state) or "python" (its methods)."""

    @property
    def misses(self) -> int:
        """Requests that were not hits."""
        return self.requests - self.hits

    def __len__(self) -> int:
        return len(self.policy) if self._state is None else len(self._state)

    def __contains__(self, key: object) -> bool:
        return key in self.policy if self._state is None else key in self._state

    def keys(self) -> frozenset[Hashable]:
        """The held keys."""
        if self._state is None:
            return frozenset(self.policy.peek(len(self.policy)))
        return frozenset(self._state.keys())

    @property
    def state(self) -> Any:
        """The `_core.FlatState` the policy's state is in ("c-state"), else None: a compiled
        caller may look keys up in it directly, then calls `sync_from_state`."""
        return self._state

    def sync_from_state(self) -> None:
        """Read the counts back from the `FlatState` (after each of this cache's own calls, and
        after lookups a compiled caller made in it directly)."""
        state = self._state
        self.requests, self.hits, self.evictions, self._held = (
            state.requests,
            state.hits,
            state.evictions,
            state.held,
        )

    def request(self, key: Hashable) -> bool:
        """Look `key` up; returns whether it was a hit. A miss is admitted, evicting one block
        first when the cache is full.

        Raises:
            PolicyStateError: The cache is full and the policy has nothing evictable.
        """
        if self._state is not None:
            try:
                return bool(self._state.request(key))
            finally:
                self.sync_from_state()
        policy = self.policy
        self.requests = now = self.requests + 1
        if key in policy:
            policy.access(key, now)
            self.hits += 1
            return True
        if self.reprefill is not None:
            self.reprefill.on_request(key)
        if self._on_miss is not None:
            self._on_miss(key)
        if self._prepare is not None:
            self._prepare(key)
        if self._held >= self.capacity:
            self._evict_one()
        else:
            self._held += 1
        policy.insert(key)
        return False

    def _evict_one(self) -> None:
        timed = self._on_evict is not None or self.latency is not None
        start = time.perf_counter() if timed else 0.0
        victims = self.policy.evict(1)
        seconds = time.perf_counter() - start if timed else 0.0
        if not victims:
            raise PolicyStateError(f"flat cache full ({self.capacity} blocks) and nothing evictable")
        if self.latency is not None:
            self.latency.record(seconds)
        if self.reprefill is not None:
            self.reprefill.on_evict(victims[0])
        if self._on_evict is not None:
            self._on_evict(victims[0], seconds)
        self.evictions += 1

    def lookup(self, keys: Iterable[Hashable]) -> tuple[int, bool]:
        """`request` each key in order; returns the hits and whether the last key hit (False
        for no key). One compiled call where the compiled core is built."""
        if self._state is not None:
            try:
                hits_last: tuple[int, bool] = self._state.lookup(keys)
                return hits_last
            finally:
                self.sync_from_state()
        if self._lookup_in_c is not None:
            return self._lookup_in_c(self, keys)
        request = self.request
        hits, last = 0, False
        for key in keys:
            last = request(key)
            hits += last
        return hits, last

    def result(self) -> FlatResult:
        """The counts so far."""
        return FlatResult(
            self.policy.name, self.capacity, self.requests, self.hits, self.misses, self.evictions
        )


def simulate_flat(
    keys: Iterable[Hashable], policy: EvictionPolicy | str, capacity: int, **params: Any
) -> FlatResult:
    """Run `keys` through a `FlatCache` of `capacity` blocks; an offline policy gets `keys` as its
    future.

    Args:
        keys: The block lookups, in order.
        policy: A policy instance (empty) or a spec for `create_policy`.
        capacity: Blocks the cache holds.
        **params: Params for a policy given by name.

    Returns:
        Requests, hits, misses and evictions.
    """
    keys = keys if isinstance(keys, Sequence) else list(keys)
    cache = FlatCache(policy, capacity, future=keys, int_keys=int64_keys(keys), **params)
    cache.lookup(keys)
    return cache.result()
