"""Slow, obviously correct reference models of the policies, for the state-machine tests.

Each model keeps its entries in a dict and finds the victim with a linear scan over them
(O(n)), with no heap, no lazy deletion and no linked list: only the policy's definition.
The interface every model has (helper models in `reference_models_adaptive` share it):

    Model(capacity: int | None, **params)      the policy's params, defaults filled in
    insert(key, meta, evictable)               meta is copied; the model keeps its own hits
    access(key, now)                           a hit at time `now`
    set_evictable(key, flag)
    remove(key)
    evict_one() -> key | None                  choose, forget and return the next victim
    prepare_insert(key)                        optional, for a policy that overrides it

A "tick" is a logical clock that advances on every insert and every access, so that "least
recent" is the entry whose latest insert or access came first; becoming evictable is not an
access. `REFERENCE_MODELS` maps registry names to models; it includes `REFERENCE_MODELS_B`
from `reference_models_adaptive` (ARC, SLRU, S3-FIFO, SIEVE).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any

from sage_eviction import EntryMeta

__all__ = ["REFERENCE_MODELS"]


@dataclass
class _Entry:
    meta: EntryMeta
    evictable: bool
    inserted: int  # tick of the insert
    touched: int  # tick of the latest insert or access


class _ScanModel:
    """Evicts the evictable entry of smallest `score`, found by scanning every entry."""

    def __init__(self, capacity: int | None = None, **params: Any) -> None:
        if params:
            raise TypeError(f"{type(self).__name__} takes no params, got {sorted(params)}")
        self.capacity = capacity
        self.entries: dict[Hashable, _Entry] = {}
        self.clock = 0

    def insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self.clock += 1
        self.entries[key] = _Entry(replace(meta), evictable, self.clock, self.clock)

    def access(self, key: Hashable, now: float) -> None:
        self.clock += 1
        entry = self.entries[key]
        entry.touched = self.clock
        entry.meta.hits += 1
        entry.meta.last_access = now

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        self.entries[key].evictable = flag

    def remove(self, key: Hashable) -> None:
        del self.entries[key]

    def evict_one(self) -> Hashable | None:
        evictable = [(self.score(k, e), k) for k, e in self.entries.items() if e.evictable]
        if not evictable:
            return None
        best_score, victim = evictable[0]
        for score, key in evictable[1:]:
            assert score != best_score, "the reference's scores must never tie"
            if score < best_score:
                best_score, victim = score, key
        del self.entries[victim]
        self.on_victim(victim, best_score)
        return victim

    def score(self, key: Hashable, entry: _Entry) -> Any:
        """Smaller is evicted sooner; never equal for two entries."""
        raise NotImplementedError

    def on_victim(self, key: Hashable, score: Any) -> None:
        """Called with each victim and its score (GDSF inflates its clock)."""


class LRUModel(_ScanModel):
    """The oldest latest insert or access goes first."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return entry.touched


class MRUModel(_ScanModel):
    """The newest latest insert or access goes first."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return -entry.touched


class FIFOModel(_ScanModel):
    """The oldest insert goes first; hits change nothing."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return entry.inserted


class FILOModel(_ScanModel):
    """The newest insert goes first; hits change nothing."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return -entry.inserted


class LFUModel(_ScanModel):
    """The fewest hits since insert go first, the least recent among equals."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return (entry.meta.hits, entry.touched)


class PriorityModel(_ScanModel):
    """The lowest priority goes first, the least recent within a priority."""

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return (entry.meta.priority, entry.touched)


class GDSFModel(_ScanModel):
    """Smallest H = L + (hits + 1) * cost / size first, the least recent among equals.

    H is fixed when the entry is inserted, hit while evictable, or made evictable again; the
    clock L becomes the victim's H.
    """

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self.inflation = 0.0
        self.h: dict[Hashable, float] = {}

    def _rescore(self, key: Hashable) -> None:
        meta = self.entries[key].meta
        self.h[key] = self.inflation + (meta.hits + 1) * meta.cost / max(meta.size, 1)

    def insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        super().insert(key, meta, evictable)
        self._rescore(key)

    def access(self, key: Hashable, now: float) -> None:
        super().access(key, now)
        if self.entries[key].evictable:
            self._rescore(key)

    def set_evictable(self, key: Hashable, flag: bool) -> None:
        if flag and not self.entries[key].evictable:
            self._rescore(key)
        super().set_evictable(key, flag)

    def remove(self, key: Hashable) -> None:
        super().remove(key)
        del self.h[key]

    def score(self, key: Hashable, entry: _Entry) -> Any:
        return (self.h[key], entry.touched)

    def on_victim(self, key: Hashable, score: Any) -> None:
        self.inflation = score[0]
        del self.h[key]


class PredictiveModel(_ScanModel):
    """Soonest predicted end first (none or unconfident: after all others), then the highest
    completion ratio, then the least recent.

    The prediction is the default one: `estimated_lifetime` with confidence 1, else the tokens
    left to `max_len` times `decode_time_per_token` with `token_estimate_confidence`; the end
    is `last_access + lifetime`.
    """

    def __init__(
        self,
        capacity: int | None = None,
        predictor: object = None,
        confidence_threshold: float = 0.9,
        decode_time_per_token: float = 0.02,
        token_estimate_confidence: float = 0.95,
    ) -> None:
        super().__init__(capacity)
        if predictor is not None:
            raise ValueError("the reference models only the default predictor")
        self.confidence_threshold = confidence_threshold
        self.decode_time_per_token = decode_time_per_token
        self.token_estimate_confidence = token_estimate_confidence

    def score(self, key: Hashable, entry: _Entry) -> Any:
        meta = entry.meta
        lifetime, confidence = math.nan, 0.0
        if meta.estimated_lifetime is not None:
            lifetime, confidence = meta.estimated_lifetime, 1.0
        elif meta.max_len > 0:
            lifetime = max(meta.max_len - meta.seq_len, 0) * self.decode_time_per_token
            confidence = self.token_estimate_confidence
        end = math.inf
        if confidence >= self.confidence_threshold and not math.isnan(lifetime):
            end = meta.last_access + lifetime
        completion = meta.seq_len / meta.max_len if meta.max_len > 0 else 0.0
        return (end, -completion, entry.touched)


class SLOModel(_ScanModel):
    """Unprotected blocks first (completion below `protect_completion`), then the smallest
    priority_base ** priority / (slack + eps) + cost_weight * cost, then the least recent.

    slack = deadline - last_access (`default_slack` with no deadline); a missed deadline
    counts as no urgency.
    """

    def __init__(
        self,
        capacity: int | None = None,
        priority_base: float = 2.0,
        eps: float = 1e-3,
        cost_weight: float = 1e-3,
        default_slack: float = 3600.0,
        protect_completion: float = 0.9,
    ) -> None:
        super().__init__(capacity)
        self.priority_base = priority_base
        self.eps = eps
        self.cost_weight = cost_weight
        self.default_slack = default_slack
        self.protect_completion = protect_completion

    def score(self, key: Hashable, entry: _Entry) -> Any:
        meta = entry.meta
        slack = self.default_slack if meta.deadline is None else meta.deadline - meta.last_access
        urgency = 0.0 if slack < 0.0 else self.priority_base**meta.priority / (slack + self.eps)
        # seq_len / max_len >= protect_completion, multiplied out as the policy does, so that a
        # ratio on the boundary rounds the same way
        protected = meta.max_len > 0 and meta.seq_len >= self.protect_completion * meta.max_len
        return (protected, urgency + self.cost_weight * meta.cost, entry.touched)


REFERENCE_MODELS: dict[str, type] = {
    "lru": LRUModel,
    "mru": MRUModel,
    "fifo": FIFOModel,
    "filo": FILOModel,
    "lfu": LFUModel,
    "priority": PriorityModel,
    "gdsf": GDSFModel,
    "predictive": PredictiveModel,
    "slo": SLOModel,
}

from reference_models_adaptive import REFERENCE_MODELS_ADAPTIVE  # noqa: E402 (its models use the above)

_overlap = set(REFERENCE_MODELS_ADAPTIVE) & set(REFERENCE_MODELS)
if _overlap:
    raise RuntimeError(f"reference_models_adaptive redefines {sorted(_overlap)}")
REFERENCE_MODELS.update(REFERENCE_MODELS_ADAPTIVE)
