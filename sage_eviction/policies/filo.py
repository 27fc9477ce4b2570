"""First In, Last Out: evict the block inserted most recently; hits do not reorder.

Source: SGLang's `FILOStrategy` (`python/sglang/srt/mem_cache/evict_policy.py`, spec/003),
priority `-creation_time`; the stack discipline that protects long-lived (old) entries.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sage_eviction.base import HeapPolicy, Score
from sage_eviction.types import EntryMeta, EvictionCandidate, EvictionStrategy

__all__ = ["FILOPolicy"]


class FILOPolicy(HeapPolicy):
    """Evicts the evictable entry with the newest insert (logical clock, so no ties).

    `_tick[key]` holds the insert tick only: a hit changes nothing. Not order-preserving:
    `from_entries` replays the entries as inserts in the order given, so the newest entry of
    the old policy comes back as the oldest.
    """

    name = "filo"
    strategy = EvictionStrategy.FILO
    paper = "SGLang FILOStrategy, python/sglang/srt/mem_cache/evict_policy.py (LMSYS, 2024)"
    order_preserving = False
    rescore_on_access = False

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        # Keep the insert tick: the order is by insert alone.
        pass

    def _score(self, key: Hashable, meta: EntryMeta) -> Score:
        return -self._tick[key]

    @staticmethod
    def candidate_key(candidate: EvictionCandidate) -> Any:
        """The newest sequence first; sequence ids are given out in arrival order, and a
        candidate carries no creation time."""
        return -candidate.sequence_id
