"""First In, First Out: evict the block inserted longest ago; hits do not reorder.

Source: the classic policy (Belady, "A Study of Replacement Algorithms for a Virtual-Storage
Computer", IBM Systems Journal 1966); SGLang's `FIFOStrategy`, priority
`creation_time`; libCacheSim's `FIFO`.
"""

from __future__ import annotations

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionStrategy

__all__ = ["FIFOPolicy"]


class FIFOPolicy(RecencyPolicy):
    """Evicts the evictable entry with the oldest insert (logical clock, so no ties).

    `_tick[key]` holds the insert tick only: a hit changes nothing, and an entry that becomes
    evictable again goes back to its insert position.
    """

    name = "fifo"
    strategy = EvictionStrategy.FIFO
    paper = (
        "Belady, A Study of Replacement Algorithms for a Virtual-Storage Computer, IBM Systems Journal 1966"
    )
    touch_on_access = False

    explains_by = "the logical time of its insert, oldest first"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    preemption_order = "fifo"  # its default sequence order (preemption.ORDERS)
