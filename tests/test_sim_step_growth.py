"""A decode step's block needs in one call to the cache model (issue 34, item 3): the batched
growth (`decode_steps.grow_decoding`, `RadixModel.reserve_many`, `CacheManager.reserve_tokens_many`)
against the reference, one `reserve` per need popped off the heap in turn, kept here as the
simulator ran it before. Rows (timings aside) and the TTFT distributions must be the same, on
workloads tight enough that growth falls short and preempts, with the radix and sglang models,
queue protection and KV tiers."""

from __future__ import annotations

import heapq
from contextlib import nullcontext
from typing import Any

import pytest
from radix_rows import python_loop

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.decode_steps import due_needs
from engine_adapter.sim.run_state import RunState
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload

TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}


class _OneByOne(Simulator):
    """The simulator with its growth as it was: each due need popped and reserved in turn (in
    the Python event loop: `_row` keeps a radix row out of the compiled loop)."""

    def _grow_decoding(self, st: RunState, admitted: list[SimSequence]) -> bool:
        preempted_now = False
        self._clock = st.clock  # the evictions' time, as `Simulator._grow_decoding` sets it
        while st.needs and st.needs[0][0] <= st.step:
            target, sid, epoch = heapq.heappop(st.needs)
            seq = st.running.get(sid)
            if seq is None or seq.epoch != epoch:
                continue
            cache = st.cache
            assert cache is not None
            while not cache.reserve(seq, seq.tokens + target - seq.start_step):
                victims = cache.select_victims([sid, *(a.sid for a in admitted)])
                preempted_now = True
                if not victims:
                    self._preempt(st, seq)
                    break
                for victim in victims:
                    self._preempt(st, st.running[victim])
            else:
                nxt = target + self.block_size
                if nxt <= seq.start_step + seq.request.output_len - seq.decoded - 1:
                    heapq.heappush(st.needs, (nxt, sid, epoch))
        return preempted_now


@pytest.fixture(scope="module")
def workload() -> Workload:
    # long outputs on a small pool: many sequences cross a block boundary in the same step
    return synthetic(
        requests=160,
        rate=40.0,
        input_tokens=128.0,
        input_sigma=0.3,
        output_tokens=200.0,
        output_sigma=0.3,
        max_input_tokens=512,
        seed=3,
    )


def _row(
    cls: type[Simulator], workload: Workload, policy: str, **options: Any
) -> tuple[dict[str, Any], list[float]]:
    simulator = cls(workload, policy, 87, **options)  # 1.5 x the largest request
    with python_loop() if cls is _OneByOne else nullcontext():
        row = {k: v for k, v in simulator.run().to_dict().items() if k not in TIMINGS}
    assert simulator.event_loop == "python" or cls is Simulator
    return row, simulator.ttft_s


@pytest.mark.parametrize(
    ("policy", "options"),
    [
        ("lru", {}),
        ("gdsf", {}),
        ("s3fifo", {"protect_queued": 0.2}),
        ("lru", {"tiers": TierConfig(host_blocks=64)}),
        ("lru", {"cache_model": "sglang"}),
        ("lru", {"adaptive_batch": True}),
    ],
)
def test_one_call_per_step_grows_and_preempts_as_one_call_per_need(
    workload: Workload, policy: str, options: dict[str, Any]
) -> None:
    batched, ttft = _row(Simulator, workload, policy, **options)
    reference, ttft_ref = _row(_OneByOne, workload, policy, **options)
    assert batched == reference
    assert ttft == ttft_ref
    assert batched["preemptions"] > 0  # growth fell short: the path after a failure ran


def test_reserve_tokens_many_stops_at_the_first_that_falls_short() -> None:
    """Three one-block sequences on a pool of four: the first takes the last free block, the
    second falls short (nothing cached to evict) and changes nothing, and the third, which
    would fit (its blocks cover 4 tokens), is not tried: its token count stays."""
    manager = CacheManager(BlockAllocator(4, 4), record_events=False)
    for sid in range(3):
        manager.allocate(CacheRequest(sid, [sid * 10 + i for i in range(3)]))
    assert manager.reserve_tokens_many([(0, 5), (1, 5), (2, 4)]) == 1
    assert [len(manager.block_table(sid)) for sid in range(3)] == [2, 1, 1]
    assert [manager.sequence(sid).num_tokens for sid in range(3)] == [5, 3, 3]
    assert manager.reserve_tokens_many([(2, 4)]) == 1 and manager.sequence(2).num_tokens == 4


def test_due_needs_stop_one_block_past_the_first(workload: Workload) -> None:
    """Needs due by step 20 (block size 4) at 5, 5, 9 and 12, one stale: only those before 9 are
    taken, so that a served need's next one (at 9 or later) sorts after every need taken."""
    sequences = {sid: SimSequence(workload.requests[sid], sid, 4, None, 0) for sid in range(4)}
    sequences[1].epoch = 1  # preempted since its need was pushed: stale
    needs = [(5, 0, 0), (5, 1, 0), (5, 2, 0), (9, 3, 0), (12, 0, 0)]
    heapq.heapify(needs)
    assert [(t, s.sid) for t, s in due_needs(needs, sequences, 20, 4)] == [(5, 0), (5, 2)]
    assert sorted(needs) == [(9, 3, 0), (12, 0, 0)]
