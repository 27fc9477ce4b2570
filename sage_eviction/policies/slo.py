"""SLO-aware: evict the block whose request is least urgent and cheapest to recompute.

Source: "SLO-Aware KV Cache Management for Collocated LLM-Embedding Services" (research
proposal, 2025), Algorithm 3: eviction cost = priority_factor / (slack + eps) +
recompute_cost, evict in ascending cost, and protect requests about to complete.

Here, per block:

    urgency = priority_base ** meta.priority / (slack + eps)
    slack   = meta.deadline - meta.last_access     (default_slack when there is no deadline)
    score   = urgency + cost_weight * meta.cost

and the smallest score is evicted first, least recent among equals. A block whose sequence
is near completion (`seq_len / max_len >= protect_completion`) is protected: it comes after
every unprotected block, as if a bonus larger than any score were added. A missed deadline
(negative slack) counts as no urgency: the request cannot meet its SLO any more, which is what
the proposal's formula also gives (a negative cost).

The score is fixed when the entry is inserted, hit or made evictable: slack is measured at
`meta.last_access` (the cache's clock at the latest insert or hit) and does not shrink while
the entry waits, which keeps every operation O(log n) instead of rescoring all entries on each
eviction.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

from sage_eviction.heap import FlatHeapPolicy
from sage_eviction.preemption import (  # its defaults, which its preemption order reads too
    DEFAULT_COST_WEIGHT,
    DEFAULT_EPS,
    DEFAULT_PRIORITY_BASE,
    DEFAULT_PROTECT_COMPLETION,
    DEFAULT_SLACK,
)
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["SLOPolicy"]


class SLOPolicy(FlatHeapPolicy):
    """Evicts the evictable entry of lowest urgency plus recompute cost; see the module docstring.

    Args:
        capacity: Cache size in blocks (unused).
        priority_base: Priority weight is `priority_base ** meta.priority` (> 0).
        eps: Added to the slack, in seconds (> 0).
        cost_weight: Weight of `meta.cost` (>= 0).
        default_slack: Slack of a block with no deadline, in seconds (>= 0).
        protect_completion: Completion ratio from which a block is protected (> 1 disables).
    """

    name = "slo"
    strategy = EvictionStrategy.SLO
    paper = (
        "SLO-Aware KV Cache Management for Collocated LLM-Embedding Services, "
        "research proposal 2025, Algorithm 3"
    )

    def __init__(
        self,
        capacity: int | None = None,
        priority_base: float = DEFAULT_PRIORITY_BASE,
        eps: float = DEFAULT_EPS,
        cost_weight: float = DEFAULT_COST_WEIGHT,
        default_slack: float = DEFAULT_SLACK,
        protect_completion: float = DEFAULT_PROTECT_COMPLETION,
    ) -> None:
        super().__init__(capacity)
        if not 0.0 < priority_base < math.inf:
            raise ValueError(f"priority_base={priority_base} must be a finite number > 0")
        if not 0.0 < eps < math.inf:
            raise ValueError(f"eps={eps} must be a finite number > 0")
        if not 0.0 <= cost_weight < math.inf:
            raise ValueError(f"cost_weight={cost_weight} must be a finite number >= 0")
        if not 0.0 <= default_slack < math.inf:
            raise ValueError(f"default_slack={default_slack} must be a finite number >= 0")
        if not protect_completion >= 0.0:
            raise ValueError(f"protect_completion={protect_completion} must be >= 0")
        self.priority_base = priority_base
        self.eps = eps
        self.cost_weight = cost_weight
        self.default_slack = default_slack
        self.protect_completion = protect_completion

    def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
        slack = self.default_slack if meta.deadline is None else meta.deadline - meta.last_access
        urgency = self.priority_base**meta.priority / (slack + self.eps) if slack >= 0.0 else 0.0
        protected = meta.max_len > 0 and meta.seq_len >= self.protect_completion * meta.max_len
        return (protected, urgency + self.cost_weight * meta.cost, self._tick[key])

    def _compiled_scoring(self) -> tuple[str, tuple[float, ...]] | None:
        params = (self.priority_base, self.eps, self.cost_weight, self.default_slack, self.protect_completion)
        return ("slo", params) if all(type(v) is float for v in params) else None

    explains_by = "protected near completion, then urgency + cost_weight * cost, then recency"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        slack = self.default_slack if meta.deadline is None else meta.deadline - meta.last_access
        rank = self.rank(key)
        assert rank is not None
        return {
            "protected": rank[0],
            "score": rank[1],
            "slack": slack,
            "urgency": self.priority_base**meta.priority / (slack + self.eps) if slack >= 0.0 else 0.0,
            "cost": meta.cost,
            "completion": meta.seq_len / meta.max_len if meta.max_len > 0 else 0.0,
        }

    preemption_order = "slo"  # its default sequence order (preemption.ORDERS)
