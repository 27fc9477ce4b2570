"""A sage policy choosing `SGLangRadixTree`'s victims, as it chooses them inside SGLang.

sage runs inside SGLang through `sage_eviction.integrations.sglang` (``--radix-eviction-policy
sage-<name>``): a component that turns the tree's events into `PolicyBridge` calls keyed by node
id and picks each device victim among the evictable leaves. `SageVictims` makes the same calls at
the same points of the model's tree, so the model predicts what SGLang does with the policy
plugged in (tests_integration/sglang/test_twin.py drives SGLang with sage's component beside it):

- a node gets KV: a new leaf of an insert, and the nodes above it not yet tracked -> ``insert``
  (not evictable yet), in that order, leaf first; a split's new parent -> ``insert`` at the split;
- a prefix match (also SGLang's refresh of waiting prefixes, the same tree walk) -> ``access`` of
  every node from the root's child down to the matched node;
- an eviction walk: first every tracked node's evictable flag is set to "is an evictable leaf"
  (in the order the nodes were tracked), then the policy's victims are taken one at a time; a
  victim's parent left an evictable leaf is flagged evictable before the next one.

Entry metadata (size, cost: the node's tokens; created and last access: the model's clock) is what
the integration passes; the integration reads the wall clock, so a policy that orders by those
times (rather than by the order of its events) is predicted only up to ties of that clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sized
from typing import Generic, Protocol, TypeVar

from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.types import EntryMeta

_Self = TypeVar("_Self", bound="TreeNode")


class TreeNode(Protocol):
    """What `SageVictims` reads of a tree node (`sglang_radix.N`)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> Sized: ...
    @property
    def parent(self: _Self) -> _Self | None: ...


N = TypeVar("N", bound=TreeNode)

__all__ = ["SAGE_PREFIX", "SageVictims", "TreeNode"]

SAGE_PREFIX = "sage-"
"""SGLang's name for a sage policy (``--radix-eviction-policy sage-s3fifo``); the model's too."""


class SageVictims(Generic[N]):
    """The sage policy `spec` (``"s3fifo:small_ratio=0.2"``) behind a tree's victims.

    Args:
        spec: A sage policy spec (without the ``sage-`` prefix).
        clock: The tree's clock (read, never advanced).
        capacity: For the policies that need one when the spec gives none (the pool's pages;
            in SGLang the spec must give it: ``sage-s3fifo:capacity=N``).

    Raises:
        PolicyConfigError: An unknown policy or parameter, or an offline one (Belady).
    """

    def __init__(self, spec: str, clock: Callable[[], float], capacity: int | None = None) -> None:
        self.bridge = PolicyBridge(spec, capacity, engine="sglang model", log_path="", clock=clock)
        self._clock = clock
        self._nodes: dict[Hashable, N] = {}  # tracked, in the order they were tracked

    def track(self, node: N) -> None:
        """`node` holds KV now (a split's new parent, or one step of `track_up`)."""
        if node.id not in self._nodes:
            now = self._clock()
            size = len(node.key)
            self.bridge.insert(
                node.id, EntryMeta(size=size, cost=float(size), created_at=now, last_access=now)
            )
            self._nodes[node.id] = node

    def track_up(self, leaf: N) -> None:
        """A new leaf got its KV: it and the untracked nodes above it, leaf first."""
        walk: N | None = leaf
        while walk is not None and walk.parent is not None and walk.id not in self._nodes:
            self.track(walk)
            walk = walk.parent

    def matched(self, node: N) -> None:
        """A match ended at `node`: every node of its path is accessed, the root's child first."""
        path: list[int] = []
        walk: N | None = node
        while walk is not None and walk.parent is not None:
            path.append(walk.id)
            walk = walk.parent
        for node_id in reversed(path):
            self.bridge.access(node_id)

    def start(self, leaves: Mapping[N, None]) -> None:
        """An eviction walk begins: the flags follow the tree's evictable leaves."""
        for node_id, node in self._nodes.items():
            self.bridge.set_evictable(node_id, node in leaves)

    def next_victim(self, leaves: Mapping[N, None], last: N | None) -> N | None:
        """The policy's next victim among `leaves` (None: none left); `last`, the previous
        victim, may have left its parent an evictable leaf."""
        if last is not None and last.parent is not None and last.parent in leaves:
            self.bridge.set_evictable(last.parent.id, True)
        while True:
            victims = self.bridge.evict(1)
            if not victims:
                return None
            node = self._nodes.pop(victims[0], None)
            if node is not None and node in leaves:
                return node
