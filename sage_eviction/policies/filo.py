"""First In, Last Out: evict the block inserted most recently; hits do not reorder.

Source: SGLang's `FILOStrategy` (`python/sglang/srt/mem_cache/evict_policy.py`),
priority `-creation_time`; the stack discipline that protects long-lived (old) entries.
"""

from __future__ import annotations

from typing import Any

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionCandidate, EvictionStrategy

__all__ = ["FILOPolicy"]


class FILOPolicy(RecencyPolicy):
    """Evicts the evictable entry with the newest insert (logical clock, so no ties).

    `_tick[key]` holds the insert tick only: a hit changes nothing. Not order-preserving:
    `from_entries` replays the entries as inserts in the order given, so the newest entry of
    the old policy comes back as the oldest.
    """

    name = "filo"
    strategy = EvictionStrategy.FILO
    paper = "SGLang FILOStrategy, python/sglang/srt/mem_cache/evict_policy.py (LMSYS, 2024)"
    order_preserving = False
    touch_on_access = False
    newest_first = True

    explains_by = "the logical time of its insert, newest first"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    candidate_order = ("filo", ())  # candidate_key in the compiled core

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """The newest sequence first; sequence ids are given out in arrival order, and a
        candidate carries no creation time."""
        return -candidate.sequence_id

    @staticmethod
    def candidates_up_to(candidates: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
        """The candidates whose `candidate_key` is <= `bound`, in list order."""
        return [c for c in candidates if -c.sequence_id <= bound]
