"""`ApproxTree`: the router's own radix tree of the prompts it sent to each replica.

sgl-router's cache-aware policy keeps one tree over the text of the prompts it routed, each
node marked with the workers (tenants) it sent that prefix to and when; it never asks a worker
what it caches, so the tree is an approximation: it forgets only by its own size limit, checked
every `eviction_interval` seconds, never when the engine evicts. The trace has no text, so the
tree here runs over block keys: one node per block, a tenant's size is its blocks.

- `insert(keys, tenant, now)`: mark the path for the tenant (creating nodes), stamped `now`.
- `prefix_match(keys, now)`: the longest matched prefix and a tenant holding all of it; of
  several, the one that used it most recently (sgl-router takes its map's first, an order the
  Rust map leaves unspecified: this is the deterministic choice). The match refreshes that
  tenant's stamps on the path.
- `smallest_tenant()`: the tenant with the fewest nodes (ties: the lowest).
- `evict_to(max_size)`: per tenant over the limit, drop its least recently used leaves (its
  nodes without a child of its own) until it fits; a node no tenant holds goes.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

__all__ = ["ApproxTree"]


class _Node:
    __slots__ = ("children", "key", "parent", "tenants")

    def __init__(self, key: Hashable, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, _Node] = {}
        self.tenants: dict[int, float] = {}  # tenant -> last access


class ApproxTree:
    """The approximate tree over block keys, for tenants ``0 .. tenants - 1``."""

    def __init__(self, tenants: int) -> None:
        self.root = _Node(None, None)
        self.sizes = [0] * tenants

    def insert(self, keys: Sequence[Hashable], tenant: int, now: float) -> None:
        node = self.root
        sizes = self.sizes
        for key in keys:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(key, node)
            if tenant not in child.tenants:
                sizes[tenant] += 1
            child.tenants[tenant] = now
            node = child

    def prefix_match(self, keys: Sequence[Hashable], now: float) -> tuple[int, int | None]:
        """Matched blocks and the tenant chosen at the deepest matched node (None: no match)."""
        node = self.root
        path: list[_Node] = []
        for key in keys:
            child = node.children.get(key)
            if child is None or not child.tenants:
                break
            path.append(child)
            node = child
        if not path:
            return 0, None
        tenants = path[-1].tenants
        tenant = max(tenants, key=lambda t: (tenants[t], -t))
        for visited in path:
            visited.tenants[tenant] = now
        return len(path), tenant

    def smallest_tenant(self) -> int:
        sizes = self.sizes
        return min(range(len(sizes)), key=lambda t: (sizes[t], t))

    def evict_to(self, max_size: int) -> None:
        over = {t for t, size in enumerate(self.sizes) if size > max_size}
        if not over:
            return
        leaves: dict[int, list[tuple[float, int, _Node]]] = {t: [] for t in over}
        stack = list(self.root.children.values())
        order = 0
        while stack:  # each tenant's leaves: its nodes with no child of its own
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in over.intersection(node.tenants):
                if not any(tenant in c.tenants for c in node.children.values()):
                    order += 1
                    leaves[tenant].append((node.tenants[tenant], order, node))
        for tenant, heap in leaves.items():
            heapq.heapify(heap)
            while self.sizes[tenant] > max_size and heap:
                _, _, node = heapq.heappop(heap)
                del node.tenants[tenant]
                self.sizes[tenant] -= 1
                parent = node.parent
                if not node.tenants and not node.children and parent is not None:
                    del parent.children[node.key]
                if (
                    parent is not None
                    and parent is not self.root
                    and tenant in parent.tenants
                    and not any(tenant in c.tenants for c in parent.children.values())
                ):  # the parent is now one of the tenant's leaves
                    order += 1
                    heapq.heappush(heap, (parent.tenants[tenant], order, parent))
