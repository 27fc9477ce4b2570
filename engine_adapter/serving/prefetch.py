"""Scheduler-aware prefetch in the engine (issue 30, ``--prefetch``): load the host- or
disk-resident prefix of the requests at the head of the queue back into the pool while they wait
(as CachedAttention's scheduler-aware prefetch), so that their admission finds it on the device.

It must never cost the running sequences their room. An earlier wiring used the core's held
prefetch (the path locked until admission) and a 24-block pool with six requests stalled: the
queued requests' locked paths were capacity the running sequences could not reclaim. So here:

- a prefetch only takes room beyond what the running sequences need for their next step (their
  unreserved prefill and one decode token each), and only a share of it (`PREFETCH_SHARE`):
  free blocks, or cold cached ones that an allocation would evict too (a warm pool has no free
  blocks: all of it is cache), never a queued request's protected prefix;
- what it loads is left cached and evictable (`CacheManager.prefetch(hold=False)`): nothing is
  locked for a queued request, so the pool can always take the blocks back (demoted again: a
  wasted copy at worst, never a stall);
- the core's budget (`TierConfig.prefetch_blocks`) caps the blocks outstanding for queued
  requests, so blocks evicted again are not loaded again and again;
- a request that leaves the queue (abort, timeout, drop, refusal) has its prefetch cancelled.

Runs inside `Scheduler.step` after admission and reservation (the step's own blocks are taken)
and before the tier moves run, so the loads ride in the same step's copies. Imports the cache
core and this package's sequence record.
"""

from __future__ import annotations

from collections.abc import Callable

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from engine_adapter.serving.sequence import Sequence

__all__ = ["PREFETCH_HEAD", "PREFETCH_SHARE", "QueuePrefetch"]

PREFETCH_SHARE = 0.5
"""Of the room beyond the running sequences' next step, the share a step may prefetch into."""

PREFETCH_HEAD = 8
"""Queued requests (from the head, in admission order) a step prefetches for: each costs a key
lookup of its prompt, and the ones further back are admitted later than the blocks would last."""


class QueuePrefetch:
    """Each step, loose prefetches for the head of the queue within the free pool's headroom.

    Args:
        cache: The cache manager (with tiers and a prefetch budget, else every call loads 0).
        request_of: The cache request of a queued sequence (the scheduler's own).
        share: Of the headroom, the share one step may fill (0 < share <= 1).

    Attributes:
        blocks: Blocks prefetched so far (the core counts hits, per tier).
    """

    def __init__(
        self,
        cache: CacheManager,
        request_of: Callable[[Sequence], CacheRequest],
        share: float = PREFETCH_SHARE,
    ) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"prefetch share={share!r} must be in (0, 1]")
        self.cache = cache
        self.request_of = request_of
        self.share = share
        self.blocks = 0

    def headroom(self, running: list[Sequence]) -> int:
        """Free and reclaimable blocks beyond what `running` needs for its next step: each
        sequence's blocks up to its known tokens plus one (its next decode token, or the rest of
        its prefill)."""
        block_size = self.cache.block_size
        need = sum(max(0, -(-(seq.num_tokens + 1) // block_size) - len(seq.block_table)) for seq in running)
        return max(0, self.cache.num_available_blocks - need)

    def step(self, waiting: list[Sequence], running: list[Sequence]) -> int:
        """Prefetch for the head of `waiting` (in admission order) into this step's share of the
        headroom; returns blocks loaded (their moves come with the step's `take_moves`)."""
        budget = int(self.share * self.headroom(running))
        loaded = 0
        for seq in waiting[:PREFETCH_HEAD]:
            if budget <= 0:
                break
            n = self.cache.prefetch(self.request_of(seq), hold=False, limit=budget)
            budget -= n
            loaded += n
        self.blocks += loaded
        return loaded

    def cancel(self, seq: Sequence) -> None:
        """`seq` left the queue without running: forget its prefetch (its blocks stay cached and
        evictable)."""
        self.cache.cancel_prefetch(seq.seq_id)
