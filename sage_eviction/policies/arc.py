"""Adaptive Replacement Cache: two LRU lists, two ghost lists and a self-tuning target.

Source: Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003.

ARC(c) keeps T1 (blocks seen once recently) and T2 (blocks seen at least twice), each an LRU
list, plus the ghost lists B1 and B2 holding the keys (not the data) of blocks recently evicted
from T1 and T2. A miss on a key in B1 means T1 was too small, so the target size `p` of T1
grows; a miss on a key in B2 shrinks it (p is real-valued, as in the paper). REPLACE evicts
from T1 when |T1| > p (or |T1| = p and the incoming key was in B2), else from T2. The
directory is kept within |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c (case IV).

How the paper's request loop maps onto this interface (the cache, not the policy, decides
when to evict):

- `access(key)`: case I, the key moves to the MRU end of T2.
- `evict(n)`: n times REPLACE. Without a pending ghost hit each eviction first trims the
  ghost lists as case IV does (drop the LRU of B1 when |T1| + |B1| >= c, or the LRU of B2 when
  the directory holds 2c keys), and when T1 alone holds c blocks its LRU block is dropped
  without becoming a ghost. The victim goes to the MRU end of B1 or B2.
- `insert(key)`: a key found in B1 or B2 is a ghost hit (cases II and III): p grows by
  max(|B2| / |B1|, 1) up to c, or shrinks by max(|B1| / |B2|, 1) down to 0 (real division, as
  in the paper and in libCacheSim), and the key enters T2. Any other key enters T1; the ghost
  lists are trimmed so the directory bounds hold even when the cache inserts without evicting.
- `prepare_insert(key)`: optional. A cache that knows which missed key it is about to insert
  calls it before the evictions that make room for it, so that p adapts and the REPLACE
  tie-break (|T1| = p and the key in B2) sees the key, exactly as in the paper. The flat
  driver (`sage_eviction.flat`) does so and reproduces libCacheSim's ARC miss for miss.

Entries that are not evictable (blocks in use in the radix cache) keep their place in the
accounting: they count in |T1| or |T2|, a hit on one moves it to T2, but they are unlinked
from the LRU lists, so REPLACE never sees them. When one becomes evictable again it is linked
at the MRU end of its list (it was in use until now). REPLACE takes the LRU evictable entry of
the list the rule names; when that list has no evictable entry it takes the other list's.

`evict(n)` works when the policy holds fewer than c entries (the pool can run short while the
policy is not full): REPLACE runs on whatever is evictable with the same rule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from itertools import compress, repeat
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import DuplicateKeyError
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["ARCPolicy"]

_NO_KEY: Any = object()  # "no pending key" (None is a valid key)


class ARCPolicy(EvictionPolicy):
    """ARC over blocks: T1/T2 resident lists, B1/B2 ghost lists, adaptive target `p` for |T1|.

    Args:
        capacity: The cache size c in blocks (required): it bounds p and the ghost lists.
    """

    name = "arc"
    strategy = EvictionStrategy.ARC
    paper = "Megiddo and Modha, ARC: A Self-Tuning, Low Overhead Replacement Cache, FAST 2003"
    order_preserving = True
    needs_capacity = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        if capacity is None:  # the base already raised; this narrows the type
            raise ValueError("arc needs capacity")
        self._c = capacity
        self._p = 0.0
        # Evictable resident keys, LRU first. Pinned keys are in _list_of only.
        self._t1: OrderedDict[Hashable, None] = OrderedDict()
        self._t2: OrderedDict[Hashable, None] = OrderedDict()
        self._b1: OrderedDict[Hashable, None] = OrderedDict()
        self._b2: OrderedDict[Hashable, None] = OrderedDict()
        self._list_of: dict[Hashable, int] = {}  # resident key -> 1 (T1) or 2 (T2)
        self._n1 = 0  # |T1|, pinned included
        self._n2 = 0  # |T2|, pinned included
        self._pending_key: Any = _NO_KEY
        self._pending_ghost = 0  # 1 or 2: the pending key was in B1 or B2; 0: not a ghost
        self._pending_replace = False  # the next REPLACE is the pending ghost hit's

    # ---- introspection -----------------------------------------------------------------------

    @property
    def p(self) -> float:
        """The current target size of T1, in blocks (0 <= p <= c; real-valued)."""
        return self._p

    def list_sizes(self) -> tuple[int, int, int, int]:
        """(|T1|, |T2|, |B1|, |B2|); T1 and T2 count pinned entries too."""
        return self._n1, self._n2, len(self._b1), len(self._b2)

    def list_of(self, key: Hashable) -> str | None:
        """Where `key` is: "T1", "T2", "B1", "B2", or None when ARC does not know it."""
        where = self._list_of.get(key)
        if where is not None:
            return "T1" if where == 1 else "T2"
        if key in self._b1:
            return "B1"
        if key in self._b2:
            return "B2"
        return None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(p=self._p, t1=self._n1, t2=self._n2, b1=len(self._b1), b2=len(self._b2))
        return out

    explains_by = "its list (T1 seen once, T2 seen again), LRU within it, and the target p of T1"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        n1, p = self._n1, self._p
        if self._pending_replace:  # a ghost hit's REPLACE: the B2 tie-break applies
            tie = self._pending_ghost == 2 and n1 == p
            from_t1 = bool(self._t1) and (n1 > p or tie or not self._t2)
        else:  # case IV first (T1 alone full), then REPLACE
            from_t1 = bool(self._t1) and (n1 > p or n1 >= self._c or not self._t2)
        return {
            "list": self.list_of(key),
            "p": self._p,
            "t1": n1,
            "t2": self._n2,
            "b1": len(self._b1),
            "b2": len(self._b2),
            "replace_from": "T1" if from_t1 else "T2",
        }

    # ---- the paper's cases II and III ------------------------------------------------------

    def _adapt(self, ghost: int) -> None:
        b1, b2 = len(self._b1), len(self._b2)
        if ghost == 1:
            self._p = min(self._p + max(b2 / b1, 1.0), float(self._c))
        else:
            self._p = max(self._p - max(b1 / b2, 1.0), 0.0)

    def prepare_insert(self, key: Hashable) -> None:
        """A miss on `key` will be inserted after the evictions that make room for it.

        Optional. On a ghost hit it adapts p now and makes the next eviction the paper's
        REPLACE(key, p) (no ghost trimming, the B2 tie-break applied); `insert(key)` then
        completes the hit. Without it, `insert` adapts p itself, after the eviction.

        Raises:
            DuplicateKeyError: The key is already held.
        """
        if key in self._list_of:
            raise DuplicateKeyError(f"{self.name}: prepare_insert of key {key!r}, which is held")
        self._pending_key = key
        if key in self._b1:
            self._adapt(1)
            del self._b1[key]
            self._pending_ghost = 1
        elif key in self._b2:
            self._adapt(2)
            del self._b2[key]
            self._pending_ghost = 2
        else:
            self._pending_ghost = 0
        self._pending_replace = self._pending_ghost != 0

    # ---- hooks -------------------------------------------------------------------------------

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        pending = self._pending_key
        if pending is not _NO_KEY:  # any insert ends what prepare_insert started
            self._pending_key = _NO_KEY
            self._pending_replace = False
        if pending is not _NO_KEY and pending == key:
            ghost = self._pending_ghost
        elif key in self._b1:
            self._adapt(1)
            del self._b1[key]
            ghost = 1
        elif key in self._b2:
            self._adapt(2)
            del self._b2[key]
            ghost = 2
        else:
            ghost = 0
        if ghost:
            self._list_of[key] = 2
            self._n2 += 1
            if evictable:
                self._t2[key] = None
            return
        # A new key enters L1 = T1 + B1: keep |L1| <= c and the directory <= 2c.
        c = self._c
        if self._n1 + len(self._b1) >= c and self._b1:
            self._b1.popitem(last=False)
        elif self._n1 + self._n2 + len(self._b1) + len(self._b2) >= 2 * c and self._b2:
            self._b2.popitem(last=False)
        self._list_of[key] = 1
        self._n1 += 1
        if evictable:
            self._t1[key] = None

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # Into an empty ARC with empty ghost lists every insert is a new key: it enters T1
        # (linked at T1's MRU end when evictable) and no ghost list is trimmed.
        fresh = not (self._meta or self._b1 or self._b2) and self._pending_key is _NO_KEY
        if not fresh or not self._inserts_like(ARCPolicy):
            return False
        self._add_columns(keys, metas, flags)
        self._list_of.update(zip(keys, repeat(1)))
        self._n1 += len(keys)
        self._t1.update(zip(compress(keys, flags), repeat(None)))
        return True

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        if self._list_of[key] == 1:
            self._list_of[key] = 2
            self._n1 -= 1
            self._n2 += 1
            if key in self._t1:
                del self._t1[key]
                self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        lru = self._t1 if self._list_of[key] == 1 else self._t2
        if evictable:
            lru[key] = None  # MRU end: it was in use until now
        else:
            del lru[key]

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        if self._list_of.pop(key) == 1:
            self._n1 -= 1
            if was_evictable:
                del self._t1[key]
        else:
            self._n2 -= 1
            if was_evictable:
                del self._t2[key]

    def _replace(self, in_b2: bool) -> Hashable:
        """The paper's REPLACE: demote the LRU evictable entry of T1 or T2 to its ghost list."""
        t1, n1 = self._t1, self._n1
        if t1 and (n1 > self._p or (in_b2 and n1 == self._p) or not self._t2):
            key, _ = t1.popitem(last=False)
            self._n1 = n1 - 1
            self._b1[key] = None
        else:
            key, _ = self._t2.popitem(last=False)
            self._n2 -= 1
            self._b2[key] = None
        del self._list_of[key]
        return key

    def _pop_victim(self) -> Hashable:
        if self._pending_replace:  # cases II and III: the ghost hit's REPLACE
            self._pending_replace = False
            return self._replace(self._pending_ghost == 2)
        c = self._c
        n1, b1 = self._n1, self._b1
        if n1 + len(b1) >= c:  # case IV.A: L1 holds c keys
            if n1 >= c and self._t1:
                # T1 alone is full: its LRU block leaves without a ghost.
                key, _ = self._t1.popitem(last=False)
                self._n1 = n1 - 1
                del self._list_of[key]
                return key
            if b1:
                b1.popitem(last=False)
        elif n1 + self._n2 + len(b1) + len(self._b2) >= 2 * c and self._b2:  # case IV.B
            self._b2.popitem(last=False)
        return self._replace(False)

    def _eviction_order(self) -> list[Hashable]:
        t1, t2 = list(self._t1), list(self._t2)
        n1, p, c = self._n1, self._p, self._c
        i = j = 0
        order: list[Hashable] = []
        while i < len(t1) or j < len(t2):
            if i < len(t1) and (n1 > p or n1 >= c or j == len(t2)):
                order.append(t1[i])
                i += 1
                n1 -= 1
            else:
                order.append(t2[j])
                j += 1
        return order

    # ---- the module spec's interface ------------------------------------------------------

    # Sequences seen once (ARC's T1) before sequences seen again (T2), LRU within each.
    # A running sequence has no ghost history, so p cannot be applied: T1 goes first.
    preemption_order = "seen_once_first"  # its default sequence order (preemption.ORDERS)
