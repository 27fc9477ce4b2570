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
one loop: `simulate_flat` drives it over a key sequence, and the simulator's flat model over each
request's blocks, observing misses and evictions through its hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import PolicyStateError
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.registry import create_policy

__all__ = ["FlatCache", "FlatResult", "simulate_flat"]


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
    hook = getattr(policy, "prepare_insert", None)
    return hook if callable(hook) else None


class FlatCache:
    """A cache of `capacity` independent unit-size blocks ordered by `policy`: the one flat loop.

    Args:
        policy: A policy instance (empty) or a spec for `create_policy`, e.g. `"slru:protected_threshold=3"`.
        capacity: Blocks the cache holds.
        future: The whole key sequence, handed to Belady (`set_future`; or call it yourself);
            ignored by the other policies.
        on_miss: Called with each missed key before the evictions that make room for it.
        on_evict: Called with each victim and the wall seconds of the policy's decision (it is
            timed only when this is given).
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

    @property
    def misses(self) -> int:
        """Requests that were not hits."""
        return self.requests - self.hits

    def __len__(self) -> int:
        return len(self.policy)

    def __contains__(self, key: object) -> bool:
        return key in self.policy

    def request(self, key: Hashable) -> bool:
        """Look `key` up; returns whether it was a hit. A miss is admitted, evicting one block
        first when the cache is full.

        Raises:
            PolicyStateError: The cache is full and the policy has nothing evictable.
        """
        policy = self.policy
        self.requests = now = self.requests + 1
        if key in policy:
            policy.access(key, now)
            self.hits += 1
            return True
        if self._on_miss is not None:
            self._on_miss(key)
        if self._prepare is not None:
            self._prepare(key)
        if self._held >= self.capacity:
            if self._on_evict is None:
                victims = policy.evict(1)
            else:
                start = time.perf_counter()
                victims = policy.evict(1)
                seconds = time.perf_counter() - start
            if not victims:
                raise PolicyStateError(f"flat cache full ({self.capacity} blocks) and nothing evictable")
            if self._on_evict is not None:
                self._on_evict(victims[0], seconds)
            self.evictions += 1
        else:
            self._held += 1
        policy.insert(key)
        return False

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
    cache = FlatCache(policy, capacity, future=keys, **params)
    request = cache.request
    for key in keys:
        request(key)
    return cache.result()
