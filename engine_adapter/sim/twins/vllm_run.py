"""The `vllm` cache model: a workload through the vLLM twin on the cost model's clock.

`simulate_vllm` queues each request at its arrival, steps `VllmTwin` (scheduler, KV cache
manager, block pool), prices each step with the `CostModel` (the twin decides which blocks
hit and when requests run; time is the cost model's) and returns the benchmark's row with the
per-request hits beside it (`TwinRun`).

`capacity_blocks` is vLLM's `num_gpu_blocks` (`num_gpu_blocks_override`): one of them is the
null block. ``lru`` is vLLM's own free-queue order; any other online policy runs inside the
twin's pool through the very mixin that runs it inside vLLM
(`sage_eviction.integrations.vllm.sage_block_pool_class`).

Block hashes: a request with tokens (`SimRequest.token_ids`) hashes every block it fills,
exactly as vLLM does. A request with block keys only (the Mooncake trace, the generated
workloads) has keys for its prompt's full blocks; the blocks its answer fills are keyed from
the next request of the same session when that one's prompt extends this one's (its keys at
the same positions: the next turn's prompt holds this answer, then the new message, so a
block that straddles the answer's end is keyed as if the user's message had been decoded too),
and with fresh keys that never hit otherwise. That is an approximation; with tokens it is exact.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.twins.twin_clock import UNBOUNDED, RowCounts, TwinRun, run_on_clock, twin_row
from engine_adapter.sim.twins.vllm_pool import BlockPool, FreeKVCacheBlockQueue, chained_hashes
from engine_adapter.sim.twins.vllm_sched import TwinSequence, VllmSchedulerConfig, VllmTwin
from engine_adapter.sim.workloads import SimRequest, Workload
from sage_eviction import get_policy_class

__all__ = ["TwinRun", "make_pool", "sequence_hashes", "simulate_vllm"]


def sequence_hashes(workload: Workload, block_size: int) -> list[list[Hashable]]:
    """Each request's block hashes, prompt and answer (module docstring, "Block hashes")."""
    requests = workload.requests
    if all(r.token_ids is not None for r in requests):
        return [chained_hashes(r.token_ids or (), block_size) for r in requests]
    if block_size != workload.block_size:
        raise ValueError(
            f"block size {block_size}: this {workload.source} workload has block keys of "
            f"{workload.block_size} tokens and no tokens to hash again"
        )
    next_turn: dict[int, SimRequest] = {}
    last: dict[str, int] = {}
    for i, r in enumerate(requests):
        if r.session is not None:
            if r.session in last:
                next_turn[last[r.session]] = r
            last[r.session] = i
    out = []
    for i, r in enumerate(requests):
        full = r.input_len // block_size
        keys: list[Hashable] = list(r.block_hashes[:full])
        nxt = next_turn.get(i)
        follows = nxt is not None and nxt.block_hashes[:full] == r.block_hashes[:full]
        for position in range(full, (r.input_len + r.output_len) // block_size):
            if follows and nxt is not None and position < nxt.input_len // block_size:
                keys.append(nxt.block_hashes[position])
            else:
                keys.append(("decode", r.request_id, position))  # never looked up
        out.append(keys)
    return out


def make_pool(policy: str, num_gpu_blocks: int, block_size: int) -> BlockPool:
    """A twin pool evicting with `policy`: vLLM's own order for ``lru``, else the sage mixin."""
    if policy in ("lru", UNBOUNDED):
        return BlockPool(num_gpu_blocks, True, block_size)
    from sage_eviction.integrations.vllm import sage_block_pool_class

    cls = sage_block_pool_class(BlockPool, FreeKVCacheBlockQueue, policy)
    pool: BlockPool = cls(num_gpu_blocks, True, block_size)
    return pool


def simulate_vllm(
    workload: Workload,
    policy: str = "lru",
    capacity_blocks: int | None = None,
    *,
    cost_model: CostModel | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    block_size: int | None = None,
    pool: BlockPool | None = None,
) -> TwinRun:
    """Run `workload` through the vLLM twin with `capacity_blocks` GPU blocks.

    `pool`: continue on this pool (`make_pool`; its free queue and cache as an earlier run left
    them, as an engine that serves one workload after another does) instead of a fresh one.

    Raises:
        ValueError: A capacity below 2, an offline policy, settings vLLM refuses, or a block
            size the workload cannot be hashed at.
    """
    wall0 = time.perf_counter()
    bs = block_size or workload.block_size
    hashes = sequence_hashes(workload, bs)
    if policy == UNBOUNDED:
        capacity_blocks = 1 + sum(-(-(r.input_len + r.output_len) // bs) for r in workload.requests)
    elif get_policy_class(policy.split(":", 1)[0]).offline:
        raise ValueError(
            f"policy {policy!r} needs the future; the vllm cache model runs online policies only"
        )
    if capacity_blocks is None:
        raise ValueError("the vllm cache model needs a capacity in blocks (num_gpu_blocks)")
    config = VllmSchedulerConfig(capacity_blocks, bs, max_num_seqs, max_num_batched_tokens)
    config.check()
    twin = VllmTwin(config, pool if pool is not None else make_pool(policy, capacity_blocks, bs))
    cost = cost_model if cost_model is not None else CostModel()
    return _run(twin, workload, hashes, cost, policy, wall0)


def _run(
    twin: VllmTwin,
    workload: Workload,
    hashes: list[list[Hashable]],
    cost: CostModel,
    policy: str,
    wall0: float,
) -> TwinRun:
    """Step the twin over the arrivals; the row over each request's `num_cached_tokens`."""
    requests = workload.requests
    seqs = [TwinSequence(i, r.input_len, r.output_len, hashes[i]) for i, r in enumerate(requests)]
    evictions0 = twin.pool.evictions  # a pool may serve several runs
    clock = run_on_clock(twin, seqs, requests, cost)
    counts = RowCounts(
        hits=[max(s.num_cached_tokens, 0) for s in seqs],
        preemptions=twin.preemptions,
        evictions=twin.pool.evictions - evictions0,
        re_prefill_rate=twin.reprefill.rate,
        block_size=twin.bs,
    )
    wall = time.perf_counter() - wall0
    return twin_row("vllm", requests, policy, twin.config.num_gpu_blocks, clock, counts, wall)
