"""The trace-driven simulator: a workload through a cache model and a policy on a virtual clock.

One `Simulator` runs one workload against one policy at one capacity and returns a `SimResult`
(the benchmark's row). The clock jumps from event to event (arrivals, step ends, completions,
the decode steps at which a sequence needs a new block), never token by token.

Serving model (continuous batching, iteration level, as docs/architecture.md, "Engine"):

- Waiting requests are admitted in arrival order (first come, first served; the head of the
  queue blocks the ones behind it) at the start of a step, while fewer than `max_running` run,
  the step's prefill tokens stay under `max_prefill_tokens` (the first admission always fits)
  and the cache can give the request its blocks.
- A step runs the prefill of the admitted requests' uncached tokens, which yields their first
  token, and one decode token for every other running request; its duration is the
  `CostModel`'s `step_time`. Between events the decode-only steps are advanced in one go.
- A request of `output_len` tokens finishes `output_len - 1` decode steps after its prefill.
  TTFT = end of its prefill step - arrival; TPOT = (finish - first token) / (output_len - 1).

Cache models (docs/architecture.md, "Simulator"):

- `radix` (the real one): a `CacheManager` over a `BlockAllocator` of `capacity` blocks that also
  holds the running sequences' blocks. A request's prompt blocks are its `block_hashes` given as
  block keys (a Mooncake request's last, partial block counts as a block); its hit stops at the
  first missing block; its missed prompt blocks enter the radix tree when it is admitted
  (locked while it runs), its decode blocks are reserved one by one as it grows into them and
  freed when it finishes (they are not reusable). Only leaves are evicted. When decode cannot
  get a block, the policy's `select_victims` picks a running sequence to preempt by recompute
  (its blocks stay cached; it goes back to the head of the queue and re-prefills). Every policy,
  the unbounded reference too, runs through the same `CacheManager` the engine uses.
  With `protect_queued`, a request's cached prefix is protected from eviction from the moment it
  is queued (and when a preempted sequence goes back to the queue) until it is admitted
  (`CacheManager.protect_queued_prefix`; the blocks carry the radix features of `EntryMeta`,
  the workload's session as `conversation`). A plain `run` whose policy has a kind in C runs in
  one compiled call (`engine_adapter.sim.radix_run`, `event_loop` "compiled"): the same row.
- `sglang`: SGLang's own radix cache, queue order and retraction
  (`engine_adapter.sim.twins.sglang_model`): one page per block, SGLang's eviction strategies or
  a sage policy plugged in, a hit stops one token short of the prompt, a retracted request goes to
  the back of the queue; held to SGLang's own classes (tests_integration/sglang/). Its ``lpm`` and
  ``dfs-weight`` orders admit by what is cached: there the unbounded row is no strict bound.
- `flat`: blocks independent, a cache of `capacity` blocks with forced admission, exactly
  `sage_eviction.flat.FlatCache` (the model libCacheSim simulates), looked up block by block in
  arrival order; the running sequences' memory is not modelled. A plain `run` whose flat cache
  keeps its policy's state in C runs this loop in one compiled call (`engine_adapter.sim.flat_run`,
  `event_loop` "compiled"): the same row.

Belady: in the flat model, `BeladyPolicy` with the whole lookup sequence as its future, which
is libCacheSim's Belady. In the radix model, `RadixBelady`: an evictable leaf's next use is the
position of its key's next lookup in the arrival-ordered block lookup sequence, counted from the
request being served when the block was last inserted or hit; leaf-only (a reference, no optimum).

Reference rows (what each one bounds):

- Every row is scored on the same lookup sequence: each request's *first* admission, and first
  admissions happen in arrival order in every row (FCFS; only a preempted sequence jumps the
  queue, and it has been admitted before; SGLang's cache-aware orders excepted). A re-admission
  after preemption is re-prefill: its uncached tokens cost step time (TTFT, TPOT, throughput,
  `preemptions`) but it is no lookup, so a sequence finding its own blocks cached is no hit.
- `unbounded` is an upper bound of every row's `hit_rate` and `block_hits`, in both cache models:
  at a request's first admission a bounded cache holds a subset of the blocks of the requests
  admitted before it, which the unbounded cache holds all of, and a hit is the longest cached
  prefix (radix) or the cached blocks (flat).
- `belady` bounds the online policies in the flat model (forced-admission MIN is optimal over
  independent blocks; the generated workloads hash full blocks only). In the radix model it is
  no bound: the leaf-only constraint, the locked blocks of running sequences and preemption
  victims chosen differently per row let an online policy beat it now and then (seen on
  generated workloads with concurrent requests and preemptions; never when requests run one at
  a time).

Metrics: one definition, docs/architecture.md, "Metrics" (`block_lookups` is the workload's
block lookups in every row). Eviction times are wall time and include the interpreter: compare
them between rows of one run.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import time
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.cache_model_kinds import COMPILED, cache_model_for
from engine_adapter.sim.cache_models import FlatModel, RadixModel
from engine_adapter.sim.capacity import checked_capacity, min_capacity
from engine_adapter.sim.contract_model import contract_figures
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.decode_steps import (
    decode_time,
    grow_decoding,
    reserve_each,
    steps_to_next,
    steps_until,
)
from engine_adapter.sim.model_names import EVENT_LOOP_MODELS
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.run_state import RunRequests, RunState, SimResult, StepAdmission, run_requests
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.twins.sglang_model import SGLangModel
from engine_adapter.sim.workloads import SimRequest, Workload, any_tenant, request_ends
from sage_eviction.metrics import jain_fairness, percentile

__all__ = [
    "CACHE_MODELS",
    "UNBOUNDED",
    "SimResult",
    "Simulator",
    "min_capacity",
    "simulate",
]

CACHE_MODELS = EVENT_LOOP_MODELS
"""The cache models `Simulator` runs (`cache_model_kinds`; the twins run on their own)."""
UNBOUNDED = "unbounded"
"""The reference row's policy name: a cache that never evicts."""

_PREFETCH_AHEAD = 4
"""Queued requests (from the head) a step prefetches for, with KV tiers and a prefetch budget."""


class Simulator:
    """One workload through one cache model and policy at one capacity.

    Args:
        workload: The request stream.
        policy: Policy spec (``"lru"``, ``"slru:protected_threshold=3"``, ``"belady"``), or
            ``"unbounded"``: a cache that holds everything and never evicts (the capacity is then
            the workload's distinct blocks and the radix pool grows by the decode blocks).
        capacity_blocks: Cache size in blocks (ignored for ``"unbounded"``).
        cache_model: ``"radix"``, ``"flat"`` or ``"sglang"`` (SGLang's radix cache and retraction,
            `engine_adapter.sim.twins.sglang_model`; `policy` is then an SGLang eviction strategy, or
            ``sage-<spec>``, a sage policy plugged into SGLang).
        cost_model: Step times; `CostModel()` when None.
        max_running: Most requests running at once.
        max_prefill_tokens: Prompt tokens one step prefills (one longer prompt runs alone).
        progress: Called with the number of requests finished so far, every `progress_every`.
        progress_every: Requests between `progress` calls.
        protect_queued: Radix model: fraction of the pool that queued requests' cached prefixes
            may hold protected from eviction until they run (`CacheManager.protect_queued_prefix`);
            0 turns it off.
        adaptive_batch: The running limit starts at `max_running` and follows the re-prefill
            rate as in the engine (`engine_adapter.cache.adaptive_batch`); radix model only.
        compiled: Radix model: the cache's hot paths compiled or in pure Python (`CacheManager`'s
            `compiled`); None picks the compiled core when it is built. Same rows either way.
        tiers: Radix model: host (and disk) tiers under the device pool of `capacity_blocks`
            (capacities in blocks; docs/architecture.md, "Tiers"); loads are priced by the cost
            model's links; with a prefetch budget each step loads ahead for the head of the queue,
            hidden behind its compute up to its length. Ignored by ``"unbounded"``.
        compress_on_evict: Radix model: ``PRESS:RATIO`` compresses evicted chains (None: off).
        schedule_policy: The sglang model: SGLang's queue order (``fcfs``, ``lpm``,
            ``dfs-weight``; `engine_adapter.sim.twins.sglang_queue`); the others admit ``fcfs``.
        preemption_order: Radix model: which running request the scheduler preempts first, a
            name in `sage_eviction.preemption.ORDERS`, or ``"policy"``: the policy's own.

    Raises:
        ValueError: An unknown cache model, a capacity below 1 or, in the radix model, below
            what the largest request needs (`min_capacity`).
    """

    def __init__(
        self,
        workload: Workload,
        policy: str = "lru",
        capacity_blocks: int | None = None,
        *,
        cache_model: str = "radix",
        cost_model: CostModel | None = None,
        max_running: int = 256,
        max_prefill_tokens: int = 16384,
        progress: Callable[[int], None] | None = None,
        progress_every: int = 1000,
        protect_queued: float = 0.0,
        adaptive_batch: bool = False,
        compiled: bool | None = None,
        tiers: TierConfig | None = None,
        compress_on_evict: str | None = None,
        schedule_policy: str = "fcfs",
        preemption_order: str = "policy",
    ) -> None:
        if max_running < 1 or max_prefill_tokens < 1:
            raise ValueError("max_running and max_prefill_tokens must be positive")
        self.model = cache_model_for(
            cache_model,
            protect_queued=protect_queued,
            adaptive_batch=adaptive_batch,
            compiled=compiled,
            tiers=tiers,
            compress_on_evict=compress_on_evict,
            schedule_policy=schedule_policy,
            preemption_order=preemption_order,
        )
        self.protect_queued = protect_queued  # the loop's queue protection (the radix model's option)
        self.workload = workload
        self.block_size = workload.block_size
        self.cache_model = cache_model
        self.cost = cost_model if cost_model is not None else CostModel()
        self.max_running = max_running
        self.adaptive_batch = adaptive_batch
        self.adaptive: AdaptiveBatch | None = None
        self.ttft_s: list[float] = []  # every request's TTFT after `run`, sorted (the plot's CDF)
        self.horizon: float | None = None  # a fleet's next arrival (`advance`); None alone
        self.event_loop = "python"  # "compiled" after a `run` in a compiled loop (flat_run, radix_run)
        self.python_because: str | None = None  # why a `run` did not: `CacheModelKind.run_compiled`
        self.max_prefill_tokens = max_prefill_tokens
        self.progress = progress
        self.progress_every = max(1, progress_every)
        self.unbounded = policy == UNBOUNDED
        self.tiers = tiers if tiers is not None and tiers.enabled and not self.unbounded else None
        self.prefetch = self.tiers is not None and self.tiers.prefetch_blocks > 0
        self.policy_spec = "lru" if self.unbounded else policy
        self.capacity = checked_capacity(workload, self.model.holds_running, self.unbounded, capacity_blocks)
        self.policy_name = UNBOUNDED if self.unbounded else self.model.policy_name(policy)
        group_by_tenant = any_tenant(workload.requests)
        self._group_of: Callable[[SimRequest], Hashable] = (
            (lambda r: r.tenant) if group_by_tenant else (lambda r: r.session)
        )

    def _now(self) -> float:
        return self._clock

    @property
    def loop_label(self) -> str:
        """How the last `run` ran, for its row: "compiled", or "python (why)"."""
        return COMPILED if self.python_because is None else f"python ({self.python_because})"

    # ------------------------------------------------------------------ the run

    def run(self) -> SimResult:
        """Simulate the whole workload; returns the row. The cyclic garbage collector is paused:
        the records hold no cycles, and full collections over a few hundred thousand cached
        blocks would otherwise take a good part of the time."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> SimResult:
        wall0 = time.perf_counter()
        st = self.start_run()
        # a flat or radix row in one compiled call, where it can
        self.python_because = self.model.run_compiled(self, st)
        if self.python_because is None:
            self.event_loop = COMPILED
        else:
            self.advance(st, math.inf)
        if self.progress is not None and st.finished % self.progress_every:
            self.progress(st.finished)
        self._clock = st.clock
        return self.row(st, time.perf_counter() - wall0)

    def advance(self, st: RunState, until: float) -> None:
        """Run the steps that start before `until` (all of them with ``math.inf``).

        A fleet (`engine_adapter.sim.fleet`) drives each replica so, to each arrival in turn on a
        shared clock, routes the request, appends it to one replica's `st.requests`, and goes on;
        `horizon` (the fleet's next arrival) bounds decode-only stretches as an own arrival does,
        so that one replica behind any router runs exactly the plain run."""
        while st.clock < until:
            self._arrive(st)
            if not st.running and not st.waiting:
                if st.next_arrival >= len(st.requests):
                    break
                st.clock = st.arrival_s(st.next_arrival)
                continue
            batch = self._admit(st)
            if self.prefetch:
                batch.prefetch_s = self._prefetch(st)
            preempted_now = self._grow_decoding(st, batch.admitted)
            if not batch.admitted and not st.decoding:
                if preempted_now or (not st.running and not st.waiting):
                    continue  # a preemption freed blocks: admit again before time moves
                raise RuntimeError(
                    "the simulation is stuck: nothing runs and the queue head cannot be admitted"
                )
            before = st.step
            end_step = self._run_steps(st, batch)
            self._finish(st, end_step)
            if self.adaptive is not None and isinstance(st.cache, RadixModel):
                manager = st.cache.manager
                self.adaptive.observe(manager.total_evictions, manager.re_prefill_blocks, st.step - before)

    # ------------------------------------------------------------------ the steps of a run

    def start_run(self, requests: RunRequests | None = None) -> RunState:
        """The cache model and the empty queues; every request's blocks as one lookup sequence
        (`requests`: a fleet replica's, appended as they are routed; no future for Belady)."""
        requests = run_requests(self.workload.requests) if requests is None else requests
        ends = request_ends(requests)  # no list of keys
        self._clock = 0.0
        self.adaptive = AdaptiveBatch(self.max_running) if self.adaptive_batch else None
        model = self.model.build(self, requests)
        cache, flat = (None, model) if isinstance(model, FlatModel) else (model, None)
        first_arrival = requests[0].arrival_s if requests else 0.0
        st = RunState(requests, ends, cache, flat, clock=first_arrival, first_arrival=first_arrival)
        if (
            isinstance(requests, RequestTable)
            and not isinstance(cache, SGLangModel)
            and not self.protect_queued
        ):
            st.queue_window = self.max_running + _PREFETCH_AHEAD + 1  # more than a step admits
        return st

    def _arrive(self, st: RunState) -> None:
        """Queue the requests that have arrived by now."""
        protect = st.cache.protect if isinstance(st.cache, RadixModel) and self.protect_queued > 0 else None
        for seq in st.queue_arrivals(self.block_size, self._group_of):
            if protect is not None:
                self._clock = st.clock
                protect(seq)

    def _admit(self, st: RunState) -> StepAdmission:
        """Admission at the start of a step, first come first served, within the running and
        prefill limits; each admitted request's lookup is counted."""
        bs = self.block_size
        batch = StepAdmission()
        limit = self.adaptive.current if self.adaptive is not None else self.max_running
        if isinstance(st.cache, SGLangModel):
            st.cache.order_waiting(st.waiting, len(st.running) < limit)
        while st.waiting and len(st.running) < limit and batch.prefill_tokens < self.max_prefill_tokens:
            seq = st.waiting[0]
            r = seq.request
            if st.cache is not None:
                self._clock = st.clock
                hit = st.cache.allocate(seq)
                if hit is None:
                    break
                hit_blocks = hit
                served = min(hit_blocks * bs, r.input_len)
                host, disk = st.cache.loaded.host_blocks, st.cache.loaded.disk_blocks
                batch.host_tokens += host * bs
                batch.disk_tokens += disk * bs
                if seq.epoch == 0:
                    st.host_hits += host
                    st.disk_hits += disk
            else:
                assert st.flat is not None
                found = st.flat.lookup(seq.keys, r.input_len, bs)
                hit_blocks, served = found.hit_blocks, found.served_tokens
            st.waiting.popleft()
            if seq.epoch == 0:  # a re-admission after preemption is re-prefill, not a lookup
                self._count_lookup(st, seq, hit_blocks, served)
            batch.prefill_tokens += r.input_len + seq.decoded - served
            batch.cached_tokens += served
            batch.prefill_batch += 1
            st.running[seq.sid] = seq
            batch.admitted.append(seq)
        return batch

    @staticmethod
    def _count_lookup(st: RunState, seq: SimSequence, hit_blocks: int, served: int) -> None:
        """Count a request's first admission (only that: every row then scores the same lookup
        sequence, module docstring, "Reference rows") in the hit rate and its group's hits."""
        r = seq.request
        st.block_lookups += len(seq.keys)
        st.block_hits += hit_blocks
        st.tokens_looked_up += r.input_len
        st.tokens_hit += served
        counts = st.group_hits.get(seq.group)
        if counts is None:
            st.group_hits[seq.group] = [served, r.input_len]
        else:
            counts[0] += served
            counts[1] += r.input_len

    def _grow_decoding(self, st: RunState, admitted: list[SimSequence]) -> bool:
        """Decoding sequences that need a new block in this step get it first (radix), preempting
        others by the policy's choice when the pool is short; True when anything was preempted
        (`decode_steps.grow_decoding`: the step's needs in one call to the cache model)."""
        cache = st.cache
        if cache is None:  # the flat model: no block needs
            return False
        many = cache.reserve_many if isinstance(cache, RadixModel) else partial(reserve_each, cache.reserve)
        exclude = [a.sid for a in admitted]
        self._clock = st.clock  # the evictions' and preemptions' time (the step's start)
        return grow_decoding(
            st.needs, st.running, st.step, self.block_size, cache, many, exclude, partial(self._preempt, st)
        )

    def _preempt(self, st: RunState, seq: SimSequence) -> None:
        """Preempt a decoding sequence by recompute: back to the head of the queue (SGLang's
        model: to its back, as SGLang queues a retracted request)."""
        assert st.cache is not None
        del st.running[seq.sid]
        self._stop_decoding(st, seq)
        st.cache.preempt(seq)
        seq.decoded += st.step - seq.start_step  # its prefill token and the decode steps before now
        seq.tokens = seq.prompt_tokens + seq.decoded
        seq.epoch += 1
        requeue = st.waiting.append if isinstance(st.cache, SGLangModel) else st.waiting.appendleft
        requeue(seq)
        if self.protect_queued > 0 and isinstance(st.cache, RadixModel):
            st.cache.protect(seq)

    @staticmethod
    def _stop_decoding(st: RunState, seq: SimSequence) -> None:
        if seq.request.output_len - seq.decoded > 1:
            st.decoding -= 1
            st.context_sum -= seq.context_base

    def _run_steps(self, st: RunState, batch: StepAdmission) -> int:
        """One step when something was admitted, else decode-only steps up to the next event;
        advances the clock and returns the last step run."""
        step = st.step
        if batch.admitted:
            k = 1
            duration = self.cost.step_time(
                prefill_tokens=batch.prefill_tokens,
                prefill_batch=batch.prefill_batch,
                cached_tokens=batch.cached_tokens,
                decode_batch=st.decoding,
                context_tokens=st.context_sum + st.decoding * step,
            )
            if batch.host_tokens or batch.disk_tokens:
                duration += self._load_cost(st, batch)
            duration = max(duration, batch.prefetch_s)
        else:
            k = steps_to_next(st.finishes, st.needs, st.running, step)
            if not st.waiting:
                arrival = (
                    st.arrival_s(st.next_arrival) if st.next_arrival < len(st.requests) else self.horizon
                )
                if arrival is not None:
                    k = steps_until(self.cost, arrival, st.clock, st.decoding, st.context_sum, step, k)
            duration = max(decode_time(self.cost, st.decoding, st.context_sum, step, k), batch.prefetch_s)
        st.clock += duration
        for seq in batch.admitted:
            self._start_decoding(st, seq, step)
        st.step = step + k
        return step + k - 1

    def _prefetch(self, st: RunState) -> float:
        """Prefetch for the head of the queue (a few requests, within the budget): the loads'
        seconds, which the step's compute hides up to its own length."""
        assert isinstance(st.cache, RadixModel)  # tiers are the radix model's
        self._clock = st.clock
        host = disk = 0
        for seq in itertools.islice(st.waiting, _PREFETCH_AHEAD):
            loads = st.cache.prefetch(seq)
            host, disk = host + loads.host_blocks, disk + loads.disk_blocks
        return self.cost.load_time(host * self.block_size, disk * self.block_size)

    def _load_cost(self, st: RunState, batch: StepAdmission) -> float:
        """The step's loads from the KV tiers (run before its forward), and what prefilling the
        same blocks again would have cost instead (`recompute_s`)."""
        cost = self.cost
        load = cost.load_time(batch.host_tokens, batch.disk_tokens)
        loaded = batch.host_tokens + batch.disk_tokens
        n = batch.prefill_batch
        tokens, cached = batch.prefill_tokens, batch.cached_tokens
        st.recompute_s += cost.prefill_time(tokens + loaded, n, cached - loaded) - cost.prefill_time(
            tokens, n, cached
        )
        st.load_s += load
        return load

    def _start_decoding(self, st: RunState, seq: SimSequence, step: int) -> None:
        """An admitted sequence got its first token at this step: schedule its finish and, in the
        radix model, the first step at which it needs a new block."""
        if seq.first_token_s is None:
            seq.first_token_s = st.clock
            st.ttfts.append(st.clock - seq.request.arrival_s)
        seq.start_step = step
        seq.context_base = seq.tokens - step
        remaining = seq.request.output_len - seq.decoded
        last = step + max(remaining, 1) - 1
        heapq.heappush(st.finishes, (last, seq.sid, seq.epoch))
        if remaining > 1:
            st.decoding += 1
            st.context_sum += seq.context_base
            if st.cache is not None:
                # After decode step j it holds tokens + j tokens; the first j that spills:
                first = step + ((1 - seq.tokens) % self.block_size or self.block_size)
                if first <= last:
                    heapq.heappush(st.needs, (first, seq.sid, seq.epoch))

    def _finish(self, st: RunState, end_step: int) -> None:
        """Completions at the end of the steps just run: free their blocks, count their times."""
        while st.finishes and st.finishes[0][0] <= end_step:
            _, sid, epoch = heapq.heappop(st.finishes)
            seq = st.running.get(sid)
            if seq is None or seq.epoch != epoch:
                continue
            del st.running[sid]
            self._stop_decoding(st, seq)
            r = seq.request
            if st.cache is not None:
                self._clock = st.clock
                st.cache.free(seq)
            if r.output_len > 1 and seq.first_token_s is not None:
                st.tpots.append((st.clock - seq.first_token_s) / (r.output_len - 1))
            st.total_tokens += r.input_len + r.output_len
            st.finished += 1
            if self.progress is not None and st.finished % self.progress_every == 0:
                self.progress(st.finished)

    def row(self, st: RunState, wall: float) -> SimResult:
        """The run's figures (docs/architecture.md, "Metrics")."""
        st.ttfts.sort()
        self.ttft_s = st.ttfts
        st.tpots.sort()
        makespan = st.clock - st.first_arrival
        model = st.cache if st.cache is not None else st.flat
        assert model is not None
        self.policy_calls: str = model.policy_calls  # the run block's: how the policy was called
        stats = model.stats()
        rates = [hits / looked for hits, looked in st.group_hits.values() if looked]
        lookups = st.block_lookups or 1
        tiers = self.tiers
        return SimResult(
            policy=self.policy_name,
            capacity_blocks=self.capacity,
            cache_model=self.cache_model,
            requests=st.finished,
            block_lookups=st.block_lookups,
            block_hits=st.block_hits,
            hit_rate=st.tokens_hit / st.tokens_looked_up if st.tokens_looked_up else 0.0,
            re_prefill_rate=stats.re_prefill_rate,
            fairness_score=jain_fairness(rates),
            memory_utilization=stats.memory_utilization,
            evictions=stats.evictions,
            eviction_p50_us=stats.eviction_p50_us,
            eviction_p99_us=stats.eviction_p99_us,
            ttft_p50_s=percentile(st.ttfts, 0.5),
            ttft_p99_s=percentile(st.ttfts, 0.99),
            tpot_p50_s=percentile(st.tpots, 0.5),
            tpot_p99_s=percentile(st.tpots, 0.99),
            throughput_tok_s=st.total_tokens / makespan if makespan > 0 else 0.0,
            throughput_impact=0.0,
            preemptions=stats.preemptions,
            wall_s=wall,
            lookups_per_s=st.block_lookups / wall if wall > 0 else 0.0,
            adaptive_batch=self.adaptive is not None,
            batch_changes=0 if self.adaptive is None else self.adaptive.shrinks + self.adaptive.grows,
            host_policy=None if tiers is None else tiers.host_policy,
            host_capacity_blocks=0 if tiers is None else tiers.host_blocks,
            disk_capacity_blocks=0 if tiers is None else tiers.disk_blocks,
            device_hit_ratio=(st.block_hits - st.host_hits - st.disk_hits) / lookups,
            host_hit_ratio=st.host_hits / lookups,
            disk_hit_ratio=st.disk_hits / lookups,
            load_s=st.load_s,
            recompute_s=st.recompute_s,
            prefetch_hits=st.cache.prefetch_hits() if self.prefetch and st.cache is not None else 0,
            **(st.cache.compressed() if st.cache is not None else {}),
            **(st.cache.regret() if st.cache is not None else {}),
            cache_contract=contract_figures(st.cache, st.clock),
        )


def simulate(
    workload: Workload,
    policy: str = "lru",
    capacity_blocks: int | None = None,
    **options: Any,
) -> SimResult:
    """`Simulator(workload, policy, capacity_blocks, **options).run()`."""
    return Simulator(workload, policy, capacity_blocks, **options).run()
