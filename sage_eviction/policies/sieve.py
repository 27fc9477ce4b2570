"""SIEVE: a FIFO queue, one visited bit per entry, and a hand that sweeps from the tail.

Source: Zhang, Yang, Yue, Vigfusson and Rashmi, "SIEVE is Simpler than LRU: an Efficient
Turn-Key Eviction Algorithm for Web Caches", NSDI 2024.

New entries enter at the head with the visited bit clear; a hit sets the bit and moves
nothing. To evict, the hand starts where it stopped last time (at the tail the first time, or
after it ran off the head), clears the bit of each visited entry it passes while moving toward
the head (wrapping to the tail), and evicts the first unvisited entry; it then rests on that
entry's newer neighbour. Hits therefore cost no list operation, and survivors keep their
place, so new entries are filtered quickly (lazy promotion, quick demotion).

Entries that are not evictable are unlinked from the queue (the hand skips nothing and stays
O(1) amortised); a hit on one still sets its bit. When one becomes evictable again it is
linked at the head, keeping its bit, as if newly admitted (it was in use until now). If the
hand rested on an entry that is unlinked or removed, it moves to that entry's newer neighbour.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from itertools import compress, repeat

from sage_eviction.base import EvictionPolicy
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["SIEVEPolicy"]


class _Node:
    """One entry of the queue; `newer` points toward the head, `older` toward the tail."""

    __slots__ = ("key", "newer", "older", "visited")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.visited = False
        self.newer: _Node | None = None
        self.older: _Node | None = None


class SIEVEPolicy(EvictionPolicy):
    """SIEVE over blocks; needs no capacity."""

    name = "sieve"
    strategy = EvictionStrategy.SIEVE
    paper = "Zhang et al., SIEVE is Simpler than LRU, NSDI 2024"
    order_preserving = True
    needs_capacity = False

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self._nodes: dict[Hashable, _Node] = {}
        self._head: _Node | None = None  # newest linked entry
        self._tail: _Node | None = None  # oldest linked entry
        self._hand: _Node | None = None  # None: start at the tail

    # ---- introspection -----------------------------------------------------------------------

    def visited(self, key: Hashable) -> bool:
        """The visited bit of a held key."""
        return self._nodes[key].visited

    @property
    def hand(self) -> Hashable | None:
        """The key the hand rests on; None when the next sweep starts at the tail."""
        return None if self._hand is None else self._hand.key

    def queue(self) -> list[Hashable]:
        """The evictable keys from tail (oldest) to head (newest)."""
        keys = []
        node = self._tail
        while node is not None:
            keys.append(node.key)
            node = node.newer
        return keys

    explains_by = "its visited bit and its place from the hand toward the newest"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {"visited": self._nodes[key].visited, "hand": self.hand}

    # ---- the linked list ---------------------------------------------------------------------

    def _link_head(self, node: _Node) -> None:
        head = self._head
        node.newer = None
        node.older = head
        if head is None:
            self._tail = node
        else:
            head.newer = node
        self._head = node

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer
        newer, older = node.newer, node.older
        if newer is None:
            self._head = older
        else:
            newer.older = older
        if older is None:
            self._tail = newer
        else:
            older.newer = newer
        node.newer = node.older = None

    # ---- hooks -------------------------------------------------------------------------------

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        node = _Node(key)
        self._nodes[key] = node
        if evictable:
            self._link_head(node)

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # What the one-by-one inserts build: a node per key (bit clear), the evictable ones
        # linked in entry order, each the new head; the hand at rest (None).
        if self._meta or not self._inserts_like(SIEVEPolicy):
            return False
        self._add_columns(keys, metas, flags)
        nodes = list(map(_Node, keys))
        self._nodes.update(zip(keys, nodes, strict=True))
        linked = list(compress(nodes, flags))
        if linked:
            newer = linked[1:]
            deque(map(setattr, newer, repeat("older"), linked), maxlen=0)
            deque(map(setattr, linked, repeat("newer"), newer), maxlen=0)
            self._tail = linked[0]
            self._head = linked[-1]
        return True

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        self._nodes[key].visited = True

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        node = self._nodes[key]
        if evictable:
            self._link_head(node)
        else:
            self._unlink(node)

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        node = self._nodes.pop(key)
        if was_evictable:
            self._unlink(node)

    def _pop_victim(self) -> Hashable:
        node = self._hand or self._tail
        assert node is not None  # the base calls this only with an evictable entry
        while node.visited:
            node.visited = False
            node = node.newer or self._tail
            assert node is not None
        self._hand = node.newer
        self._unlink(node)
        del self._nodes[node.key]
        return node.key

    def _eviction_order(self) -> list[Hashable]:
        """Replays the hand on a copy of the queue and the bits."""
        queue = self.queue()  # tail first
        if not queue:
            return []
        visited = [self._nodes[k].visited for k in queue]
        alive = [True] * len(queue)
        hand = queue.index(self._hand.key) if self._hand is not None else 0
        order: list[Hashable] = []
        n = len(queue)
        while len(order) < n:
            if not alive[hand]:
                hand = (hand + 1) % n
                continue
            if visited[hand]:
                visited[hand] = False
                hand = (hand + 1) % n
                continue
            alive[hand] = False
            order.append(queue[hand])
            hand = (hand + 1) % n
        return order

    # ---- the module spec's interface ------------------------------------------------------

    # Unvisited sequences (seen once) before visited ones, oldest first within each.
    preemption_order = "seen_once_first"  # its default sequence order (preemption.ORDERS)
