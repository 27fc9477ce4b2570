"""First In, First Out: evict the block inserted longest ago; hits do not reorder.

Source: the classic policy (Belady, "A Study of Replacement Algorithms for a Virtual-Storage
Computer", IBM Systems Journal 1966); SGLang's `FIFOStrategy`, priority
`creation_time`; libCacheSim's `FIFO`.
"""

from __future__ import annotations

from typing import Any

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionCandidate, EvictionStrategy

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

    candidate_order = ("fifo", ())  # candidate_key in the compiled core

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """The oldest sequence first; sequence ids are given out in arrival order, and a
        candidate carries no creation time."""
        return candidate.sequence_id

    @staticmethod
    def candidates_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
        """The candidates whose `candidate_key` is <= `bound`, in list order."""
        return [c for c in candidates if c.sequence_id <= bound]
