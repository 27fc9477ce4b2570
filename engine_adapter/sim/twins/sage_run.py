"""The `sage` cache model: a workload through sage's own engine scheduler on the cost model's clock.

`simulate_sage` builds the `CacheManager` as the engine builds it from its defaults (the engine's
cache, the same class, over a bare block allocator of `capacity_blocks`: sage's pool has no
null block), steps `SageTwin` (`sage_sched`: the engine's admission, chunked prefill and
preemption) with `twin_clock.run_on_clock`, and returns the row with each request's hit beside
it (`TwinRun`). Held to a real sage-tiny engine request by request in tests/test_sage_twin.py.

Block keys: a request with tokens (`SimRequest.token_ids`, e.g. `chats.token_workload`) is cached
by its tokens as the engine caches it, the answer's blocks too (when `cache_generated`). A
request with block keys only (the Mooncake trace, the generated workloads) looks up and caches
its prompt's blocks by those keys; its answer's blocks are never cached (the radix model's rule).

The cache's clock is a counter that moves a microsecond at every read, so that every time the
policies and the preemption order compare is distinct and in the engine's order of calls.
"""

from __future__ import annotations

import itertools
import time

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.retention import RetentionConfig
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.twins.sage_sched import SageSchedulerConfig, SageSequence, SageTwin
from engine_adapter.sim.twins.twin_clock import UNBOUNDED, RowCounts, TwinRun, run_on_clock, twin_row
from engine_adapter.sim.workloads import Workload
from sage_eviction import get_policy_class
from sage_eviction.preemption import resolve_order

__all__ = ["make_cache", "simulate_sage"]


def make_cache(
    policy: str, num_blocks: int, block_size: int, *, cache_generated: bool = False
) -> CacheManager:
    """The engine's cache manager with the engine's defaults (`cache_generated`: the engine's
    ``--cache-generated-tokens``, off by default), on a clock of distinct ticks."""
    ticks = itertools.count()
    return CacheManager(
        BlockAllocator(num_blocks, block_size),
        policy="lru" if policy == UNBOUNDED else policy,
        record_events=False,
        clock=lambda: next(ticks) * 1e-6,
        retention=RetentionConfig(cache_generated=cache_generated),
    )


def simulate_sage(
    workload: Workload,
    policy: str = "lru",
    capacity_blocks: int | None = None,
    *,
    cost_model: CostModel | None = None,
    block_size: int | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    admission: str = "priority",
    chunked_prefill: bool = True,
    cache_generated: bool = False,
    preemption_order: str = "policy",
) -> TwinRun:
    """Run `workload` through sage's engine scheduler with a pool of `capacity_blocks` blocks.

    The keywords are the engine's settings of the same names (`SageSchedulerConfig` for
    `admission` and `chunked_prefill`, the cache manager's `preemption_order` as the engine's
    scheduler sets it); their defaults are the engine's.

    Raises:
        ValueError: No capacity, an offline policy, a block size other than the workload's,
            settings the engine refuses, or a request larger than the pool.
    """
    wall0 = time.perf_counter()
    bs = block_size or workload.block_size
    requests = workload.requests
    if bs != workload.block_size:
        raise ValueError(
            f"block size {bs}: this {workload.source} workload has blocks of {workload.block_size} tokens"
        )
    if policy == UNBOUNDED:
        capacity_blocks = sum(-(-(r.input_len + r.output_len) // bs) for r in requests) or 1
    elif get_policy_class(policy.split(":", 1)[0]).offline:
        raise ValueError(
            f"policy {policy!r} needs the future; the sage cache model runs online policies only"
        )
    if capacity_blocks is None or capacity_blocks < 1:
        raise ValueError(f"the sage cache model needs a capacity of at least 1 block, not {capacity_blocks}")
    config = SageSchedulerConfig(max_num_seqs, max_num_batched_tokens, admission, chunked_prefill)
    cache = make_cache(policy, capacity_blocks, bs, cache_generated=cache_generated)
    cache.preemption_order = resolve_order(preemption_order)  # as the engine's Scheduler does
    twin = SageTwin(cache, config)
    seqs = _sequences(workload)
    clock = run_on_clock(twin, seqs, requests, cost_model if cost_model is not None else CostModel())
    counts = RowCounts(
        hits=[s.cached_tokens or 0 for s in seqs],
        preemptions=twin.preemptions,
        evictions=cache.total_evictions,
        re_prefill_rate=cache.stats().re_prefill_rate,
        block_size=bs,
    )
    return twin_row("sage", requests, policy, capacity_blocks, clock, counts, time.perf_counter() - wall0)


def _sequences(workload: Workload) -> list[SageSequence]:
    """The twin's sequences of `workload`, numbered from 1 in arrival order as the engine's are."""
    return [
        SageSequence(
            index=i,
            seq_id=i + 1,
            prompt_len=r.input_len,
            output_len=r.output_len,
            arrival=i,
            priority=r.priority,
            token_ids=r.token_ids,
            block_keys=None if r.token_ids is not None else r.block_hashes,
        )
        for i, r in enumerate(workload.requests)
    ]
