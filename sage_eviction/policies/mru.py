"""Most Recently Used: evict the block whose latest insert or hit is newest.

Source: Chou and DeWitt, "An Evaluation of Buffer Management Strategies for Relational Database
Systems", VLDB 1985 (MRU for looping sequential scans); SGLang's `MRUStrategy`
(`python/sglang/srt/mem_cache/evict_policy.py`), priority `-last_access_time`.
"""

from __future__ import annotations

from sage_eviction.recency import RecencyPolicy
from sage_eviction.types import EvictionStrategy

__all__ = ["MRUPolicy"]


class MRUPolicy(RecencyPolicy):
    """Evicts the evictable entry with the newest insert or hit (logical clock, so no ties).

    An entry that becomes evictable again keeps the recency of its latest insert or hit.
    Not order-preserving: `from_entries` replays the entries as inserts in the order given,
    so the newest entry of the old policy comes back as the oldest.
    """

    name = "mru"
    strategy = EvictionStrategy.MRU
    paper = (
        "Chou and DeWitt, An Evaluation of Buffer Management Strategies for Relational "
        "Database Systems, VLDB 1985"
    )
    order_preserving = False
    newest_first = True

    explains_by = "the logical time of its latest insert or hit, newest first"

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)

    preemption_order = "mru"  # its default sequence order (preemption.ORDERS)
