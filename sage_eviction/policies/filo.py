"""First In, Last Out: evict the block inserted most recently; hits do not reorder.

Source: SGLang's `FILOStrategy` (`python/sglang/srt/mem_cache/evict_policy.py`),
priority `-creation_time`; the stack discipline that protects long-lived (old) entries.
"""

from __future__ import annotations

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionStrategy

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

    preemption_order = "filo"  # its default sequence order (preemption.ORDERS)
