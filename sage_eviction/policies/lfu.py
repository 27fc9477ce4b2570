"""Least Frequently Used: evict the block with the fewest hits, the least recent among equals.

Source: the classic policy (Aho, Denning and Ullman, "Principles of Optimal Page
Replacement", JACM 1971); the O(1) frequency-list form of Shah, Mitra and Matani, "An O(1)
algorithm for implementing the LFU cache eviction scheme", 2010, as in libCacheSim's
`LFU.c`; SGLang's `LFUStrategy`, priority `(hit_count, last_access_time)`.

Ties: libCacheSim keeps one list per frequency, appends an object to the tail of its new
frequency's list on insert and on every hit, and evicts the head of the lowest frequency's
list, i.e. the entry whose latest insert or hit is oldest. The score `(hits, tick)` gives the
same order, so a flat cache reproduces libCacheSim's LFU exactly (tests check this).
"""

from __future__ import annotations

from typing import Any

from sage_eviction.recency import LevelledRecencyPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["LFUPolicy"]


class LFUPolicy(LevelledRecencyPolicy):
    """Evicts the evictable entry with the fewest hits since insert; ties by LRU.

    The count restarts at 0 when an evicted key is inserted again (no history is kept), as in
    libCacheSim.
    """

    name = "lfu"
    strategy = EvictionStrategy.LFU
    paper = "Aho, Denning and Ullman, Principles of Optimal Page Replacement, JACM 1971"

    level_attr = "hits"

    explains_by = "hits since insert, then the time of its latest insert or hit"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    def _level(self, meta: EntryMeta) -> Any:
        return meta.hits

    preemption_order = "lfu"  # its default sequence order (preemption.ORDERS)
