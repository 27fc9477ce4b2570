"""SGLang's radix cache (sglang 0.5.23: ``UnifiedRadixCache`` with its Python tree core, and
``RadixCache``) as a model.

`SGLangRadixTree` keeps the tree SGLang keeps and decides what SGLang decides, operation by
operation: the same matched lengths, the same node splits, the same victims, the same sizes
(tests_integration/sglang/test_twin.py drives both real classes beside it). What it models:

- Keys are token sequences; with ``page_size > 1`` a key is cut to whole pages before a match or
  an insert, children are told apart by their first page, and a match stops at a page boundary.
- A match that ends inside a node splits it: the new parent takes the matched part, the
  child's lock count, hit count and priority. An insert splits the same way and appends the rest.
- Clock: each node has an access and a creation time, and only their order matters. A new node
  reads the clock twice (access, then creation). SGLang has two trees that read it differently
  (`flavor`): ``unified``, `UnifiedRadixCache` (the one SGLang 0.5.23 serves with; its clock is
  a counter): an insert reads it for the root and again for each node it walks; a match reads
  it once after the walk and stamps the matched path with it, a hair older at each step up; a
  split gives the new parent the child's creation time and the child a new access time.
  ``radix_cache``, `RadixCache` (``time.monotonic``): one reading per match or insert for every
  node on the path; a split's new parent keeps its own readings, the child the operation's.
  The model counts readings rather than reading a clock, so its order is SGLang's whenever
  SGLang's clock strictly increases.
- Hit counts (LFU, SLRU) grow on insert only, on the nodes past the request's `inserted_len`;
  priorities (the ``priority`` policy) are the largest priority inserted through a node.
- Lock references: a request locks its matched node and every ancestor; a locked node is never
  evicted, and only unlocked nodes without children are eviction candidates.
- Eviction takes candidates in the order of the eviction strategy's key (``lru``: access time,
  ``lfu``: (hits, access time), ``fifo``: creation time, ``mru`` and ``filo`` the reverse,
  ``priority``: (priority, access time), ``slru``: (hits >= threshold, access time)) until the
  asked tokens are freed; a parent left without children becomes a candidate at once.
  SGLang breaks equal keys by the node's access time, so does the model.

Not modelled: ``tlru`` (it needs each branch's history length), EAGLE's bigram keys, the
``extra_key``/``cache_salt`` namespaces, KV events and the host tier (HiCache).

`SGLangModel` (sglang_model.py) runs this tree as the simulator's ``sglang`` cache model.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.integrations.sglang import PREFIX as SAGE_PREFIX
from sage_eviction.integrations.sglang import SageTreeEvents

__all__ = ["EVICTION_POLICIES", "FLAVORS", "Match", "RadixNode", "SGLangRadixTree", "eviction_key"]

Key = tuple[Hashable, ...]

EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
"""SGLang's built-in strategies the model orders eviction by (``--radix-eviction-policy``)."""

FLAVORS = ("unified", "radix_cache")
"""SGLang's two trees: `UnifiedRadixCache` (what 0.5.23 serves with) and the older `RadixCache`."""

_ROOT_PRIORITY = -(2**63) + 1  # SGLang's root: -sys.maxsize, below any request's priority


class RadixNode:
    """One node: its key (tokens), lock count, hit count, priority and two clock readings."""

    __slots__ = (
        "children",
        "created",
        "hit_count",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "priority",
    )

    def __init__(
        self,
        key: Key,
        parent: RadixNode | None,
        priority: int,
        last_access: float,
        created: float,
        node_id: int = 0,
    ) -> None:
        self.id = node_id  # SGLang's node ids: what a sage policy inside it is keyed by
        self.children: dict[Hashable, RadixNode] = {}
        self.parent = parent
        self.key = key
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.last_access = last_access
        self.created = created

    def __lt__(self, other: RadixNode) -> bool:
        # SGLang's heap holds (strategy key, node): equal keys fall back to the access time
        return self.last_access < other.last_access

    def path(self) -> Key:
        """The tokens from the root to the end of this node."""
        parts: list[Key] = []
        node: RadixNode | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(token for part in reversed(parts) for token in part)


def eviction_key(policy: str, config: dict[str, Any] | None = None) -> Callable[[RadixNode], Any]:
    """The node's sort key under SGLang's strategy `policy` (smaller: evicted first).

    Raises:
        ValueError: A policy SGLang does not have, ``tlru``, or a config the policy does not take.
    """
    config = dict(config or {})
    name = policy.lower()
    if name.startswith(SAGE_PREFIX):
        raise ValueError(f"{policy!r} is a sage policy: its victims are the policy's, not a sort key's")
    if name == "slru":
        threshold = int(config.pop("protected_threshold", 2))
        if config:
            raise ValueError(f"slru takes protected_threshold only, not {sorted(config)}")
        return lambda n: (1 if n.hit_count >= threshold else 0, n.last_access)
    if config:
        raise ValueError(f"eviction policy {name!r} takes no config, got {sorted(config)}")
    keys: dict[str, Callable[[RadixNode], Any]] = {
        "lru": lambda n: n.last_access,
        "lfu": lambda n: (n.hit_count, n.last_access),
        "fifo": lambda n: n.created,
        "mru": lambda n: -n.last_access,
        "filo": lambda n: -n.created,
        "priority": lambda n: (n.priority, n.last_access),
    }
    if name not in keys:
        raise ValueError(
            f"unknown SGLang eviction policy {policy!r}; the model has: {', '.join(EVICTION_POLICIES)}"
        )
    return keys[name]


@dataclass(frozen=True, slots=True)
class Match:
    """A match: the cached prefix's length in tokens and the node it ends at (lock this one)."""

    length: int
    node: RadixNode


class SGLangRadixTree:
    """SGLang's radix tree over token keys (module docstring).

    Args:
        page_size: Tokens per page (1: token granularity).
        eviction_policy: One of `EVICTION_POLICIES`, or ``sage-<spec>``: a sage policy plugged into
            SGLang (``sage-s3fifo:small_ratio=0.2``; the unified tree only), its victims chosen
            by the integration's own event mapping (`sage_eviction.integrations.sglang.
            SageTreeEvents`) at the same points of the tree as inside SGLang.
        policy_config: The strategy's keyword arguments (``{"protected_threshold": 3}`` for slru).
        flavor: ``"unified"`` or ``"radix_cache"`` (module docstring, "Clock").
        capacity: A sage policy's capacity where its spec gives none (the pool's pages; in
            SGLang the spec must give it: ``sage-s3fifo:capacity=N``).

    Raises:
        ValueError: A bad page size, tree, policy or config.
        PolicyConfigError: A sage policy spec sage cannot build.
    """

    def __init__(
        self,
        page_size: int = 1,
        eviction_policy: str = "lru",
        policy_config: dict[str, Any] | None = None,
        flavor: str = "unified",
        capacity: int | None = None,
    ) -> None:
        if type(page_size) is not int or page_size < 1:
            raise ValueError(f"page_size={page_size!r} must be a positive number of tokens")
        if flavor not in FLAVORS:
            raise ValueError(f"unknown tree {flavor!r}; SGLang's trees: {', '.join(FLAVORS)}")
        self.unified = flavor == "unified"
        self.page_size = page_size
        self.eviction_policy = eviction_policy.lower()
        self._clock = 0.0
        self._ids = 0
        self._sage: SageTreeEvents[RadixNode] | None = None
        if self.eviction_policy.startswith(SAGE_PREFIX):
            if not self.unified or policy_config:
                raise ValueError(
                    f"{eviction_policy}: a sage policy runs in the unified tree, its params in its spec"
                )
            self._sage = _sage_events(eviction_policy[len(SAGE_PREFIX) :], lambda: self._clock, capacity)
        else:
            self._key = eviction_key(eviction_policy, policy_config)
        self.root = self._new_node((), None, _ROOT_PRIORITY)
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size = 0  # tokens in unlocked nodes
        self.protected_size = 0  # tokens in locked nodes
        # unlocked nodes without children; a dict keeps insertion order (SGLang's is a set: its
        # order never matters, every candidate's key differs)
        self._leaves: dict[RadixNode, None] = {}

    # ------------------------------------------------------------------ clock and keys

    def _tick(self) -> float:
        """One reading of SGLang's clock."""
        self._clock += 1.0
        return self._clock

    def _new_node(self, key: Key, parent: RadixNode | None, priority: int) -> RadixNode:
        last_access = self._tick()  # SGLang stamps the access time first, then the creation time
        self._ids += 1
        return RadixNode(key, parent, priority, last_access, self._tick(), self._ids)

    def _aligned(self, tokens: Sequence[Hashable]) -> Key:
        size = len(tokens) // self.page_size * self.page_size
        return tuple(tokens[:size])

    def _child_key(self, key: Key, at: int = 0) -> Hashable:
        return key[at] if self.page_size == 1 else key[at : at + self.page_size]

    def _common(self, a: Key, b: Key, at: int) -> int:
        """Tokens `a` shares with `b[at:]` from their starts, down to a whole page."""
        n = min(len(a), len(b) - at)
        i = 0
        while i < n and a[i] == b[at + i]:
            i += 1
        return i // self.page_size * self.page_size

    # ------------------------------------------------------------------ the public operations

    def match_prefix(self, tokens: Sequence[Hashable]) -> Match:
        """The longest cached prefix of `tokens` (page-aligned); refreshes the path's access time
        and splits the node the match ends inside."""
        key = self._aligned(tokens)
        if not key:
            return Match(0, self.root)  # SGLang returns before reading its clock
        unified = self.unified
        now = 0.0 if unified else self._tick()  # the unified tree stamps the path at the end
        node = self.root
        if not unified:
            node.last_access = now
        at = 0
        while at < len(key):
            child = node.children.get(self._child_key(key, at))
            if child is None:
                break
            if not unified:
                child.last_access = now
            shared = self._common(child.key, key, at)
            if shared < len(child.key):
                node = self._split(child, shared)
                at += shared
                break
            node = child
            at += shared
        if unified:
            self._stamp_path(node)
        if self._sage is not None:
            self._sage.matched(node)
        return Match(at, node)

    def _stamp_path(self, node: RadixNode) -> None:
        """The unified tree's access times after a match: one reading for the matched path, a
        hair older at each step up (the deepest node is the newest)."""
        now = self._tick()
        walk: RadixNode | None = node
        while walk is not None:
            walk.last_access = now
            now -= 0.00001
            walk = walk.parent

    def insert(self, tokens: Sequence[Hashable], priority: int = 0, inserted_len: int = 0) -> int:
        """Insert `tokens` (page-aligned); returns the prefix that was already cached. A request
        inserting again passes the length it inserted before as `inserted_len` (no new hits)."""
        key = self._aligned(tokens)
        now = self._tick()
        node = self.root
        node.last_access = now
        node.priority = max(node.priority, priority)
        at = 0
        while at < len(key):
            child = node.children.get(self._child_key(key, at))
            if child is None:
                break
            child.last_access = self._tick() if self.unified else now
            shared = self._common(child.key, key, at)
            at += shared
            node = self._split(child, shared) if shared < len(child.key) else child
            node.priority = max(node.priority, priority)
            if at > inserted_len:
                node.hit_count += 1
        if at < len(key):
            leaf = self._new_node(key[at:], node, priority)
            if len(key) > inserted_len:
                leaf.hit_count += 1
            node.children[self._child_key(key, at)] = leaf
            self.evictable_size += len(leaf.key)
            self._update_leaf(node)
            self._update_leaf(leaf)
            if self._sage is not None:
                self._sage.track_up(leaf)
        return at

    def evict(self, num_tokens: int) -> list[RadixNode]:
        """Evict candidates in the strategy's order until `num_tokens` are freed (or none is
        left); returns the evicted nodes in order (detached; `RadixNode.path` still works)."""
        if self._sage is not None:
            return self._evict_by_sage(self._sage, num_tokens)
        key = self._key
        heap = [(key(n), n) for n in self._leaves]
        heapq.heapify(heap)
        evicted: list[RadixNode] = []
        freed = 0
        while freed < num_tokens and heap:
            _, node = heapq.heappop(heap)
            freed += len(node.key)
            self._delete_leaf(node)
            evicted.append(node)
            parent = node.parent
            assert parent is not None
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (key(parent), parent))
        return evicted

    def _evict_by_sage(self, sage: SageTreeEvents[RadixNode], num_tokens: int) -> list[RadixNode]:
        """`evict` with the sage policy's victims, one walk as SGLang's component makes it."""
        sage.start(self._leaves)
        evicted: list[RadixNode] = []
        freed = 0
        while freed < num_tokens:
            node = sage.next_victim(self._leaves)
            if node is None:
                break
            freed += len(node.key)
            self._delete_leaf(node)
            evicted.append(node)
        return evicted

    def inc_lock_ref(self, node: RadixNode) -> int:
        """Lock `node` and its ancestors; returns the change of the evictable size."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent
        return delta

    def dec_lock_ref(self, node: RadixNode) -> int:
        """Undo one `inc_lock_ref` of `node`; returns the change of the evictable size."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent
        return delta

    def total_size(self) -> int:
        """Tokens the tree holds."""
        return self.evictable_size + self.protected_size

    def snapshot(self) -> dict[Key, tuple[int, int, int]]:
        """Every node by its path: (lock count, hit count, priority); the tree's shape."""
        out: dict[Key, tuple[int, int, int]] = {}
        stack: list[tuple[RadixNode, Key]] = [(child, ()) for child in self.root.children.values()]
        while stack:
            node, prefix = stack.pop()
            path = prefix + node.key
            out[path] = (node.lock_ref, node.hit_count, node.priority)
            stack.extend((child, path) for child in node.children.values())
        return out

    # ------------------------------------------------------------------ internals

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Put a new node holding `child.key[:at]` between `child` and its parent."""
        parent = child.parent
        assert parent is not None
        head = self._new_node(child.key[:at], parent, child.priority)
        if self.unified:
            head.created = child.created
        head.hit_count = child.hit_count
        head.lock_ref = child.lock_ref
        head.children = {self._child_key(child.key, at): child}
        parent.children[self._child_key(child.key)] = head
        child.parent = head
        child.key = child.key[at:]
        if self.unified:
            child.last_access = self._tick()  # the unified tree stamps the split-off child anew
        if self._sage is not None:
            self._sage.track(head)
        return head

    def _delete_leaf(self, node: RadixNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key)]
        self.evictable_size -= len(node.key)
        self._leaves.pop(node, None)
        self._update_leaf(parent)

    def _update_leaf(self, node: RadixNode) -> None:
        if node.lock_ref > 0 or node.children:
            self._leaves.pop(node, None)
        elif node is not self.root:
            self._leaves[node] = None


def _sage_events(spec: str, clock: Callable[[], float], capacity: int | None) -> SageTreeEvents[RadixNode]:
    """The sage policy `spec` behind the tree's victims, through the integration's event mapping.

    Entry times are the tree's clock (SGLang's component reads the wall clock), so a policy that
    orders by those times rather than by its events is predicted only up to ties of that clock.

    Raises:
        PolicyConfigError: An unknown policy or parameter, or an offline one (Belady).
    """
    bridge = PolicyBridge(spec, capacity, engine="sglang model", log_path="", clock=clock)
    return SageTreeEvents(bridge, clock, is_root=lambda node: node.parent is None)
