"""vLLM v1's prefix-cache block pool, rebuilt in pure Python for the `vllm` cache model.

The classes keep the shape of vLLM's own (`KVCacheBlock`, `FreeKVCacheBlockQueue`, `BlockPool`
in `vllm/v1/core`): the same attribute and method names, so that the mixin which plugs a sage
policy into vLLM's pool (`sage_eviction.integrations.vllm._SageBlockPool`) plugs into this one
unchanged, and the simulator evicts with exactly the code that evicts inside vLLM.

What decides hits, as vLLM 0.32 does it (one KV cache group of full attention, no connector):

- `num_gpu_blocks` blocks, of which block 0 is taken at start as the null block: N give N-1.
- The free queue is a doubly linked list in block-id order at start. `get_new_blocks` pops its
  head; a popped block that still carries a hash leaves the prefix cache then (eviction is lazy).
- `free_blocks` takes a request's blocks tail first: the ones without a hash are put at the
  head (reused first), the cached ones appended at the tail (LRU), so a chain's tail is evicted
  before its head.
- `touch` (a prefix hit) takes a free block out of the queue; a hash may map to several blocks
  (two requests computed the same block at once): a lookup takes the first one inserted.
- `cache_full_blocks` gives a request's newly full blocks their hashes; the hashes are chained
  by parent (`chained_hashes`), so equal hashes mean equal prefixes.

Pure Python; imports nothing of vLLM.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

__all__ = ["BlockHashToBlockMap", "BlockPool", "FreeKVCacheBlockQueue", "KVCacheBlock", "chained_hashes"]


def chained_hashes(tokens: Sequence[int], block_size: int, parent: Hashable = None) -> list[Hashable]:
    """The hash of each full block of `tokens`, each chained to the one before (`parent` first).

    Python's hash of a tuple of ints does not depend on PYTHONHASHSEED, so the keys are stable
    across processes (the benchmark's workers, the integration tests' runs)."""
    out: list[Hashable] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


class KVCacheBlock:
    """One KV block: its id, how many requests hold it, its hash while it is cached, and its
    links in the free queue (None while it is not there)."""

    __slots__ = ("block_hash", "block_hash_num_tokens", "block_id", "is_null", "next_free_block",
                 "prev_free_block", "ref_cnt")  # fmt: skip

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: Hashable | None = None
        self.block_hash_num_tokens: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def reset_hash(self) -> None:
        self.block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash!r})"


class FreeKVCacheBlockQueue:
    """The free blocks in eviction order, a doubly linked list between two sentinels."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for before, after in itertools.pairwise(chain):
            before.next_free_block = after
            after.prev_free_block = before

    def popleft(self) -> KVCacheBlock:
        block = self.fake_free_list_head.next_free_block
        if block is None or block is self.fake_free_list_tail:
            raise ValueError("no free block")
        self._unlink(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks from {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        self._unlink(block)

    # The public methods never call each other (through `self`): a subclass that reports each
    # change (the sage policy's queue) then sees every change once, as over vLLM's own queue.
    def _unlink(self, block: KVCacheBlock) -> None:
        before, after = block.prev_free_block, block.next_free_block
        if before is None or after is None:
            raise RuntimeError(f"remove() called on a block not in the free queue: {block!r}")
        before.next_free_block = after
        after.prev_free_block = before
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def _link(self, blocks: list[KVCacheBlock], before: KVCacheBlock, after: KVCacheBlock) -> None:
        for block in blocks:
            block.prev_free_block = before
            before.next_free_block = block
            before = block
        before.next_free_block = after
        after.prev_free_block = before
        self.num_free_blocks += len(blocks)

    def append(self, block: KVCacheBlock) -> None:
        self._append([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        self._append(blocks)

    def _append(self, blocks: list[KVCacheBlock]) -> None:
        if blocks:
            tail = self.fake_free_list_tail
            assert tail.prev_free_block is not None
            self._link(blocks, tail.prev_free_block, tail)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        if blocks:
            head = self.fake_free_list_head
            assert head.next_free_block is not None
            self._link(blocks, head, head.next_free_block)

    def block_ids(self) -> list[int]:
        """The free blocks' ids from head (next to reuse) to tail."""
        out, block = [], self.fake_free_list_head.next_free_block
        while block is not None and block is not self.fake_free_list_tail:
            out.append(block.block_id)
            block = block.next_free_block
        return out


class BlockHashToBlockMap:
    """Hash -> the cached blocks holding it, in insertion order (a lookup takes the first)."""

    def __init__(self) -> None:
        self._cache: dict[Hashable, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: Hashable) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        return next(iter(blocks.values())) if blocks else None

    def contain(self, key: Hashable, block_id: int) -> bool:
        blocks = self._cache.get(key)
        return blocks is not None and block_id in blocks

    def insert(self, key: Hashable, block: KVCacheBlock) -> None:
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: Hashable, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """vLLM's `BlockPool` for one group of full attention (`hash_block_size` == block size).

    `evictions` counts the cached blocks that `get_new_blocks` took out of the prefix cache;
    `on_evict`, when set, is called with each one's hash (the twin's re-prefill count).
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks}: vLLM needs 2 or more (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.evictions = 0
        self.on_evict: Callable[[Hashable], None] | None = None

    def get_cached_block(self, block_hash: Hashable) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int = 0,
    ) -> None:
        """Give `blocks[num_cached_blocks:num_full_blocks]` the request's hashes of those blocks."""
        hashes = request.block_hashes
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if not block.is_null:
                self._insert_block_hash(hashes[i], block, (i + 1) * block_size)

    def _insert_block_hash(self, block_hash: Hashable, block: KVCacheBlock, num_tokens: int | None) -> None:
        if block.block_hash == block_hash or self.cached_block_hash_to_block.contain(
            block_hash, block.block_id
        ):
            return
        block.block_hash, block.block_hash_num_tokens = block_hash, num_tokens
        self.cached_block_hash_to_block.insert(block_hash, block)

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[Hashable]:
        if block.block_hash is None:
            return []
        removed = (
            [block.block_hash]
            if self.cached_block_hash_to_block.pop(block.block_hash, block.block_id)
            else []
        )
        block.reset_hash()
        return removed

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        removed = self._remove_cached_block_hashes(block)
        if removed:
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(removed[0])
        return bool(removed)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        new = self.free_block_queue.popleft_n(num_blocks)
        for block in new:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            block.ref_cnt += 1
        return new

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Release blocks in eviction priority (first evicted first): uncached ones to the head
        (reused first), cached ones to the tail."""
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                (first if block.block_hash is None or not self.enable_caching else last).append(block)
        self.free_block_queue.prepend_n(first)
        self.free_block_queue.append_n(last)

    def evict_blocks(self, block_ids: set[int]) -> None:
        for block_id in block_ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0
