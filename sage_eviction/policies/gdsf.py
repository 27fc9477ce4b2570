"""GreedyDual-Size-Frequency: evict the block of least frequency * cost / size, with aging.

Source: Cherkasova, "Improving WWW Proxies Performance with Greedy-Dual-Size-Frequency
Caching Policy", HP Labs technical report HPL-98-69R1, 1998; GreedyDual-Size of Cao and
Irani, USENIX Symposium on Internet Technologies and Systems 1997.

Each entry has a key H = L + frequency * cost / size, with frequency = hits + 1,
`cost = meta.cost` and `size = meta.size` (tokens). The entry of smallest H is evicted and the
clock L rises to the victim's H, so entries not referenced for a long time age out. H is set
when the entry is inserted, hit or made evictable again (a block in use was being referenced),
with the L of that moment. Ties go to the least recent.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sage_eviction.heap import FlatHeapPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["GDSFPolicy"]


class GDSFPolicy(FlatHeapPolicy):
    """Evicts the evictable entry of smallest H = L + (hits + 1) * cost / size; L inflates to
    each victim's H.

    Not order-preserving: `from_entries` starts a new L at 0 and recomputes every H from the
    meta, which drops the aging the old policy had applied.
    """

    name = "gdsf"
    strategy = EvictionStrategy.GDSF
    paper = (
        "Cherkasova, Improving WWW Proxies Performance with Greedy-Dual-Size-Frequency "
        "Caching Policy, HP Labs HPL-98-69R1, 1998"
    )
    order_preserving = False

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self.inflation = 0.0  # L

    def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
        return (self.inflation + (meta.hits + 1) * meta.cost / max(meta.size, 1), self._tick[key])

    def _compiled_scoring(self) -> tuple[str, tuple[float, ...]] | None:
        return ("gdsf", (self.inflation,)) if type(self.inflation) is float else None

    def _on_victim(self, key: Hashable, item: tuple[Any, ...]) -> None:
        self.inflation = item[0]

    explains_by = "H = L + (hits + 1) * cost / size, then the time of its latest insert or hit"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        rank = self.rank(key)
        assert rank is not None
        values: dict[str, object] = {"H": rank[0], "L": self.inflation, "cost": meta.cost}
        values.update(size=meta.size, frequency=meta.hits + 1)
        return values

    preemption_order = "gdsf"  # its default sequence order (preemption.ORDERS)
