"""What the cache accounts for each lookup and eviction beyond hit counts: ages, regret, records.

`CacheAccounting` is told each admitted lookup (`on_lookup`: its keys, its hit path, its time)
and each eviction's dropped victims (`on_evict`). It keeps the age and reuse-distance
histograms (`ages`), the regret ghost set (`ghosts`), the thrashing watch, and writes the
per-lookup record when a `LookupLog` is given (docs/architecture.md, "Ages and regret" and
"Lookup records"). `snapshot` is its part of `CacheStats`. Called under the cache manager's lock.
Imports `ages`, `cached_block`, `ghosts`, `lookup_log`, `receipts` and structlog.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypedDict

import structlog

from engine_adapter.cache.ages import AgeHistograms, HistogramSnapshot
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.ghosts import Ghost, new_ghost_set
from engine_adapter.cache.lookup_log import LookupLog
from engine_adapter.cache.receipts import RequestReceipts

__all__ = ["THRASHING_THRESHOLD", "AccountingStats", "CacheAccounting"]

log = structlog.get_logger("sage.cache")

THRASHING_THRESHOLD = 0.5
"""The cache is `thrashing` while at least this share of the missed blocks of the last full
window were regrets (blocks it evicted although it kept others that were not needed first)."""


class _Named(Protocol):
    """What names the active policy (`policy_binding.PolicyBinding`; it changes with hot swaps)."""

    @property
    def name(self) -> str: ...


class AccountingStats(TypedDict):
    """The accounting's figures, as `CacheStats` carries them (its fields of the same names).

    Attributes:
        missed_blocks: Blocks lookups missed (the prompts' blocks past their hits).
        ghost_hits: Of those, blocks still in the ghost set (evicted not long before).
        regrets: Of those, avoidable evictions (`ghosts`).
        regret_ratio: regrets / missed_blocks (0 before the first miss).
        ghost_capacity: Evicted keys the ghost set keeps.
        thrashing: The last full window's regret ratio is at least `thrashing_threshold`.
        thrashing_threshold: `THRASHING_THRESHOLD`.
        window_regret_ratio: The last full window's regret ratio (a window is `max(256, capacity)`
            missed blocks; None before the first).
        age_histograms: The age and reuse-distance histograms (`ages`).
    """

    missed_blocks: int
    ghost_hits: int
    regrets: int
    regret_ratio: float
    ghost_capacity: int
    thrashing: bool
    thrashing_threshold: float
    window_regret_ratio: float | None
    age_histograms: tuple[HistogramSnapshot, ...]


class CacheAccounting:
    """Ages, regret and lookup records of one cache.

    Args:
        capacity: The pool's blocks.
        clock: The cache's clock (seconds).
        policy: Names the active policy (it changes with hot swaps).
        ghost_factor: The ghost set keeps ``ghost_factor * capacity`` evicted keys (> 0).
        lookup_log: Where per-lookup records go, or None (off).
        int_keys: Every block key is an int64: the ghost set in C where built
            (`ghosts.new_ghost_set`; the same figures either way).
    """

    def __init__(
        self,
        capacity: int,
        clock: Callable[[], float],
        policy: _Named,
        ghost_factor: float = 2.0,
        lookup_log: LookupLog | None = None,
        int_keys: bool = False,
    ) -> None:
        if not ghost_factor > 0:
            raise ValueError(f"ghost_factor={ghost_factor!r} must be positive")
        n_ghosts = max(1, round(ghost_factor * capacity))
        self.ghosts = new_ghost_set(n_ghosts, max(n_ghosts, capacity), int_keys)
        self.ages = AgeHistograms()
        self.lookup_log = lookup_log
        self.receipts: RequestReceipts | None = None  # set by the manager (`receipts`)
        self._clock = clock
        self._binding = policy
        self.missed = self.ghost_hits = self.regrets = 0
        self.window = max(256, capacity)
        self._window_missed = self._window_regrets = 0
        self.window_ratio: float | None = None
        self.thrashing = False

    def on_lookup(
        self,
        keys: Sequence[Hashable],
        path: Sequence[CachedBlock],
        n_hit: int,
        tenant: str | None,
        matchable: int,
        record: dict[str, object] | None = None,
    ) -> list[tuple[int, Ghost, bool]]:
        """An admitted lookup of `keys` that hit `n_hit` blocks (`path` of them on the device)
        of the `matchable` it could: hit ages and reuse distances, and each missed key against
        the ghost set, in order. `record` (the lookup's record, when logged) gets where the match
        stopped, and is written. Returns the missed keys that were ghosts (index, ghost, regret),
        for the request's receipt (`receipts`)."""
        now, policy, ages = self._clock(), self._binding.name, self.ages
        ages.observe_many("age_at_hit_seconds", policy, tenant, [now - b.meta.created_at for b in path])
        times, ghosts = self.ghosts.lookup(keys, n_hit)
        horizon = self.ghosts.times.horizon
        distances = [float(horizon if t is None else t) for t in times[: len(path)]]
        ages.observe_many("reuse_distance_blocks", policy, tenant, distances)
        stop: Ghost | None = None
        for i, ghost, regret in ghosts:
            self._on_ghost(ghost, regret, now)
            if i == n_hit:
                stop = ghost
        self._count_misses(len(keys) - n_hit)
        if record is not None and self.lookup_log is not None:
            record["ts"], record["policy"] = now, policy
            record["stop"] = "end" if n_hit >= matchable else ("absent" if stop is None else "evicted")
            record["eviction"] = None if stop is None else self._eviction(stop, keys[n_hit], now)
            self.lookup_log.write(record)
        return ghosts

    @staticmethod
    def _eviction(ghost: Ghost, key: Hashable, now: float) -> dict[str, object]:
        return {
            "id": ghost.eviction_id,
            "block": format_block_key(key),
            "evicted_at": ghost.evicted_at,
            "policy": ghost.policy,
            "seconds_ago": now - ghost.evicted_at,
        }

    def _on_ghost(self, ghost: Ghost, regret: bool, now: float) -> None:
        self.ghost_hits += 1
        if regret:
            self.regrets += 1
            self._window_regrets += 1
            self.ages.observe("regret_age_seconds", ghost.policy, ghost.tenant, now - ghost.evicted_at)

    def _count_misses(self, n: int) -> None:
        """Count `n` missed blocks; a full window updates `thrashing` (logged when it turns)."""
        self.missed += n
        self._window_missed += n
        if self._window_missed < self.window:
            return
        ratio = self._window_regrets / self._window_missed
        self._window_missed = self._window_regrets = 0
        self.close_window(ratio)

    def close_window(self, ratio: float) -> None:
        """A full window's regret ratio: `window_ratio` and `thrashing` (logged when it turns).
        The simulator's compiled radix loop counts the windows itself and calls this."""
        self.window_ratio = ratio
        thrashing = ratio >= THRASHING_THRESHOLD
        if thrashing and not self.thrashing:
            log.warning(
                "thrashing",
                regret_ratio=round(ratio, 4),
                threshold=THRASHING_THRESHOLD,
                window_blocks=self.window,
                policy=self._binding.name,
            )
        elif self.thrashing and not thrashing:
            log.info("thrashing over", regret_ratio=round(ratio, 4), threshold=THRASHING_THRESHOLD)
        self.thrashing = thrashing

    def on_evict(self, victims: Sequence[CachedBlock], eviction_ids: Sequence[int], kept: int) -> None:
        """One eviction call's dropped victims with their eviction ids (those of their ``evict``
        events), `kept` reclaimable blocks staying: their ages, and each a ghost (the call's
        shared fields once, an id and a tenant per victim: no object per victim)."""
        if not victims:
            return
        now, policy = self._clock(), self._binding.name
        call = self.ghosts.eviction(now, self.ghosts.stamp(), kept, policy)
        metas = [block.meta for block in victims]
        tenants = [meta.tenant for meta in metas]
        ages = [now - meta.created_at for meta in metas]
        if tenants.count(tenants[0]) == len(tenants):  # one tenant, the usual case: one histogram
            self.ages.observe_many("age_at_eviction_seconds", policy, tenants[0], ages)
        else:
            self._observe_by_tenant("age_at_eviction_seconds", policy, tenants, ages)
        self.ghosts.add_many([block.key for block in victims], eviction_ids, tenants, call)
        if self.receipts is not None:
            self.receipts.on_evicted(len(victims))

    def _observe_by_tenant(
        self, kind: str, policy: str, tenants: list[str | None], values: list[float]
    ) -> None:
        """`observe_many` of each tenant's values, tenants in order of first appearance."""
        by_tenant: dict[str | None, list[float]] = {}
        for tenant, value in zip(tenants, values, strict=True):
            group = by_tenant.get(tenant)
            if group is None:
                group = by_tenant[tenant] = []
            group.append(value)
        for tenant, group in by_tenant.items():
            self.ages.observe_many(kind, policy, tenant, group)

    def forget(self) -> None:
        """A cache reset: the ghosts go (what comes back was not evicted); counts stay."""
        self.ghosts.clear()
        if self.receipts is not None:
            self.receipts.clear()

    def snapshot(self) -> AccountingStats:
        """The figures now."""
        return AccountingStats(
            missed_blocks=self.missed,
            ghost_hits=self.ghost_hits,
            regrets=self.regrets,
            regret_ratio=self.regrets / self.missed if self.missed else 0.0,
            ghost_capacity=self.ghosts.capacity,
            thrashing=self.thrashing,
            thrashing_threshold=THRASHING_THRESHOLD,
            window_regret_ratio=self.window_ratio,
            age_histograms=self.ages.snapshot(),
        )
