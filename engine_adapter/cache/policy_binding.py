"""The policy binding: which eviction policy the cache runs, built from its spec, and the hot swap.

A policy spec (``"lru"``, ``"slru:protected_threshold=3"``) is read in one place,
`sage_eviction.registry.resolve_policy`; `PolicyBinding` keeps what it resolved (the registry
name and params), builds the first policy, and replaces the radix index's policy by a hot swap
(`swap`), counting swaps for the stats. The radix index holds the policy object itself (its hot
paths call it); the binding holds its name. Called under the cache manager's lock
(docs/architecture.md, "Cache core"). Imports `errors`, `radix_cache`, `records` and the policy
library.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from engine_adapter.cache.errors import CacheInvariantError
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.records import SwapResult
from sage_eviction import EvictionPolicy
from sage_eviction.registry import ResolvedPolicy, resolve_policy

__all__ = ["PolicyBinding"]


class PolicyBinding:
    """The active policy's registry name and params, and its swaps.

    Args:
        spec: Policy spec, ``name`` or ``name:k=v,...``.
        capacity: The pool size, for policies that take `capacity`.
        params: More params (override the spec's).

    Attributes:
        name: The active policy's registry name.
        params: Its params, as resolved.
        swaps: Hot swaps done.
        last_swap_time_s: The last swap's pause, or None.

    Raises:
        UnknownPolicyError, PolicyParamError: As `resolve_policy`.
    """

    __slots__ = ("_resolved", "capacity", "last_swap_time_s", "name", "params", "swaps")

    def __init__(self, spec: str, capacity: int, params: dict[str, Any] | None = None) -> None:
        resolved = resolve_policy(spec, capacity, **dict(params or {}))
        self._resolved: ResolvedPolicy = resolved
        self.capacity = capacity
        self.name: str = resolved.cls.name
        self.params: dict[str, Any] = resolved.params
        self.swaps = 0
        self.last_swap_time_s: float | None = None

    def new_policy(self) -> EvictionPolicy:
        """An empty policy of the active spec (for a new radix index)."""
        return _unrecorded(self._resolved.build())

    def swap(self, radix: RadixCache, spec: str, **params: Any) -> SwapResult:
        """Replace `radix`'s policy with one built by `from_entries(old.entries(), ...)`, handed
        over as three columns (`entry_columns` / `from_entry_columns`, the same entries and state).

        Nothing is evicted or lost; on any error the old policy stays.

        Raises:
            UnknownPolicyError, PolicyParamError: As `resolve_policy`; nothing changed.
            CacheInvariantError: The new policy does not hold the same entries; the old one stays.
        """
        result, new, copied = self.swap_policy(radix.policy, len(radix), spec, **params)
        if copied:
            # The new policy copied the metas: point the blocks at its records.
            for block in radix.blocks():
                block.meta = new.meta(block.key)
        radix.set_policy(new)
        return result

    def swap_policy(
        self, old: EvictionPolicy, num_entries: int, spec: str, **params: Any
    ) -> tuple[SwapResult, EvictionPolicy, bool]:
        """Build the new policy of a hot swap from `old`'s entries (which must number
        `num_entries`) and make its spec the active one; the caller installs it (the radix index
        for the device, `TierLevel` for a lower tier).

        Returns:
            The swap's record, the new policy, and whether it copied the entries' metas (the
            holders of the old records must then point at the new policy's).

        Raises:
            UnknownPolicyError, PolicyParamError: As `resolve_policy`; nothing changed.
            CacheInvariantError: The new policy does not hold the same entries; nothing changed.
        """
        resolved = resolve_policy(spec, self.capacity, **params)
        # Building millions of entries would trigger many cyclic-GC passes over the whole
        # heap (about half the swap time at 1e6 blocks); nothing here makes cycles to collect.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            # `entries()` / `from_entries` as three columns: no record built per entry.
            t0 = time.perf_counter()
            keys, metas, flags = old.entry_columns()
            t1 = time.perf_counter()
            new = _unrecorded(resolved.build((keys, metas, flags)))
            t2 = time.perf_counter()
        finally:
            if gc_was_enabled:
                gc.enable()
        if len(new) != num_entries or new.num_evictable != old.num_evictable:
            raise CacheInvariantError(
                f"swap to {resolved.cls.name!r} holds {len(new)} entries "
                f"({new.num_evictable} evictable); the cache has {num_entries} "
                f"({old.num_evictable} evictable); kept {old.name!r}"
            )
        copied = bool(keys) and new.meta(keys[0]) is not metas[0]
        result = SwapResult(
            old_name=self.name,
            old_params=dict(self.params),
            new_name=resolved.cls.name,
            new_params=dict(resolved.params),
            swap_time_s=t2 - t0,
            entries=len(keys),
            entries_time_s=t1 - t0,
            build_time_s=t2 - t1,
        )
        self._resolved = resolved
        self.name = resolved.cls.name
        self.params = resolved.params
        self.swaps += 1
        self.last_swap_time_s = result.swap_time_s
        return result, new, copied


def _unrecorded(policy: EvictionPolicy) -> EvictionPolicy:
    """`policy`, told to keep no evicted keys of its own: the cache's `ReprefillTracker`
    (`CacheMetrics.reprefill`) is the one re-prefill record, so the keys are held once."""
    policy.stop_recording_evicted()
    return policy
