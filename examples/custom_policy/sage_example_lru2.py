"""LRU-2 as a sage eviction policy plugin: evict the block whose second-latest use is oldest.

Source: O'Neil, O'Neil and Weikum, "The LRU-K Page Replacement Algorithm for Database Disk
Buffering", SIGMOD 1993 (K = 2). A block used once has no second-latest use and goes before any
block used twice (among those, the least recently used first): one scan of cold blocks cannot
push out the blocks that were asked for again, which plain LRU lets it do.

Built as sage's own score policies are (docs/howto.md, "A block eviction policy"): a
`FlatHeapPolicy` whose score is a tuple ending with the entry's latest tick, so the base keeps
the heap, the argument checks, the metrics, the hot-swap handover and `select_victims`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sage_eviction import EntryMeta, FlatHeapPolicy
from sage_eviction.types import EvictionStrategy

__all__ = ["LRU2Policy"]

NEVER = -1  # the "second-latest use" of a block used once: before every real tick


class LRU2Policy(FlatHeapPolicy):
    """Evicts the evictable block of oldest second-latest use (once-used blocks first, by
    their latest use)."""

    name = "lru2"
    strategy = EvictionStrategy.CUSTOM
    paper = "O'Neil, O'Neil and Weikum, The LRU-K Page Replacement Algorithm, SIGMOD 1993"
    explains_by = "the time of its second-latest insert or hit (blocks used once first), then its latest"
    order_preserving = False  # a hot swap into it starts every block as used once
    rescore_on_access = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._previous: dict[Hashable, int] = {}

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._previous[key] = NEVER
        super()._on_insert(key, meta, evictable)

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._previous[key] = self._tick[key]  # the latest use becomes the second-latest
        super()._on_access(key, meta)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._previous[key]
        super()._on_remove(key, meta, was_evictable)

    def _pop_victim(self) -> Hashable:
        key = super()._pop_victim()
        del self._previous[key]
        return key

    def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
        return (self._previous.get(key, NEVER), self._tick[key])

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        previous = self._previous.get(key, NEVER)
        return {"second_latest": None if previous == NEVER else previous, "latest": self._tick[key]}
