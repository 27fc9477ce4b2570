"""The policy's record of a cached block, derived from the request that computed it (one place).

`CacheManager.commit_blocks` and `free_sequence` cache a sequence's full blocks; each block's
`EntryMeta` (what the policies read: priority, tenant, deadline, lifetime, the radix features)
is made here from the sequence's `CacheRequest` and the state of the call (time, length). The
compiled core's ``_Metas`` (`_core.pyx`) builds the same records without a Python frame per
block and must stay in step with `BlockMetaFields.meta` (tests/test_compiled_cache.py checks).
Imports only `request` and the policy library.
"""

from __future__ import annotations

from typing import NamedTuple

from engine_adapter.cache.request import CacheRequest
from sage_eviction import EntryMeta

__all__ = ["BlockMetaFields"]


class BlockMetaFields(NamedTuple):
    """What the records of the blocks a sequence caches in one call are made of (`meta`).

    Attributes:
        block_size: Tokens per block.
        request: The sequence's request (priority, tenant, lifetime, max length, deadline,
            conversation).
        now: The call's time: the blocks' creation and last access.
        seq_len: Tokens the sequence's blocks are reserved for now.
        prompt_blocks: Blocks of its prompt, ``ceil(prompt tokens / block_size)``.
        prefix_idle: Seconds its cached prefix had been idle when it was admitted (None: no hit).
    """

    block_size: int
    request: CacheRequest
    now: float
    seq_len: int
    prompt_blocks: int
    prefix_idle: float | None

    def meta(self, index: int) -> EntryMeta:
        """The record of the sequence's block `index` (its blocks are a root path: depth = index)."""
        bs = self.block_size
        request = self.request
        return EntryMeta(
            size=bs,
            cost=float((index + 1) * bs),
            priority=request.priority,
            tenant=request.tenant,
            created_at=self.now,
            last_access=self.now,
            hits=0,
            estimated_lifetime=request.estimated_lifetime,
            seq_len=self.seq_len,
            max_len=request.max_tokens,
            deadline=request.deadline,
            depth=index,
            pos_from_end=self.prompt_blocks - 1 - index,
            prompt_blocks=self.prompt_blocks,
            conversation=request.conversation,
            prefix_idle=self.prefix_idle,
        )
