"""Segmented LRU: a probationary segment for new blocks, a protected one for blocks hit enough.

Source: Karedla, Love and Wherry, "Caching Strategies to Improve Disk System Performance",
IEEE Computer 27(3), 1994. The promotion threshold is SGLang's (`protected_threshold`, the
hits a block needs before it is protected).

- Insert: the block enters the MRU end of the probationary segment.
- Hit: a probationary block whose hits since insert reach `protected_threshold` moves to the
  MRU end of the protected segment; any other block moves to the MRU end of its segment.
  (`protected_threshold=1` is the paper's SLRU: one hit promotes.)
- Protected size: with a capacity, the protected segment holds at most
  `int(capacity * protected_ratio)` blocks; when a promotion overflows it, its LRU blocks are
  demoted to the MRU end of the probationary segment (the paper's second chance). A demoted
  block keeps its hit count, so its next hit promotes it again. Without a capacity the
  protected segment is unbounded (SGLang's `(is_protected, last_access)` order).
- Evict: the LRU block of the probationary segment; the LRU protected block when the
  probationary segment has none.

Entries that are not evictable keep their segment and count in its size (hits on them
promote as usual) but are unlinked from the LRU lists; when one becomes evictable again it is
linked at the MRU end of its segment. Demotion takes the LRU evictable protected block, so
while pinned protected blocks fill the protected segment, promoted blocks fall straight back
to the probationary MRU end.

libCacheSim's "SLRU" is S4LRU (four segments), so it is not an oracle for this policy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from itertools import compress, repeat

from sage_eviction.base import EvictionPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["SLRUPolicy"]

_PROBATION = 0
_PROTECTED = 1


class SLRUPolicy(EvictionPolicy):
    """Segmented LRU.

    Args:
        capacity: Cache size in blocks; optional, it bounds the protected segment.
        protected_threshold: Hits since insert a probationary block needs to be promoted (>= 1).
        protected_ratio: Protected segment size as a fraction of `capacity` (0..1); unused
            without a capacity.
    """

    name = "slru"
    strategy = EvictionStrategy.SLRU
    paper = (
        "Karedla, Love and Wherry, Caching Strategies to Improve Disk System Performance, IEEE Computer 1994"
    )
    order_preserving = True
    needs_capacity = False

    def __init__(
        self, capacity: int | None = None, protected_threshold: int = 2, protected_ratio: float = 0.8
    ) -> None:
        super().__init__(capacity)
        if protected_threshold < 1:
            raise ValueError(f"protected_threshold={protected_threshold} must be >= 1")
        if not 0.0 <= protected_ratio <= 1.0:
            raise ValueError(f"protected_ratio={protected_ratio} must be in [0, 1]")
        self.protected_threshold = protected_threshold
        self.protected_ratio = protected_ratio
        self._protected_cap: int | None = None if capacity is None else int(capacity * protected_ratio)
        self._probation: OrderedDict[Hashable, None] = OrderedDict()  # evictable, LRU first
        self._protected: OrderedDict[Hashable, None] = OrderedDict()
        self._segment: dict[Hashable, int] = {}
        self._n_protected = 0  # pinned included

    # ---- introspection -----------------------------------------------------------------------

    def segment_of(self, key: Hashable) -> str:
        """The segment of a held key: "probationary" or "protected"."""
        return "protected" if self._segment[key] == _PROTECTED else "probationary"

    @property
    def protected_capacity(self) -> int | None:
        """The most blocks the protected segment holds; None when unbounded."""
        return self._protected_cap

    explains_by = "its segment (probationary before protected), LRU within it"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {
            "segment": self.segment_of(key),
            "protected_threshold": self.protected_threshold,
            "protected": self._n_protected,
            "protected_capacity": self._protected_cap,
        }

    # ---- hooks -------------------------------------------------------------------------------

    def _balance(self) -> None:
        """Demote the LRU evictable protected blocks while the segment is over its size."""
        cap = self._protected_cap
        if cap is None:
            return
        protected = self._protected
        while self._n_protected > cap and protected:
            key, _ = protected.popitem(last=False)
            self._segment[key] = _PROBATION
            self._n_protected -= 1
            self._probation[key] = None

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        self._segment[key] = _PROBATION
        if evictable:
            self._probation[key] = None

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # Every insert enters the probationary segment, linked at its MRU end when evictable.
        if self._meta or not self._inserts_like(SLRUPolicy):
            return False
        self._add_columns(keys, metas, flags)
        self._segment.update(zip(keys, repeat(_PROBATION)))
        self._probation.update(zip(compress(keys, flags), repeat(None)))
        return True

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        if self._segment[key] == _PROTECTED:
            if key in self._protected:
                self._protected.move_to_end(key)
            return
        if meta.hits >= self.protected_threshold:
            self._segment[key] = _PROTECTED
            self._n_protected += 1
            if key in self._probation:
                del self._probation[key]
                self._protected[key] = None
            self._balance()
        elif key in self._probation:
            self._probation.move_to_end(key)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        if self._segment[key] == _PROTECTED:
            if evictable:
                self._protected[key] = None
                self._balance()
            else:
                del self._protected[key]
        elif evictable:
            self._probation[key] = None
        else:
            del self._probation[key]

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        if self._segment.pop(key) == _PROTECTED:
            self._n_protected -= 1
            if was_evictable:
                del self._protected[key]
        elif was_evictable:
            del self._probation[key]

    def _pop_victim(self) -> Hashable:
        if self._probation:
            key, _ = self._probation.popitem(last=False)
        else:
            key, _ = self._protected.popitem(last=False)
            self._n_protected -= 1
        del self._segment[key]
        return key

    def _eviction_order(self) -> list[Hashable]:
        return [*self._probation, *self._protected]

    # ---- the module spec's interface ------------------------------------------------------

    # Probationary sequences (fewer than 2 accesses, the default threshold) before
    # protected ones, LRU within each.
    preemption_order = "seen_once_first"  # its default sequence order (preemption.ORDERS)
