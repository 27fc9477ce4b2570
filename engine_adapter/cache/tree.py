"""The radix prefix tree as a bounded picture (``GET /v1/cache/tree``, ``sage llm eviction tree``).

The cache keeps its blocks in a dict with parent links; this builds, on request, the tree a
person wants to see:

- a *node* is a chain of blocks in which each block but the last has exactly one cached child
  (a radix tree's compressed edge): its token span ``[start, end)``, its block count, the hits
  and ref count of its first block (a lock or a pin covers a whole root path, so the first
  block's are the largest), whether any block of it is pinned, whether its last block is
  evictable now, and the tenant;
- the tree is cut at `depth` nodes and `max_nodes` nodes in all, breadth first; what is cut is
  counted in the parent's ``hidden`` (``{"nodes": n, "blocks": b}``), so the answer stays small
  however large the cache is;
- *ghosts*: the latest evicted blocks (from the eviction log's ring; each event names its parent)
  that are not cached again, attached under the node holding their parent, under another ghost
  when their parent was evicted too, or at the top. A ghost subtree is drawn in another style.
  Ghosts obey the same bounds: a ghost sits one level below what it hangs from and is shown
  only within `depth` levels, and ghosts and nodes together are at most `max_nodes` (the latest
  evictions first, shallow before deep); a ghost not shown is counted in ``hidden_ghosts`` of
  the shown node or ghost it would hang below (the answer's own, at the top), so a chain of 64
  evicted blocks draws as `depth` levels, not 64.

With KV tiers (docs/architecture.md, "Tiers") every node says where its K/V lives: ``tier`` is
``device`` for the tree's nodes (``host_copies`` counts the blocks of the chain with a
write-through copy below); the blocks resident only below the device hang, as nodes of tier
``host`` or ``disk`` (chains of one tier), in ``below`` of the device node holding their parent
(at the top for a first block; under each other as ``children``), within the same bounds
(``below_nodes`` shown, ``hidden_below`` blocks not); ghosts are then only the dropped blocks.
``tiers`` counts the blocks of each tier.

O(n) in the cached blocks, under the cache lock; not for hot paths. Imports `block_keys`,
`cached_block`, `radix_cache` and `tiers`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.tier_level import TierEntry
from engine_adapter.cache.tiers import TierStore

__all__ = ["MAX_DEPTH", "MAX_GHOSTS", "MAX_NODES", "tree_snapshot"]

MAX_DEPTH = 64
MAX_NODES = 2000
MAX_GHOSTS = 64


def _chain(first: CachedBlock, children: Mapping[Hashable, list[CachedBlock]]) -> list[CachedBlock]:
    blocks = [first]
    while True:
        below = children.get(blocks[-1].key, ())
        if len(below) != 1:
            return blocks
        blocks.append(below[0])


def _node(blocks: list[CachedBlock], block_size: int) -> dict[str, Any]:
    first, last = blocks[0], blocks[-1]
    return {
        "id": format_block_key(first.key),
        "last": format_block_key(last.key),
        "tokens": [first.depth * block_size, (last.depth + 1) * block_size],
        "blocks": len(blocks),
        "block_ids": [first.block_id, last.block_id],
        "hits": first.meta.hits,
        "ref_count": first.ref_count,
        "pinned": any(b.pin_count for b in blocks),
        "evictable": last.evictable,
        "tenant": first.meta.tenant,
        "children": [],
        "hidden": {"nodes": 0, "blocks": 0},
    }


def _subtree_size(first: CachedBlock, children: Mapping[Hashable, list[CachedBlock]]) -> tuple[int, int]:
    """(nodes, blocks) of the subtree whose top chain starts at `first`."""
    nodes = blocks = 0
    stack = [first]
    while stack:
        chain = _chain(stack.pop(), children)
        nodes += 1
        blocks += len(chain)
        stack.extend(children.get(chain[-1].key, ()))
    return nodes, blocks


def tree_snapshot(
    radix: RadixCache,
    *,
    block_size: int,
    depth: int = 8,
    max_nodes: int = 200,
    evicted: Iterable[Mapping[str, Any]] = (),
    tiers: TierStore | None = None,
) -> dict[str, Any]:
    """The tree, cut to `depth` levels of nodes and `max_nodes` nodes, with ghosts.

    Args:
        radix: The cache (the caller holds its lock).
        block_size: Tokens per block, for token spans.
        depth: Node levels to show (1: the roots only).
        max_nodes: Nodes to show in all.
        evicted: Eviction events, oldest first (``event == "evict"`` ones are used).
        tiers: The host/disk tiers, to mark where each node's K/V lives; None: no tiers.

    Raises:
        ValueError: `depth` or `max_nodes` outside [1, MAX_DEPTH] or [1, MAX_NODES].
    """
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth={depth} must be in [1, {MAX_DEPTH}]")
    if not 1 <= max_nodes <= MAX_NODES:
        raise ValueError(f"max_nodes={max_nodes} must be in [1, {MAX_NODES}]")
    blocks = radix.blocks()
    roots, children = _children_of(blocks)
    top, hidden_top, by_block, levels = _walk(roots, children, block_size, depth, max_nodes)
    shown = len(levels)
    truncated = hidden_top["nodes"] > 0 or any(_has_hidden(n) for n in top)
    below_shown = hidden_below = 0
    resident_below: set[str] = set()
    if tiers is not None:
        resident_below = {format_block_key(k) for level in tiers.levels for k in level.entries}
        below_shown, hidden_below = _attach_below(
            tiers, radix, by_block, levels, top, block_size, depth, max_nodes - shown
        )
    ghosts = _Ghosts(evicted, radix, by_block, levels, resident_below)
    hidden_ghosts = ghosts.attach(top, depth, max_nodes - shown - below_shown)
    below = _mark_tiers(by_block, ghosts, tiers)
    return {
        "tiers": {"device": len(blocks), **below},
        "below_nodes": below_shown,
        "hidden_below": hidden_below,
        "block_size": block_size,
        "cached_blocks": len(blocks),
        "shown_nodes": shown,
        "depth": depth,
        "max_nodes": max_nodes,
        "truncated": truncated,
        "hidden": hidden_top,
        "roots": top,
        "ghost_blocks": ghosts.shown,
        "hidden_ghosts": hidden_ghosts,
    }


def _attach_below(
    tiers: TierStore,
    radix: RadixCache,
    by_block: Mapping[str, dict[str, Any]],
    levels: Mapping[int, int],
    top: list[dict[str, Any]],
    block_size: int,
    depth: int,
    budget: int,
) -> tuple[int, int]:
    """Hang the blocks resident only below the device (module docstring), breadth first within
    `depth` levels and `budget` nodes; returns nodes shown and blocks hidden."""
    below: dict[Hashable, list[TierEntry]] = {}
    for tier_level in tiers.levels:
        for entry in tier_level.entries.values():
            if not entry.on_device:
                below.setdefault(entry.parent_key, []).append(entry)
    queue: deque[tuple[TierEntry, dict[str, Any] | None, int, int]] = deque()
    hidden = 0
    for parent_key, kids in below.items():
        parent = None if parent_key is None else radix.get(parent_key)
        host = None if parent is None else by_block.get(format_block_key(parent_key))
        if parent_key is None or host is not None:
            at = (1, 0) if host is None or parent is None else (levels[id(host)] + 1, parent.depth + 1)
            queue.extend((kid, host, *at) for kid in kids)
        elif parent is not None:  # under a device block not shown
            hidden += sum(_below_size(kid, below) for kid in kids)
    shown = 0
    while queue:
        first, host, level, block_depth = queue.popleft()
        chain = [first]
        while len(kids := below.get(chain[-1].key, [])) == 1 and kids[0].tier is first.tier:
            chain.append(kids[0])
        if level > depth or shown >= budget:
            hidden += _below_size(first, below)
            continue
        end = block_depth + len(chain)
        node = {
            "id": format_block_key(first.key),
            "last": format_block_key(chain[-1].key),
            "tier": first.tier.value,
            "tokens": [block_depth * block_size, end * block_size],
            "blocks": len(chain),
            "hits": first.meta.hits,
            "children": [],
        }
        shown += 1
        if host is None:
            top.append(node)
        else:
            under = "below" if host.get("tier", "device") == "device" else "children"
            host.setdefault(under, []).append(node)
        queue.extend((kid, node, level + 1, end) for kid in below.get(chain[-1].key, []))
    return shown, hidden


def _below_size(first: TierEntry, below: Mapping[Hashable, list[TierEntry]]) -> int:
    """Blocks of the below-device subtree from `first`."""
    count, stack = 0, [first]
    while stack:
        entry = stack.pop()
        count += 1
        stack.extend(below.get(entry.key, []))
    return count


def _mark_tiers(
    by_block: Mapping[str, dict[str, Any]], ghosts: _Ghosts, tiers: TierStore | None
) -> dict[str, int]:
    """Mark each shown node's and ghost's tier; returns the blocks of each tier below the device."""
    where: dict[str, str] = {}
    counts: dict[str, int] = {}
    for level in tiers.levels if tiers is not None else ():
        counts[level.tier.value] = len(level.entries)
        for key in level.entries:
            where[format_block_key(key)] = level.tier.value
    for node in {id(n): n for n in by_block.values()}.values():
        node["tier"] = "device"
        node["host_copies"] = 0
    for key, node in by_block.items():
        node["host_copies"] += key in where
    for key, ghost in ghosts.nodes.items():
        ghost["tier"] = where.get(key)
    return counts


def _children_of(blocks: list[CachedBlock]) -> tuple[list[CachedBlock], dict[Hashable, list[CachedBlock]]]:
    """The first blocks and each block's cached children, the busiest prefixes first."""
    children: dict[Hashable, list[CachedBlock]] = {}
    roots: list[CachedBlock] = []
    for block in blocks:
        if block.parent is None:
            roots.append(block)
        else:
            children.setdefault(block.parent.key, []).append(block)
    order = lambda b: (-b.meta.hits, b.block_id)  # noqa: E731 - the busiest prefixes first
    roots.sort(key=order)
    for kids in children.values():
        kids.sort(key=order)
    return roots, children


def _walk(
    roots: list[CachedBlock],
    children: Mapping[Hashable, list[CachedBlock]],
    block_size: int,
    depth: int,
    max_nodes: int,
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, dict[str, Any]], dict[int, int]]:
    """Breadth first to `depth` levels and `max_nodes` nodes: the top nodes, what is hidden at
    the top, the node showing each block (by formatted key), and each shown node's level (by
    the node's `id`; as many as the nodes shown)."""
    top: list[dict[str, Any]] = []
    hidden_top = {"nodes": 0, "blocks": 0}
    by_block: dict[str, dict[str, Any]] = {}  # block key -> the node showing it
    levels: dict[int, int] = {}
    queue: deque[tuple[CachedBlock, int, dict[str, Any] | None]] = deque((r, 1, None) for r in roots)
    while queue:
        first, level, parent = queue.popleft()
        if len(levels) >= max_nodes or level > depth:
            nodes, count = _subtree_size(first, children)
            hidden = hidden_top if parent is None else parent["hidden"]
            hidden["nodes"] += nodes
            hidden["blocks"] += count
            continue
        chain = _chain(first, children)
        node = _node(chain, block_size)
        levels[id(node)] = level
        for block in chain:
            by_block[format_block_key(block.key)] = node
        (top if parent is None else parent["children"]).append(node)
        queue.extend((kid, level + 1, node) for kid in children.get(chain[-1].key, ()))
    return top, hidden_top, by_block, levels


def _has_hidden(node: Mapping[str, Any]) -> bool:
    hidden = node.get("hidden")
    return bool(hidden and hidden["nodes"]) or any(_has_hidden(c) for c in node["children"])


def _ghost_node(event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": event["block"],
        "ghost": True,
        "blocks": 1,
        "depth": event.get("depth"),
        "evicted_at": event.get("ts"),
        "reason": event.get("reason"),
        "policy": event.get("policy"),
        "tenant": event.get("tenant"),
        "hits": event.get("hits"),
        "children": [],
    }


class _Ghosts:
    """The latest evicted blocks not cached again, each with what it hangs below and its level.

    A ghost hangs below the ghost of its parent block, else below the shown node holding its
    parent, else at the top; its level is one more than that of what it hangs below (1 at the
    top). Built from the eviction events, oldest first; `attach` places them within the bounds.
    """

    def __init__(
        self,
        evicted: Iterable[Mapping[str, Any]],
        radix: RadixCache,
        by_block: dict[str, dict[str, Any]],
        levels: dict[int, int],
        resident_below: AbstractSet[str] = frozenset(),
    ) -> None:
        # a block still below the device is a `below` node, not a ghost
        cached = {format_block_key(b.key) for b in radix.blocks()} | resident_below
        latest: dict[str, Mapping[str, Any]] = {}
        for event in evicted:
            if event.get("event") == "evict" and isinstance(event.get("block"), str):
                latest.pop(event["block"], None)  # re-evicted: it moves to the newest end
                latest[event["block"]] = event
        picked = [e for key, e in latest.items() if key not in cached][-MAX_GHOSTS:]
        self._nodes = self.nodes = {e["block"]: _ghost_node(e) for e in picked}
        self._recency = {e["block"]: i for i, e in enumerate(picked)}  # larger: evicted later
        self._parent: dict[str, str | None] = {}
        self._host: dict[str, dict[str, Any] | None] = {}
        for e in picked:
            parent = e.get("parent")
            ghost_parent = isinstance(parent, str) and parent in self._nodes and parent != e["block"]
            self._parent[e["block"]] = parent if ghost_parent else None
            self._host[e["block"]] = (
                by_block.get(parent) if isinstance(parent, str) and not ghost_parent else None
            )
        self._node_levels = levels
        self._levels: dict[str, int] = {}
        self.shown = 0

    def level(self, key: str) -> int:
        """The ghost's level (a parent chain that loops, which events should never make, is cut)."""
        path: list[str] = []  # ghosts whose level follows from their parent's
        seen: set[str] = set()
        at = key
        while at not in self._levels:
            parent = self._parent[at]
            if parent is None or parent in seen:
                host = self._host[at]
                self._levels[at] = 1 if host is None else self._node_levels[id(host)] + 1
                break
            seen.add(at)
            path.append(at)
            at = parent
        for below in reversed(path):
            parent = self._parent[below]
            assert parent is not None  # only ghosts with a ghost parent are on the path
            self._levels[below] = self._levels[parent] + 1
        return self._levels[key]

    def attach(self, top: list[dict[str, Any]], depth: int, budget: int) -> int:
        """Hang the ghosts that fit `depth` levels and `budget` nodes (shallow, then the latest
        first); count the others in ``hidden_ghosts`` of where they would hang. Returns how many
        hang from nowhere shown (the answer's own ``hidden_ghosts``)."""
        order = sorted(self._nodes, key=lambda k: (self.level(k), -self._recency[k]))
        placed: set[str] = set()
        hidden_top = 0
        for key in order:
            node, parent, host = self._nodes[key], self._parent[key], self._host[key]
            fits = self.level(key) <= depth and len(placed) < budget
            if fits and (parent is None or parent in placed):
                placed.add(key)
                if parent is not None:
                    self._nodes[parent]["children"].append(node)
                elif host is not None:
                    host.setdefault("ghosts", []).append(node)
                else:
                    top.append(node)
                continue
            shown_above = self._shown_above(key, placed)
            if shown_above is None:
                hidden_top += 1
            else:
                shown_above["hidden_ghosts"] = shown_above.get("hidden_ghosts", 0) + 1
        self.shown = len(placed)
        return hidden_top

    def _shown_above(self, key: str, placed: set[str]) -> dict[str, Any] | None:
        """The nearest shown ghost or node a hidden ghost hangs below, None for the top."""
        seen: set[str] = set()
        while True:
            parent = self._parent[key]
            if parent is None or parent in seen:
                return self._host[key]
            if parent in placed:
                return self._nodes[parent]
            seen.add(key)
            key = parent
