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

O(n) in the cached blocks, under the cache lock; not for hot paths. Imports `block_keys`,
`cached_block` and `radix_cache`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.radix_cache import RadixCache

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
) -> dict[str, Any]:
    """The tree, cut to `depth` levels of nodes and `max_nodes` nodes, with ghosts.

    Args:
        radix: The cache (the caller holds its lock).
        block_size: Tokens per block, for token spans.
        depth: Node levels to show (1: the roots only).
        max_nodes: Nodes to show in all.
        evicted: Eviction events, oldest first (``event == "evict"`` ones are used).

    Raises:
        ValueError: `depth` or `max_nodes` outside [1, MAX_DEPTH] or [1, MAX_NODES].
    """
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth={depth} must be in [1, {MAX_DEPTH}]")
    if not 1 <= max_nodes <= MAX_NODES:
        raise ValueError(f"max_nodes={max_nodes} must be in [1, {MAX_NODES}]")
    blocks = radix.blocks()
    roots, children = _children_of(blocks)
    top, hidden_top, by_block, shown = _walk(roots, children, block_size, depth, max_nodes)
    truncated = hidden_top["nodes"] > 0 or any(_has_hidden(n) for n in top)
    ghosts = _ghosts(evicted, radix, by_block, top)
    return {
        "block_size": block_size,
        "cached_blocks": len(blocks),
        "shown_nodes": shown,
        "depth": depth,
        "max_nodes": max_nodes,
        "truncated": truncated,
        "hidden": hidden_top,
        "roots": top,
        "ghost_blocks": ghosts,
    }


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
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, dict[str, Any]], int]:
    """Breadth first to `depth` levels and `max_nodes` nodes: the top nodes, what is hidden at
    the top, the node showing each block (by formatted key), and the nodes shown."""
    top: list[dict[str, Any]] = []
    hidden_top = {"nodes": 0, "blocks": 0}
    by_block: dict[str, dict[str, Any]] = {}  # block key -> the node showing it
    shown = 0
    queue: deque[tuple[CachedBlock, int, dict[str, Any] | None]] = deque((r, 1, None) for r in roots)
    while queue:
        first, level, parent = queue.popleft()
        if shown >= max_nodes or level > depth:
            nodes, count = _subtree_size(first, children)
            hidden = hidden_top if parent is None else parent["hidden"]
            hidden["nodes"] += nodes
            hidden["blocks"] += count
            continue
        chain = _chain(first, children)
        node = _node(chain, block_size)
        shown += 1
        for block in chain:
            by_block[format_block_key(block.key)] = node
        (top if parent is None else parent["children"]).append(node)
        queue.extend((kid, level + 1, node) for kid in children.get(chain[-1].key, ()))
    return top, hidden_top, by_block, shown


def _has_hidden(node: Mapping[str, Any]) -> bool:
    hidden = node.get("hidden")
    return bool(hidden and hidden["nodes"]) or any(_has_hidden(c) for c in node["children"])


def _ghosts(
    evicted: Iterable[Mapping[str, Any]],
    radix: RadixCache,
    by_block: dict[str, dict[str, Any]],
    top: list[dict[str, Any]],
) -> int:
    """Attach the latest evicted blocks not cached again as ghost nodes; returns how many."""
    cached = {format_block_key(b.key) for b in radix.blocks()}
    latest: dict[str, Mapping[str, Any]] = {}
    for event in evicted:
        if event.get("event") == "evict" and isinstance(event.get("block"), str):
            latest[event["block"]] = event
    picked = [e for key, e in latest.items() if key not in cached][-MAX_GHOSTS:]
    ghost_nodes: dict[str, dict[str, Any]] = {}
    for event in picked:
        ghost_nodes[event["block"]] = {
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
    for event in picked:
        node = ghost_nodes[event["block"]]
        parent = event.get("parent")
        if isinstance(parent, str) and parent in ghost_nodes and parent != event["block"]:
            ghost_nodes[parent]["children"].append(node)
        elif isinstance(parent, str) and parent in by_block:
            by_block[parent].setdefault("ghosts", []).append(node)
        else:
            top.append(node)
    return len(picked)
