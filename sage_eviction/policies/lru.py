"""Least Recently Used: evict the block whose latest insert or hit is oldest.

Source: the classic policy (Denning, "The Working Set Model for Program Behavior", CACM 1968);
vLLM's block-level prefix cache and SGLang's default radix-cache eviction use it.
"""

from __future__ import annotations

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionStrategy

__all__ = ["LRUPolicy"]


class LRUPolicy(RecencyPolicy):
    """Evicts the evictable entry with the oldest insert or hit (logical clock, so no ties)."""

    name = "lru"
    strategy = EvictionStrategy.LRU
    paper = "Denning, The Working Set Model for Program Behavior, CACM 1968"

    explains_by = "the logical time of its latest insert or hit, oldest first"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
