"""sage's policies inside vLLM (v1): the GPU prefix cache and the KV-offload CPU cache.

Two seams (docs/architecture.md, "Engine integrations"):

1. **GPU prefix cache** (no upstream seam; PR vllm-project/vllm#40270 proposes one). vLLM's
   eviction order is implicit in `FreeKVCacheBlockQueue`: cached blocks are appended when freed
   and `get_new_blocks` pops the head. The `vllm.general_plugins` entry point `register()`
   replaces `kv_cache_coordinator.BlockPool` with `SageBlockPool`, whose free queue hands out
   uncached free blocks in vLLM's order and, once only cached blocks are left, the sage
   policy's victim. It is active only when `SAGE_VLLM_GPU_POLICY=name:k=v` is set: general
   plugins load in every vLLM process of everyone who installs sage.

   Chain tails first: evicting a mid-chain block would orphan every block after it (a prefix
   lookup stops at the first miss), so a cached block is evictable to the policy only while
   it is free *and* no cached block of its chain follows it, as sage's own radix cache
   decides (docs/architecture.md, "Cache core"). The policy then orders those leaves.

2. **KV offloading** (official, experimental in vLLM): `CachePolicyFactory` imports
   `kv_connector_extra_config["eviction_policy"]` from `["cache_policy_module_path"]`. This
   module answers `SagePolicy` (policy from `SAGE_POLICY`) and `Sage_<name>` (that registry
   name with its defaults) with a `CachePolicy` subclass that runs on both the 0.32 and the 0.33
   signature (0.33 added `req_context` to `insert`).

vLLM is imported only inside these functions; classes are built on first use, each a
module-level mixin (`_SageBlockPool`, `_SageFreeQueue`, `_SageCachePolicy`) put over vLLM's own
class by a small cached factory.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

from sage_eviction.errors import PolicyConfigError
from sage_eviction.integrations.bridge import PolicyBridge, policy_spec_from_env
from sage_eviction.integrations.compat import EngineClass, check_version
from sage_eviction.registry import resolve_policy
from sage_eviction.types import EntryMeta

__all__ = ["GPU_POLICY_ENV", "register", "sage_block_pool_class", "sage_cache_policy_class"]

GPU_POLICY_ENV = "SAGE_VLLM_GPU_POLICY"
# A child of vLLM's own logger, so the lines appear in vLLM's log with its format and level.
_log = logging.getLogger("vllm.sage_eviction")


def register() -> None:
    """The `vllm.general_plugins` entry point: a no-op unless `SAGE_VLLM_GPU_POLICY` is set (or
    `LMCACHE_CACHE_POLICY` names a sage policy, which installs sage's LMCache policies).

    Runs once in each vLLM process (API server, EngineCore, workers); only the EngineCore
    builds a BlockPool, so only there does the policy run.

    Raises:
        UnsupportedEngineVersion: vLLM is not a tested release.
        PolicyConfigError: The spec names no policy or has a bad param (checked here, so a
            typo fails at startup with one line rather than at the first eviction).
    """
    from sage_eviction.integrations import lmcache

    if lmcache.wanted(os.environ.get("LMCACHE_CACHE_POLICY")):
        lmcache.install()  # LMCache's in-process connector builds its backends in this process
    spec = policy_spec_from_env(GPU_POLICY_ENV)
    if spec is None:
        return
    check_version("vllm")
    try:
        resolve_policy(spec, 1, online=True)
    except PolicyConfigError as exc:
        raise type(exc)(f"{GPU_POLICY_ENV}={spec}: {exc}") from None
    from vllm.v1.core import kv_cache_coordinator

    kv_cache_coordinator.BlockPool = sage_block_pool_class()
    _log.info("sage: vLLM's GPU prefix cache evicts in the order of policy %r", spec)


class _SageFreeQueue(EngineClass):  # type: ignore[misc]
    """vLLM's free list (still the truth of which blocks are free) that reports every change to
    its pool and lets the policy pick among the cached blocks.

    A mixin over vLLM's `FreeKVCacheBlockQueue` (`_sage_free_queue_class`): `super()` is vLLM's
    queue, so its own `remove` unlinks a victim without reporting it as taken.
    """

    pool: Any

    def popleft(self) -> Any:
        head = self.fake_free_list_head.next_free_block
        if head is None or head is self.fake_free_list_tail or head.block_hash is None:
            return super().popleft()  # an uncached block: reusing it loses nothing
        block = self.pool._policy_victim()
        super().remove(block)
        return block

    def popleft_n(self, n: int) -> list[Any]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks from {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: Any) -> None:
        super().remove(block)
        self.pool._taken(block)

    def append(self, block: Any) -> None:
        super().append(block)
        self.pool._freed((block,))

    def append_n(self, blocks: list[Any]) -> None:
        super().append_n(blocks)
        self.pool._freed(blocks)

    def prepend_n(self, blocks: list[Any]) -> None:
        super().prepend_n(blocks)
        self.pool._freed(blocks)


@functools.cache
def _sage_free_queue_class(base: type[Any] | None = None) -> type[Any]:
    """`SageFreeQueue`, `_SageFreeQueue` over `base` (None: the installed vLLM's free list)."""
    if base is None:
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

        base = FreeKVCacheBlockQueue

    class SageFreeQueue(_SageFreeQueue, base):  # type: ignore[misc,valid-type]
        """vLLM's free list reporting to its `SageBlockPool` (`_SageFreeQueue`)."""

    return SageFreeQueue


class _SageBlockPool(EngineClass):  # type: ignore[misc]
    """vLLM's BlockPool whose cached blocks are evicted in a sage policy's order.

    A mixin over vLLM's `BlockPool` (`sage_block_pool_class`). Policy keys are block ids.
    Events: a block gets a hash → `insert` (in use, so not evictable); a prefix hit → `access`;
    freed with no cached child → evictable; taken by a hit or gaining a cached child → not
    evictable; hash dropped otherwise (a connector's invalidation, a promotion) → `remove`; a
    prefix-cache reset → `clear`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sage: PolicyBridge | None = None
        self.sage_fallbacks = 0  # pops the policy could not serve (vLLM's order was used)
        # Chains by hash, not block id: when a parent is evicted and recomputed into
        # another block, its cached children are reachable again through the new one.
        self._parent_hash: dict[int, Any] = {}  # child block id -> parent's hash key
        self._children: dict[Any, set[int]] = {}  # hash key -> cached child block ids
        self._invalidating = False
        if self.enable_caching:
            self.sage = PolicyBridge(
                self.sage_spec, capacity=self.num_gpu_blocks, engine="vllm", env_var=GPU_POLICY_ENV
            )
            self.free_block_queue.__class__ = self.sage_queue_class or _sage_free_queue_class()
            self.free_block_queue.pool = self
            _log.info(
                "sage: BlockPool of %d blocks evicts with %s", self.num_gpu_blocks, self.sage.describe()
            )

    # ---- what the free queue reports ----------------------------------------------------

    def _evictable(self, block: Any) -> bool:
        return (
            block.ref_cnt == 0
            and block.prev_free_block is not None
            and not self._children.get(block.block_hash)
        )

    def _sync(self, block: Any) -> None:
        if self.sage is not None and block.block_id in self.sage:
            self.sage.set_evictable(block.block_id, self._evictable(block))

    def _freed(self, blocks: Iterable[Any]) -> None:
        for block in blocks:
            self._sync(block)

    def _taken(self, block: Any) -> None:
        if self.sage is not None:
            self.sage.set_evictable(block.block_id, False)

    def _policy_victim(self) -> Any:
        """The next cached block to reuse. `get_new_blocks` pops all its blocks before it
        drops their hashes, so each victim leaves its chain here, at once: its parent may
        be the very next victim."""
        assert self.sage is not None
        victims = self.sage.evict(1)
        block = self.blocks[victims[0]] if victims else None
        if block is None or block.prev_free_block is None:
            # Nothing evictable (e.g. free parents whose children a sliding-window group
            # still holds) or a state mismatch: vLLM's own order.
            self.sage_fallbacks += 1
            self.sage.note("fallback")
            block = self.free_block_queue.fake_free_list_head.next_free_block
        self._unlink(block)
        return block

    def _unlink(self, block: Any) -> None:
        """`block` leaves the cache: out of the policy (a no-op for its own victims) and out
        of its chain, which may make its parent a tail."""
        assert self.sage is not None
        self.sage.remove(block.block_id)
        parent = self._parent_hash.pop(block.block_id, None)
        if parent is not None:
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.discard(block.block_id)
                if not siblings:
                    del self._children[parent]
                    self._sync_hash(parent)

    def _sync_hash(self, key: Any) -> None:
        holder = self.cached_block_hash_to_block.get_one_block(key)
        if holder is not None:
            self._sync(holder)

    # ---- the pool's events ----------------------------------------------------------------

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        if self.sage is None:
            return
        for i in range(max(num_cached_blocks, 1), num_full_blocks):
            parent, child = blocks[i - 1], blocks[i]
            if parent.is_null or child.is_null or parent.block_hash is None:
                continue
            if child.block_id in self.sage and child.block_id not in self._parent_hash:
                self._parent_hash[child.block_id] = parent.block_hash
                self._children.setdefault(parent.block_hash, set()).add(child.block_id)
                self._sync(parent)

    def _insert_block_hash(self, block_hash: Any, block: Any, num_tokens: int | None) -> None:
        super()._insert_block_hash(block_hash, block, num_tokens)
        sage = self.sage
        if sage is not None and block.block_hash is not None and block.block_id not in sage:
            now = time.time()
            meta = EntryMeta(
                size=self.hash_block_size,
                cost=float(num_tokens or self.hash_block_size),  # the prefix it saves recomputing
                created_at=now,
                last_access=now,
            )
            sage.insert(block.block_id, meta, evictable=self._evictable(block))

    def _remove_cached_block_hashes(self, block: Any) -> list[Any]:
        if self.sage is not None:
            self._unlink(block)
        return list(super()._remove_cached_block_hashes(block))

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        evicted = bool(super()._maybe_evict_cached_block(block))
        if evicted and self.sage is not None:
            op = "engine_invalidate" if self._invalidating else "engine_evict"
            self.sage.note(op, key=block.block_id)
        return evicted

    def evict_blocks(self, block_ids: set[int]) -> None:
        self._invalidating = True
        try:
            super().evict_blocks(block_ids)
        finally:
            self._invalidating = False

    def touch(self, blocks: Any) -> None:
        sage = self.sage
        if sage is not None:
            for block in blocks:
                if not block.is_null and block.block_id in sage:
                    sage.access(block.block_id)
        super().touch(blocks)

    def reset_prefix_cache(self) -> bool:
        done = bool(super().reset_prefix_cache())
        if done and self.sage is not None:
            self.sage.clear()
            self._parent_hash.clear()
            self._children.clear()
        return done


@functools.cache
def sage_block_pool_class(
    base: type[Any] | None = None, queue: type[Any] | None = None, spec: str | None = None
) -> type[Any]:
    """`SageBlockPool`, `_SageBlockPool` over `base` and its free queue class `queue` (None: the
    installed vLLM's `BlockPool` and `FreeKVCacheBlockQueue`), running `spec` (None:
    `SAGE_VLLM_GPU_POLICY`); built once per arguments."""
    if base is None:
        from vllm.v1.core.block_pool import BlockPool

        base = BlockPool
    # a class is hashable: mypy cannot tell of type[Any]
    queue_class = _sage_free_queue_class(queue) if queue is not None else _sage_free_queue_class()  # type: ignore[arg-type]

    class SageBlockPool(_SageBlockPool, base):  # type: ignore[misc,valid-type]
        """vLLM's BlockPool whose cached blocks are evicted in a sage policy's order (`_SageBlockPool`)."""

        sage_spec = spec
        sage_queue_class = queue_class

    return SageBlockPool


# ---- KV offloading: a CachePolicy ---------------------------------------------------------


class _SageCachePolicy(EngineClass):  # type: ignore[misc]
    """A `vllm.v1.kv_offload` `CachePolicy` running the policy `sage_spec` names (None:
    `SAGE_POLICY`); a mixin over vLLM's class (`sage_cache_policy_class`)."""

    sage_spec: ClassVar[str | None] = None

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[Hashable, Any] = {}
        self.sage = PolicyBridge(self.sage_spec, cache_capacity, engine="vllm-offload")

    def get(self, key: Hashable) -> Any:
        return self.chunks.get(key)

    # 0.32: insert(key, chunk); 0.33: insert(key, chunk, req_context)
    def insert(self, key: Hashable, chunk: Any, req_context: Any = None) -> None:
        self.chunks[key] = chunk
        self.sage.insert(key, evictable=chunk.ref_cnt == 0)

    def remove(self, key: Hashable) -> None:
        self.chunks.pop(key, None)
        self.sage.remove(key)

    def touch(self, keys: Iterable[Hashable], req_context: Any = None) -> None:
        # Tail first, as vLLM's LRU does: a prefix's head ends up the most recent.
        for key in reversed(list(keys)):
            self.sage.access(key)

    def on_store_miss(self, keys: Iterable[Hashable], req_context: Any = None) -> None:
        for key in keys:  # ghost-list policies (ARC, S3-FIFO) adapt before the evictions
            self.sage.prepare_insert(key)

    def evict(self, n: int, protected: set[Hashable]) -> list[tuple[Hashable, Any]] | None:
        if n == 0:
            return []
        victims = self.sage.evict(n, protected, exact=True)
        if len(victims) < n:
            return None
        return [(key, self.chunks.pop(key)) for key in victims]

    def clear(self) -> None:
        self.chunks.clear()
        self.sage.clear()

    def mark_evictable(self, key: Hashable) -> None:
        self.sage.set_evictable(key, True)

    def mark_non_evictable(self, key: Hashable) -> None:
        self.sage.set_evictable(key, False)


@functools.cache
def sage_cache_policy_class(policy: str | None = None) -> type[Any]:
    """A `vllm.v1.kv_offload` `CachePolicy` subclass running `policy` (None: `SAGE_POLICY`).

    Its `evict` is all or nothing, as the ABC demands; protected keys are never chosen.
    """
    check_version("vllm")
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    class SageCachePolicy(_SageCachePolicy, CachePolicy):  # type: ignore[misc]
        sage_spec = policy

    name = "SagePolicy" if policy is None else f"Sage_{policy}"
    SageCachePolicy.__name__ = SageCachePolicy.__qualname__ = name
    return SageCachePolicy


def __getattr__(name: str) -> type[Any]:
    """`SagePolicy` and `Sage_<policy>`, the names `CachePolicyFactory` looks up in this module."""
    if name == "SagePolicy":
        return sage_cache_policy_class(None)
    if name.startswith("Sage_") and len(name) > 5:
        return sage_cache_policy_class(name[5:])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
