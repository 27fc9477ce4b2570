"""The pool of one colocation run: the engine's `CacheManager` over a `BlockAllocator`, shared
by LLM sequences and embedding workspaces, evicting by a registered policy.

- An LLM request is a sequence (its id: its index in the workload). Its prompt's block keys are
  its template's shared prefix blocks, ``(template, i)``, the same for every request of the
  template; its own blocks need no key (no other request can match them: they are never
  cached). `admit` allocates through `CacheManager.allocate` (the hit is what the radix cache
  matches, `recompute_last_token=False` as in the simulator's radix model) and commits the
  prefix's blocks at once, so that a request admitted in the same step hits them; `grow` takes
  decode blocks through `reserve_tokens`; `release` and `preempt` free its own blocks through
  `free_sequence` and `preempt`, and its prefix stays cached until the policy evicts it.
- An embedding batch is a reservation (its owner: its index): `reserve_blocks` and
  `release_reservation`.
- The LLM side's cap (its quota, or more when it borrows) is enforced against the manager's
  counts: the blocks running sequences hold (`llm_held`) never exceed it, and cached blocks
  beyond it are evicted, in the policy's order, as soon as something is allocated.
  `cap_decisions` counts the times the cap, not the pool, decided: an allocation it refused,
  or cached blocks it evicted (the run's `quota_limited`, which shows whether the quota mattered).

The calls of `lookup` and `allocate` are in `_newly_held` and `_allocate` only. Imports the
cache core and the controller's `MemoryState`.
"""

from __future__ import annotations

from collections.abc import Callable

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.colocation import MemoryState
from engine_adapter.sim.colocation.workload import LLMRequest, PoolShape

__all__ = ["ColocationPool"]

PrefixKey = tuple[int, int]
"""A template's prefix block: (template, index of the block in the prefix)."""


class ColocationPool:
    """The pool of one run (see the module docstring).

    Args:
        shape: Blocks and tokens per block.
        policy: The eviction policy's spec (a registry name, optionally ``name:k=v``).
        clock: The run's virtual clock (recency and deadlines of the cached blocks).
    """

    def __init__(self, shape: PoolShape, policy: str, clock: Callable[[], float]) -> None:
        self.total = shape.total_blocks
        self.block_size = shape.block_size
        self._allocator = BlockAllocator(shape.total_blocks, shape.block_size)
        self._manager = CacheManager(self._allocator, policy=policy, record_events=False, clock=clock)
        self._reserved = 0  # blocks of the reservations (the manager's count, kept here: O(1))
        self._prefix_keys: dict[int, tuple[PrefixKey, ...]] = {}  # template -> its prefix's keys
        self._keys: dict[int, tuple[PrefixKey, ...]] = {}  # running sequence -> its prefix keys
        self._blocks: dict[int, int] = {}  # running sequence -> blocks it holds
        self.cap_decisions = 0  # allocations the LLM cap refused, evictions it forced

    @property
    def manager(self) -> CacheManager:
        """The cache manager (for checks and stats)."""
        return self._manager

    # ------------------------------------------------------------------ counts

    @property
    def free(self) -> int:
        """Blocks on the free list."""
        return self._allocator.num_free

    @property
    def available(self) -> int:
        """Free blocks and cached blocks that eviction could reclaim now."""
        return self._manager.num_available_blocks

    @property
    def used(self) -> int:
        """Blocks off the free list: sequences', cached and reserved."""
        return self._allocator.num_used

    @property
    def embedding_used(self) -> int:
        """Blocks the embedding batches' workspaces hold."""
        return self._reserved

    @property
    def llm_used(self) -> int:
        """Blocks of the LLM side: the running sequences' and the cached ones."""
        return self._allocator.num_used - self._reserved

    @property
    def llm_held(self) -> int:
        """Blocks the running sequences hold (their own and the cached prefixes they use)."""
        return self.total - self._manager.num_available_blocks - self._reserved

    def memory(self) -> MemoryState:
        """The pool as the controller sees it: cached blocks count as the LLM side's."""
        used_llm = self.llm_used
        return MemoryState(self.total, used_llm, self._reserved, self.total - used_llm - self._reserved)

    def sequence_blocks(self, sid: int) -> int:
        """Blocks a running sequence holds (0 when it is not running)."""
        return self._blocks.get(sid, 0)

    def private_blocks(self, sid: int) -> int:
        """Blocks preempting a running sequence frees (its own, not its cached prefix)."""
        blocks = self._blocks.get(sid)
        return 0 if blocks is None else blocks - len(self._keys[sid])

    # ------------------------------------------------------------------ LLM sequences

    def admit(
        self,
        sid: int,
        request: LLMRequest,
        generated: int,
        llm_cap: int,
        deadline: Callable[[], float | None],
    ) -> int | None:
        """Allocate a request's prompt (and its `generated` tokens, re-prefilled after a
        preemption, and room for the next token) within `llm_cap`.

        Args:
            sid: Its sequence id.
            request: The request.
            generated: Tokens it generated before a preemption (0 at its first admission).
            llm_cap: Blocks the LLM side may hold.
            deadline: Gives the deadline its blocks carry, asked only when it is allocated.

        Returns:
            The prompt tokens its cached prefix serves, or None when it does not fit now
            (nothing changed).
        """
        keys = self._prefix_of(request)
        tokens = request.prompt_tokens + generated + 1
        blocks = -(-tokens // self.block_size)
        # Within the cap even if all its blocks were new and the cache all held: no count
        # needed. Else it newly holds between its blocks beyond the prefix and all of them:
        # the prefix is looked up only when the cap falls in between.
        beyond = self.llm_used + blocks > llm_cap
        if beyond:
            held = self.llm_held
            if held + blocks - len(keys) > llm_cap:
                self._count_refusal(held + blocks - len(keys))
                return None
            if held + blocks > llm_cap:
                newly = self._newly_held(sid, keys, tokens)
                if held + newly > llm_cap:
                    self._count_refusal(held + newly)
                    return None
        cached = self._allocate(sid, keys, tokens, request, deadline())
        if cached is None:
            return None
        self._manager.commit_blocks(sid, block_keys=keys)
        self._keys[sid] = keys
        self._blocks[sid] = blocks
        if beyond:
            self._evict_beyond(llm_cap)
        return cached * self.block_size

    def _count_refusal(self, llm_held_after: int) -> None:
        """The cap refused an allocation: its decision when the pool, with no cap, would have
        let the LLM side hold `llm_held_after` blocks (all but the embedding workspaces)."""
        if llm_held_after <= self.total - self._reserved:
            self.cap_decisions += 1

    def _newly_held(self, sid: int, keys: tuple[PrefixKey, ...], tokens: int) -> int:
        """Blocks an allocation would add to `llm_held`: its new blocks and the cached prefix
        blocks that no running sequence holds yet."""
        found = self._manager.lookup(
            CacheRequest(sid, num_tokens=tokens, block_keys=keys, recompute_last_token=False)
        )
        return found.num_new_blocks + self._manager.num_available_blocks - found.num_available_blocks

    def _allocate(
        self, sid: int, keys: tuple[PrefixKey, ...], tokens: int, request: LLMRequest, deadline: float | None
    ) -> int | None:
        """`CacheManager.allocate`; the cached blocks of the prefix, or None when it cannot be had."""
        try:
            allocation = self._manager.allocate(
                CacheRequest(
                    sid,
                    num_tokens=tokens,
                    block_keys=keys,
                    priority=request.priority,
                    max_tokens=request.prompt_tokens + request.max_tokens,
                    deadline=deadline,
                    recompute_last_token=False,
                )
            )
        except (NoEvictableBlocksError, RequestTooLargeError):
            return None
        return allocation.num_cached_blocks

    def grow(self, sid: int, tokens: int, llm_cap: int) -> bool:
        """Extend a running sequence to `tokens` (one block more) within `llm_cap`; False when
        it cannot be had (nothing changed)."""
        beyond = self.llm_used + 1 > llm_cap  # else within the cap whatever the cache holds
        if beyond and self.llm_held + 1 > llm_cap:
            self._count_refusal(self.llm_held + 1)
            return False
        try:
            new_ids = self._manager.reserve_tokens(sid, tokens)
        except RequestTooLargeError:
            return False
        if new_ids is None:
            return False
        self._blocks[sid] += len(new_ids)
        if beyond:
            self._evict_beyond(llm_cap)
        return True

    def release(self, sid: int) -> None:
        """A sequence finished: its own blocks are freed, its prefix stays cached."""
        self._manager.free_sequence(sid, block_keys=self._keys.pop(sid))
        del self._blocks[sid]

    def preempt(self, sid: int) -> None:
        """A sequence is preempted by recompute: as `release`, and counted by the manager."""
        self._manager.preempt(sid, block_keys=self._keys.pop(sid))
        del self._blocks[sid]

    def _prefix_of(self, request: LLMRequest) -> tuple[PrefixKey, ...]:
        """The keys of the full blocks of the request's template's prefix (built once per
        template: a template's prefix has one length)."""
        keys = self._prefix_keys.get(request.template)
        if keys is None:
            n = request.prefix_tokens // self.block_size
            keys = self._prefix_keys[request.template] = tuple((request.template, i) for i in range(n))
        return keys

    def _evict_beyond(self, llm_cap: int) -> None:
        """Cached blocks beyond the LLM side's cap give way (in the policy's order)."""
        excess = self.llm_used - llm_cap
        if excess > 0:
            self.cap_decisions += 1
            self._manager.evict(excess, reason="quota")

    # ------------------------------------------------------------------ embedding workspaces

    def reserve(self, owner: int, blocks: int) -> bool:
        """Reserve a batch's workspace, evicting cached blocks if the free list is short; False
        when free and reclaimable blocks fall short (nothing changed)."""
        try:
            if self._manager.reserve_blocks(owner, blocks) is None:
                return False
        except RequestTooLargeError:
            return False
        self._reserved += blocks
        return True

    def release_reservation(self, owner: int) -> None:
        """A batch finished: its workspace goes back to the free list."""
        self._reserved -= self._manager.release_reservation(owner)
