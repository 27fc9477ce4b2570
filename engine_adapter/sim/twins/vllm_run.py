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

import itertools
import time
from collections.abc import Hashable
from dataclasses import dataclass

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.sim_result import SimResult
from engine_adapter.sim.twins.vllm_pool import BlockPool, FreeKVCacheBlockQueue, chained_hashes
from engine_adapter.sim.twins.vllm_sched import TwinSequence, VllmSchedulerConfig, VllmTwin
from engine_adapter.sim.workloads import SimRequest, Workload
from sage_eviction import get_policy_class
from sage_eviction.metrics import jain_fairness, percentile

__all__ = ["TwinRun", "make_pool", "sequence_hashes", "simulate_vllm"]

UNBOUNDED = "unbounded"


@dataclass(frozen=True, slots=True)
class TwinRun:
    """A twin's row and what the fidelity checks compare request by request."""

    result: SimResult
    hit_tokens: list[int]  # each request's num_cached_tokens, by request index
    preemptions: int
    ttft_s: list[float]  # every request's TTFT, sorted


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
    clock = _run(twin, workload, hashes, cost)
    return _row(twin, workload, policy, capacity_blocks, clock, time.perf_counter() - wall0)


@dataclass(slots=True)
class _Clock:
    start: float = 0.0
    end: float = 0.0
    ttfts: list[float] | None = None
    tpots: list[float] | None = None
    seqs: list[TwinSequence] | None = None
    evictions0: int = 0  # the pool's evictions before the run (a pool may serve several)


def _run(twin: VllmTwin, workload: Workload, hashes: list[list[Hashable]], cost: CostModel) -> _Clock:
    """Step the twin over the arrivals; each step's time from the cost model."""
    requests = workload.requests
    seqs = [TwinSequence(i, r.input_len, r.output_len, hashes[i]) for i, r in enumerate(requests)]
    first_token: dict[int, float] = {}
    out = _Clock(requests[0].arrival_s if requests else 0.0, 0.0, [], [], seqs, twin.pool.evictions)
    now, arrived = out.start, 0
    for _ in itertools.count():
        while arrived < len(seqs) and requests[arrived].arrival_s <= now:
            twin.add(seqs[arrived])
            arrived += 1
        if not twin.has_unfinished():
            if arrived == len(seqs):
                break
            now = requests[arrived].arrival_s
            continue
        before = {id(s): s.num_output for s in twin.running}
        work, finished = twin.step()
        if not twin.running and not finished:
            seq = twin.waiting[0]
            raise ValueError(
                f"request {seq.index} ({seq.num_tokens} tokens) needs more blocks than the "
                f"{twin.config.num_gpu_blocks - 1} usable of num_gpu_blocks={twin.config.num_gpu_blocks}"
            )
        now += cost.step_time(
            prefill_tokens=work.prefill_tokens,
            prefill_batch=work.prefill_batch,
            cached_tokens=work.cached_tokens,
            decode_batch=work.decode_batch,
            context_tokens=work.context_tokens,
        )
        for seq in [*twin.running, *finished]:
            if seq.num_output and seq.index not in first_token and before.get(id(seq), 0) < seq.num_output:
                first_token[seq.index] = now
                assert out.ttfts is not None
                out.ttfts.append(now - requests[seq.index].arrival_s)
        for seq in finished:
            r = requests[seq.index]
            if r.output_len > 1:
                assert out.tpots is not None
                out.tpots.append((now - first_token[seq.index]) / (r.output_len - 1))
    out.end = now
    return out


def _row(
    twin: VllmTwin, workload: Workload, policy: str, capacity: int, clock: _Clock, wall: float
) -> TwinRun:
    """The benchmark's row of the run, over first admissions' `num_cached_tokens`."""
    requests = workload.requests
    assert clock.seqs is not None and clock.ttfts is not None and clock.tpots is not None
    hits = [max(s.num_cached_tokens, 0) for s in clock.seqs]
    bs = twin.bs
    group_hits: dict[object, list[int]] = {}
    for r, hit in zip(requests, hits, strict=True):
        counts = group_hits.setdefault(r.tenant or r.session or r.request_id, [0, 0])
        counts[0] += hit
        counts[1] += r.input_len
    looked = sum(r.input_len for r in requests)
    lookups = sum(r.input_len // bs for r in requests)
    makespan = clock.end - clock.start
    clock.ttfts.sort()
    clock.tpots.sort()
    name = UNBOUNDED if policy == UNBOUNDED else get_policy_class(policy.split(":", 1)[0]).name
    result = SimResult(
        policy=name,
        capacity_blocks=capacity,
        cache_model="vllm",
        requests=len(requests),
        block_lookups=lookups,
        block_hits=sum(h // bs for h in hits),
        hit_rate=sum(hits) / looked if looked else 0.0,
        re_prefill_rate=twin.reprefill.rate,
        fairness_score=jain_fairness([h / n for h, n in group_hits.values() if n]),
        memory_utilization=1.0 if twin.pool.evictions > clock.evictions0 else 0.0,
        evictions=twin.pool.evictions - clock.evictions0,
        eviction_p50_us=0.0,
        eviction_p99_us=0.0,
        ttft_p50_s=percentile(clock.ttfts, 0.5),
        ttft_p99_s=percentile(clock.ttfts, 0.99),
        tpot_p50_s=percentile(clock.tpots, 0.5),
        tpot_p99_s=percentile(clock.tpots, 0.99),
        throughput_tok_s=sum(r.input_len + r.output_len for r in requests) / makespan
        if makespan > 0
        else 0.0,
        throughput_impact=0.0,
        preemptions=twin.preemptions,
        wall_s=wall,
        lookups_per_s=lookups / wall if wall > 0 else 0.0,
    )
    return TwinRun(result, hits, twin.preemptions, clock.ttfts)
