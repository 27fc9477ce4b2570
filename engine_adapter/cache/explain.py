"""Why a block was evicted (docs/architecture.md, "Explaining an eviction").

With explanation on (`CacheManager(explain=True)`, the engine's ``--explain``), the radix cache
asks the policy, before each victim, for the next few candidates with their explanations
(`EvictionPolicy.explain_next`), evicts, and builds one record per victim:

- ``values``: the victim's explanation (its rank or place in the order, and the policy's own
  values: LRU's tick, GDSF's H and L, ARC's list and p, ...);
- ``preferred_to``: the next candidates the victim was chosen before, with theirs;
- ``skipped``: for policies that rank by one key per entry, the cached blocks that would have
  gone first but could not (pinned, in use by running sequences, or a prefix of other cached
  blocks), with why; ``skipped_counts``: how many cached blocks could not be chosen, by reason.

Building a record costs O(n) in the cached blocks (the policy's order, the scan for skipped
blocks), so it is off by default; with it off nothing on the eviction path changes (the radix
cache's `evict` is not touched). Values are made JSON-safe here: tuples become lists and
non-finite floats the strings ``"inf"``, ``"-inf"`` and ``"nan"``.

The radix index (`radix_cache.RadixCache.evict_explained`) calls `build_explanation` and passes
what it needs (its blocks, the policy's `rank`, the key format); this module imports only the
node type (`cached_block`, for typing), so it never imports what imports it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_adapter.cache.cached_block import CachedBlock

__all__ = ["EXPLAIN_CANDIDATES", "build_explanation", "jsonable", "skip_reason"]

EXPLAIN_CANDIDATES = 3
"""Candidates after the victim, and skipped blocks before it, that each record names."""


def jsonable(value: Any) -> Any:
    """`value` with tuples as lists and non-finite floats as strings, for strict JSON."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def skip_reason(block: CachedBlock) -> tuple[str, str]:
    """Why a cached block cannot be evicted now: a short kind and a phrase."""
    if block.pin_count:
        return "pinned", f"pinned ({block.pin_count} pin{'s' if block.pin_count > 1 else ''})"
    if block.ref_count:
        n = block.ref_count
        return "referenced", f"in use by {n} running sequence{'s' if n > 1 else ''}"
    n = block.num_children
    return "shared", f"a shared prefix of {n} cached block{'s' if n > 1 else ''}"


def _describe(block: CachedBlock | None, key: Hashable, fmt: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"block": fmt(key)}
    if block is not None:
        out["block_id"] = block.block_id
        out["sequence_id"] = block.sequence_id
    return out


def build_explanation(
    *,
    values: Mapping[str, object],
    upcoming: list[tuple[Hashable, dict[str, object]]],
    blocks: Mapping[Hashable, CachedBlock],
    held: Iterable[CachedBlock],
    rank_of: Any,
    fmt: Any,
    limit: int = EXPLAIN_CANDIDATES,
) -> dict[str, Any]:
    """The record of one victim.

    Args:
        values: The victim's explanation, taken before the eviction.
        upcoming: The candidates that followed it in the policy's order, with explanations.
        blocks: The cached blocks by key (before the eviction).
        held: The cached blocks to scan for skipped ones.
        rank_of: The policy's `rank`.
        fmt: How to print a block key.
        limit: Skipped blocks to name.
    """
    preferred = []
    for key, why in upcoming[:limit]:
        entry = _describe(blocks.get(key), key, fmt)
        entry["values"] = jsonable(why)
        preferred.append(entry)
    pinned = referenced = shared = 0
    rank = values.get("rank")
    before: list[tuple[Any, CachedBlock]] = []
    for block in held:  # the O(n) part: kept to counts and comparisons
        if block.evictable:
            continue
        if block.pin_count:
            pinned += 1
        elif block.ref_count:
            referenced += 1
        else:
            shared += 1
        if rank is not None:
            other = rank_of(block.key)
            if other < rank:
                before.append((other, block))
    before.sort(key=lambda item: item[0])
    counts = {"pinned": pinned, "referenced": referenced, "shared": shared}
    skipped = []
    for other, block in before[:limit]:
        entry = _describe(block, block.key, fmt)
        entry["why"] = skip_reason(block)[1]
        entry["rank"] = jsonable(other)
        skipped.append(entry)
    return {
        "values": jsonable(values),
        "preferred_to": preferred,
        "skipped": skipped,
        "skipped_before": len(before),
        "skipped_counts": counts,
    }
