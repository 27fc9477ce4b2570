"""Priority (QoS-aware): evict the block of lowest priority, the least recent within a priority.

Source: the module spec's `QoSAwareEvictionPolicy` (sort key `(priority,
last_access_time)`); SGLang's `PriorityStrategy`; SGLang's priority scheduling
and preemption (the SGLang radix-cache tutorial).
"""

from __future__ import annotations

from typing import Any

from sage_eviction.recency import LevelledRecencyPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["PriorityPolicy"]


class PriorityPolicy(LevelledRecencyPolicy):
    """Evicts the evictable entry of lowest `meta.priority`; LRU within a priority.

    The priority is read when the entry is inserted, hit or made evictable; a change to
    `meta.priority` in between takes effect at the next of these.
    """

    name = "priority"
    strategy = EvictionStrategy.PRIORITY
    paper = (
        "SGLang PriorityStrategy, python/sglang/srt/mem_cache/evict_policy.py; "
        "module spec QoSAwareEvictionPolicy"
    )

    level_attr = "priority"

    explains_by = "priority, then the time of its latest insert or hit"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    def _level(self, meta: EntryMeta) -> Any:
        return meta.priority

    preemption_order = "priority"  # its default sequence order (preemption.ORDERS)
