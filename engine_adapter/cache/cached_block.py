"""`CachedBlock`: one node of the radix index, a full block of the prefix cache.

The radix index (`radix_cache.RadixCache`) creates, links and counts these; the compiled core
(`_core.pyx`) has a typed twin with the same attributes. Kept apart from the index so that what
reads nodes (the explainer, the tree view, the invariants, the sequence records) does not import
the index. Imports only `block_keys` and the policy library.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine_adapter.cache.block_keys import format_block_key
from sage_eviction import EntryMeta

__all__ = ["CachedBlock"]


class CachedBlock:
    """One cached block: a node of the radix tree.

    Attributes:
        key: The block's chained hash (or the caller's block id).
        block_id: The pool block holding its K/V.
        parent: The previous block of the prefix; None at the root.
        depth: 0 for a first block.
        num_children: Cached blocks whose parent this is.
        ref_count: Running sequences holding it.
        pin_count: Nested pins (system prompts).
        evictable: What the policy was last told.
        meta: The policy's record (hits, last access, priority, tenant); shared with the policy.
        sequence_id: The sequence that computed it.
    """

    __slots__ = (
        "block_id",
        "depth",
        "evictable",
        "key",
        "meta",
        "num_children",
        "parent",
        "pin_count",
        "ref_count",
        "sequence_id",
    )

    def __init__(
        self,
        key: Hashable,
        block_id: int,
        parent: CachedBlock | None,
        meta: EntryMeta,
        sequence_id: int | None,
        ref_count: int,
    ) -> None:
        self.key = key
        self.block_id = block_id
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.num_children = 0
        self.ref_count = ref_count
        self.pin_count = 0
        self.evictable = ref_count == 0
        self.meta = meta
        self.sequence_id = sequence_id

    def __repr__(self) -> str:
        return (
            f"CachedBlock(key={format_block_key(self.key)[:12]}, block_id={self.block_id}, "
            f"depth={self.depth}, ref={self.ref_count}, pin={self.pin_count}, children={self.num_children})"
        )
