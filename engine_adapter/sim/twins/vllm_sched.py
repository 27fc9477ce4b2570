"""vLLM v1's scheduler and KV cache manager where they decide hits, over the twin block pool.

`VllmTwin` steps a workload as vLLM's `Scheduler.schedule` does (0.32, synchronous scheduling,
one group of full attention, no connector, no speculative decoding), so each request's
`num_cached_tokens` comes out as vLLM reports it:

1. The running requests, in order, each get the tokens they still need (the rest of a chunked
   prefill, or one decode token) within `max_num_batched_tokens`. When the pool cannot give a
   request its slots, the newest running request is preempted (its blocks freed tail first,
   its progress dropped: recompute) and put at the head of the queue, until the request fits
   or is itself the one preempted.
2. Only when nothing was preempted in the step, the queue is admitted in order while fewer
   than `max_num_seqs` run and tokens are left: a request that has computed nothing looks up
   its prefix (at most ``(num_tokens - 1) // block_size`` blocks: the last token is always
   computed), is admitted only when the blocks of its whole sequence so far fit in the free
   blocks (`scheduler_reserve_full_isl`; a hit on a free block counts, as touching takes it
   out of the free queue), and prefills what the budget leaves (chunked prefill).
   The first admission's hit is the request's `num_cached_tokens`; a re-admission after a
   preemption hits too (its own blocks, its output included) but reports nothing.
3. The step runs: every scheduled request computes its tokens; one whose tokens are all
   computed samples the next token, and finishes (blocks freed tail first) at `max_tokens`.

Blocks are hashed as they fill, decode tokens included (`TwinSequence.block_hashes`), so the
next turn of a chat hits on the previous answer.

Pure Python; the timing of each step is the simulator's `CostModel`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from engine_adapter.sim.twins.vllm_pool import BlockPool, KVCacheBlock
from sage_eviction.metrics import ReprefillTracker

__all__ = ["StepWork", "TwinSequence", "VllmSchedulerConfig", "VllmTwin"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class VllmSchedulerConfig:
    """The engine settings that change which blocks hit (vLLM's names)."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True

    def check(self) -> None:
        """Raises ValueError (one line) for settings vLLM would refuse."""
        if self.num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks={self.num_gpu_blocks}: vLLM needs 2 or more (one is the null block)"
            )
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class TwinSequence:
    """One request in the twin: its tokens' block hashes and vLLM's per-request state."""

    __slots__ = ("block_hashes", "blocks", "index", "max_tokens", "num_cached_block", "num_cached_tokens",
                 "num_computed_tokens", "num_output", "num_preemptions", "prompt_len")  # fmt: skip

    def __init__(
        self, index: int, prompt_len: int, max_tokens: int, block_hashes: Sequence[Hashable]
    ) -> None:
        self.index = index
        self.prompt_len = prompt_len
        self.max_tokens = max(1, max_tokens)
        # Hashes of every block the request fills, prompt and output: vLLM hashes a block once
        # all its tokens exist; `allocate_slots` never reads past `num_tokens // block_size`.
        self.block_hashes = block_hashes
        self.blocks: list[KVCacheBlock] = []
        self.num_cached_block = 0
        self.num_computed_tokens = 0
        self.num_output = 0
        self.num_preemptions = 0
        self.num_cached_tokens = -1  # set at its first scheduling

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output


@dataclass(slots=True)
class StepWork:
    """What one step computes, for the cost model: the prefilling requests' new and cached
    tokens, and the decoding requests with the KV they read."""

    prefill_tokens: int = 0
    prefill_batch: int = 0
    cached_tokens: int = 0
    decode_batch: int = 0
    context_tokens: int = 0
    preempted: int = 0


class VllmTwin:
    """The scheduler and KV cache manager over a `BlockPool` (vLLM's own or one with a sage policy).

    `add` queues a request; `step` schedules and runs one engine step and returns its work and
    the requests that finished; `has_unfinished` says whether anything is left.
    """

    def __init__(self, config: VllmSchedulerConfig, pool: BlockPool) -> None:
        config.check()
        self.config = config
        self.pool = pool
        self.bs = config.block_size
        self.waiting: deque[TwinSequence] = deque()
        self.running: list[TwinSequence] = []
        self.preemptions = 0
        # Evicted blocks that a later lookup misses and recomputes, as the radix model counts them.
        self.reprefill = ReprefillTracker(None)  # a simulator row's: the whole run
        pool.on_evict = self.reprefill.on_evict

    def add(self, seq: TwinSequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the KV cache manager -------------------------------------------------------------

    def _computed_blocks(self, seq: TwinSequence) -> list[KVCacheBlock]:
        """The longest cached prefix, at most ``(num_tokens - 1) // block_size`` blocks."""
        if not self.config.enable_prefix_caching:
            return []
        hit: list[KVCacheBlock] = []
        for block_hash in seq.block_hashes[: (seq.num_tokens - 1) // self.bs]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def _blocks_needed(self, seq: TwinSequence, num_tokens: int, hit: list[KVCacheBlock]) -> int:
        """Free blocks that `num_tokens` slots take: new blocks, and the hit blocks touching
        takes out of the free queue."""
        new = max(_cdiv(num_tokens, self.bs) - len(hit) - len(seq.blocks), 0)
        return new + sum(1 for block in hit if block.ref_cnt == 0 and not block.is_null)

    def _allocate_slots(self, seq: TwinSequence, num_new: int, hit: list[KVCacheBlock], whole: bool) -> bool:
        """Slots for `num_new` more tokens (after the `hit` blocks); False when they do not fit.
        `whole`: the blocks of the whole sequence so far must fit too (admission)."""
        free = self.pool.get_num_free_blocks()
        if whole and self._blocks_needed(seq, seq.num_tokens, hit) > free:
            return False
        computed = seq.num_computed_tokens + len(hit) * self.bs
        if self._blocks_needed(seq, computed + num_new, hit) > free:
            return False
        if hit:
            self.pool.touch(hit)
            seq.blocks.extend(hit)
        more = _cdiv(computed + num_new, self.bs) - len(seq.blocks)
        if more > 0:
            seq.blocks.extend(self.pool.get_new_blocks(more))
        if self.config.enable_prefix_caching:
            full = min(computed + num_new, seq.num_tokens) // self.bs
            if full > seq.num_cached_block:
                self.pool.cache_full_blocks(seq, seq.blocks, seq.num_cached_block, full, self.bs, 0)
                seq.num_cached_block = full
        return True

    def _free(self, seq: TwinSequence) -> None:
        blocks, seq.blocks, seq.num_cached_block = seq.blocks, [], 0
        self.pool.free_blocks(reversed(blocks))

    # ---- the scheduler ----------------------------------------------------------------------

    def _preempt(self, seq: TwinSequence) -> None:
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _schedule_running(self, scheduled: dict[TwinSequence, int], budget: int) -> tuple[int, int]:
        """Step 1 of `schedule`; returns the budget left and the requests preempted."""
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            fitted = False
            while not fitted:
                fitted = self._allocate_slots(seq, num_new, [], whole=False)
                if fitted:
                    break
                victim = self.running.pop()
                scheduled.pop(victim, None)
                self._preempt(victim)
                preempted += 1
                if victim is seq:
                    break
            if not fitted:
                break
            scheduled[seq] = num_new
            budget -= num_new
            i += 1
        return budget, preempted

    def _schedule_waiting(self, scheduled: dict[TwinSequence, int], budget: int) -> None:
        """Step 2 of `schedule`: admissions in queue order."""
        while budget > 0 and self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hit = self._computed_blocks(seq) if seq.num_computed_tokens == 0 else []
            computed = seq.num_computed_tokens + len(hit) * self.bs
            num_new = seq.num_tokens - computed
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            if not self._allocate_slots(seq, num_new, hit, whole=True):
                break
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = computed
            self.reprefill.on_requests(seq.block_hashes[len(hit) : (seq.num_tokens - 1) // self.bs])
            self.waiting.popleft()
            self.running.append(seq)
            seq.num_computed_tokens = computed
            scheduled[seq] = num_new
            budget -= num_new

    def stuck(self) -> str:
        """Why nothing runs: the queue's head needs more blocks than the pool has."""
        seq = self.waiting[0]
        return (
            f"request {seq.index} ({seq.num_tokens} tokens) needs more blocks than the "
            f"{self.config.num_gpu_blocks - 1} usable of num_gpu_blocks={self.config.num_gpu_blocks}"
        )

    def step(self) -> tuple[StepWork, list[TwinSequence]]:
        """One engine step: schedule, then run it; returns its work and the finished requests."""
        scheduled: dict[TwinSequence, int] = {}
        budget, preempted = self._schedule_running(scheduled, self.config.max_num_batched_tokens)
        if not preempted:
            self._schedule_waiting(scheduled, budget)
        work = StepWork(preempted=preempted)
        finished: list[TwinSequence] = []
        for seq, num_new in scheduled.items():
            if seq.num_computed_tokens < seq.num_tokens - 1 or num_new > 1:  # a (chunk of) prefill
                work.prefill_tokens += num_new
                work.prefill_batch += 1
                work.cached_tokens += seq.num_computed_tokens
            else:
                work.decode_batch += 1
                work.context_tokens += seq.num_computed_tokens
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens >= seq.num_tokens:  # all computed: it samples a token
                seq.num_output += 1
                if seq.num_output >= seq.max_tokens:
                    self.running.remove(seq)
                    self._free(seq)
                    finished.append(seq)
        return work, finished
