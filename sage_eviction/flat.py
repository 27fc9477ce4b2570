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

An offline policy (Belady) gets the whole key sequence through `set_future` from
`simulate_flat`; with `FlatCache`, call `policy.set_future(keys)` yourself.
"""

from __future__ import annotations

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
    """A cache of `capacity` independent unit-size blocks ordered by `policy`.

    Args:
        policy: A policy instance (empty) or a spec for `create_policy`, e.g. `"slru:protected_threshold=3"`.
        capacity: Blocks the cache holds.
        **params: Params for a policy given by name.
    """

    def __init__(self, policy: EvictionPolicy | str, capacity: int, **params: Any) -> None:
        self.policy = _build(policy, capacity, params)
        self.capacity = capacity
        self.requests = 0
        self.hits = 0
        self.evictions = 0
        self._prepare = _prepare_hook(self.policy)

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
        if self._prepare is not None:
            self._prepare(key)
        if len(policy) >= self.capacity:
            if not policy.evict(1):
                raise PolicyStateError(f"flat cache full ({self.capacity} blocks) and nothing evictable")
            self.evictions += 1
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
    """Run `keys` through a flat cache of `capacity` blocks; an offline policy gets `keys` as
    its future.

    Args:
        keys: The block lookups, in order.
        policy: A policy instance (empty) or a spec for `create_policy`.
        capacity: Blocks the cache holds.
        **params: Params for a policy given by name.

    Returns:
        Requests, hits, misses and evictions.
    """
    cache_policy = _build(policy, capacity, params)
    if isinstance(cache_policy, BeladyPolicy):
        if not isinstance(keys, Sequence):
            keys = list(keys)
        cache_policy.set_future(keys)
    elif cache_policy.offline:
        raise ValueError(f"offline policy {cache_policy.name!r} needs a future the flat driver cannot give")
    prepare = _prepare_hook(cache_policy)
    access = cache_policy.access
    insert = cache_policy.insert
    evict = cache_policy.evict
    held = len(cache_policy)
    if held:
        raise ValueError(f"the policy already holds {held} entries; the flat driver starts empty")
    hits = evictions = requests = 0
    # Two copies of the loop keep the per-request work minimal.
    if prepare is None:
        for requests, key in enumerate(keys, 1):
            if key in cache_policy:
                access(key, requests)
                hits += 1
                continue
            if held >= capacity:
                if not evict(1):
                    raise PolicyStateError(f"flat cache full ({capacity} blocks) and nothing evictable")
                evictions += 1
            else:
                held += 1
            insert(key)
    else:
        for requests, key in enumerate(keys, 1):
            if key in cache_policy:
                access(key, requests)
                hits += 1
                continue
            prepare(key)
            if held >= capacity:
                if not evict(1):
                    raise PolicyStateError(f"flat cache full ({capacity} blocks) and nothing evictable")
                evictions += 1
            else:
                held += 1
            insert(key)
    return FlatResult(cache_policy.name, capacity, requests, hits, requests - hits, evictions)
