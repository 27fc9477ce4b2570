"""The flat row's compiled event loop (`engine_adapter.sim._flat_run`) against the Python loop.

`Simulator.run()` of a flat row whose cache runs "c-state" goes through one compiled call
(`engine_adapter.sim.flat_run`); the reference is the Python event loop (`Simulator.advance`),
forced here by replacing `flat_run.compiled_loop`, over the same FlatState cache, and the
pure-Python row (`native.pure_python()`: the Python loop, the policy's own methods) besides.
Held equal: the row field for field (timings aside), `Simulator.ttft_s` bit for bit, the
progress calls, and what the run leaves in its state and cache (counters, the re-prefill
tracker's counts, the decision times recorded). On hypothesis-drawn workloads (arrival ties and
bursts, partial last blocks, output_len 0 and 1, repeated keys, tenants or sessions, lists and
`RequestTable`s, several running and prefill limits and cost models) and on the shipped Mooncake
conversation trace. The Python loop keeps a fleet's `advance`, other policies' rows, non-int keys
and `SAGE_PURE_PYTHON`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_strategies import BINARY, COSTS, workloads

from engine_adapter.sim import flat_run
from engine_adapter.sim.cache_models import window_quantiles
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.run_state import RunState
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks
from sage_eviction import native
from sage_eviction.metrics import LatencyRecorder

# A missing build skips as tests/test_flat_state.py does, which SAGE_REQUIRE_ALL=1 turns into a
# failure (conftest.py); under SAGE_PURE_PYTHON the loop is not loaded and rows run the Python loop.
pytestmark = pytest.mark.skipif(flat_run.compiled_loop() is None, reason=COMPILED_CORE_MISSING)

STATE_POLICIES = ("lru", "fifo", "mru", "filo", "sieve", "s3fifo", "arc", "belady")
TIMINGS = ("wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us")
def test_the_compiled_loop_is_built() -> None:
    """The loop loads by `native.load` (setup.py's NATIVE_MODULES builds it)."""
    assert flat_run.compiled_loop() is not None
    assert flat_run.compiled_loop() is native.load(flat_run.LOOP_MODULE)


@contextmanager
def python_loop() -> Iterator[None]:
    """Rows built inside run the Python event loop (the cache still "c-state")."""
    saved = flat_run.compiled_loop
    flat_run.compiled_loop = lambda: None
    try:
        yield
    finally:
        flat_run.compiled_loop = saved


class _Run:
    """One row: the simulator, its row without timings, its progress calls and its run state."""

    def __init__(self, workload: Workload, policy: str, capacity: int, **options: Any) -> None:
        self.progress: list[int] = []
        self.sim = Simulator(
            workload, policy, capacity, cache_model="flat", progress=self.progress.append, **options
        )
        states: list[RunState] = []
        start_run = self.sim.start_run

        def keep(requests: Any = None) -> RunState:
            states.append(start_run(requests))
            return states[-1]

        self.sim.start_run = keep  # type: ignore[method-assign]
        self.row = {k: v for k, v in self.sim.run().to_dict().items() if k not in TIMINGS}
        self.state = states[0]

    def picture(self) -> dict[str, Any]:
        """Everything the two loops must agree on."""
        st, flat = self.state, self.state.flat
        assert flat is not None
        cache = flat.cache
        return {
            "row": self.row,
            "ttft_s": [t.hex() for t in self.sim.ttft_s],
            "tpots": [t.hex() for t in st.tpots],
            "progress": self.progress,
            "group_hits": list(st.group_hits.values()),
            "clock": float(st.clock).hex(),
            "counts": (cache.requests, cache.hits, cache.evictions, len(cache)),
            "records": (flat.reprefill.evictions, flat.reprefill.re_prefilled, flat.latency.count),
        }


def _same(workload: Workload, policy: str, capacity: int, **options: Any) -> _Run:
    """The compiled row equals the Python loop's; returns the compiled run."""
    fast = _Run(workload, policy, capacity, **options)
    with python_loop():
        slow = _Run(workload, policy, capacity, **options)
    assert (fast.sim.event_loop, slow.sim.event_loop) == ("compiled", "python")
    assert fast.sim.policy_calls == slow.sim.policy_calls == "c-state"
    assert fast.picture() == slow.picture()
    return fast


ROWS = given(
    drawn=workloads(),
    policy=st.sampled_from(STATE_POLICIES),
    capacity=st.integers(1, 12),
    max_running=st.sampled_from([1, 2, 3, 8, 256]),
    max_prefill_tokens=st.sampled_from([1, 4, 8, 16, 20, 32, 64, 16384]),
    cost=st.sampled_from(COSTS),
    every=st.integers(1, 4),
)


def _rows_agree(
    drawn: tuple[list[SimRequest], int],
    policy: str,
    capacity: int,
    max_running: int,
    max_prefill_tokens: int,
    cost: CostModel,
    every: int,
) -> None:
    """The compiled row is the Python loop's, from a list and from a table, and the pure-Python
    row (the Python loop over the policy's own methods) is the same row."""
    requests, block_size = drawn
    options = dict(
        max_running=max_running, max_prefill_tokens=max_prefill_tokens, cost_model=cost, progress_every=every
    )
    listed = Workload(requests, block_size=block_size, source="synthetic")
    fast = _same(listed, policy, capacity, **options)
    table = Workload(RequestTable.of(requests), block_size=block_size, source="synthetic")
    assert _same(table, policy, capacity, **options).picture() == fast.picture()
    with native.pure_python():  # the pure-Python row: the Python loop and the policy's methods
        pure = Simulator(listed, policy, capacity, cache_model="flat", **options)
        pure_row = {k: v for k, v in pure.run().to_dict().items() if k not in TIMINGS}
    assert pure.policy_calls == "python"
    assert (pure_row, [t.hex() for t in pure.ttft_s]) == (fast.row, fast.picture()["ttft_s"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ROWS
def test_the_compiled_loop_gives_the_python_loops_row(**drawn: Any) -> None:
    """A quick-loop sample (about a second); the slow run below draws 800 workloads."""
    _rows_agree(**drawn)


@pytest.mark.slow
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ROWS
def test_the_compiled_loop_gives_the_python_loops_row_long(**drawn: Any) -> None:
    _rows_agree(**drawn)


def test_the_prefill_limit_is_reached_exactly() -> None:
    """A step admits while its prefill tokens stay under the limit (the first admission always
    fits): 16-token misses and one of 40, all arriving at once, batched by the limit."""
    requests = [SimRequest(i, 0.0, (10 * i, 10 * i + 1), 40 if i == 3 else 16, 3) for i in range(6)]
    workload = Workload(requests, block_size=8, source="synthetic")
    for limit, steps in ((32, [2, 2, 2]), (33, [3, 1, 2]), (16, [1] * 6), (1, [1] * 6)):
        ttfts = _same(workload, "lru", 4, max_prefill_tokens=limit).sim.ttft_s
        assert [ttfts.count(t) for t in sorted(set(ttfts))] == steps


def test_a_step_and_a_decode_stretch_to_the_bit() -> None:
    """Golden figures from the cost model itself. Three prompts prefilled in one step (41 tokens,
    batch 3): their TTFT is `step_time`'s float, whose attention term rounds differently in
    another order. Then binary-fraction costs: a decode stretch ends exactly on the next arrival
    (at 1.0: the prefill's 0.25 and six decode steps of 0.125), which is admitted at once."""
    attention = CostModel(
        prefill_base_s=0.0, prefill_per_token_s=0.0, prefill_attn_s=1.1e-3, decode_base_s=0.0
    )
    three = [SimRequest(i, 0.0, (i,), 13 if i == 2 else 14, 1) for i in range(3)]
    fast = _same(Workload(three, block_size=16, source="synthetic"), "fifo", 8, cost_model=attention)
    step = attention.step_time(prefill_tokens=41, prefill_batch=3)
    assert [t.hex() for t in fast.sim.ttft_s] == [step.hex()] * 3
    two = [SimRequest(0, 0.0, (1,), 16, 20), SimRequest(1, 1.0, (2,), 16, 1)]
    fast = _same(Workload(two, block_size=16, source="synthetic"), "lru", 8, cost_model=BINARY)
    assert fast.sim.ttft_s == [0.25, 0.25]


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.floats(0.0, 1e-3) | st.sampled_from([0.0, 1e-7, 2e-7]), max_size=40),
    window=st.integers(1, 16),
    qs=st.lists(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]) | st.floats(0.0, 1.0), min_size=1, max_size=3),
)
def test_the_flat_rows_quantiles_are_the_recorders(times: list[float], window: int, qs: list[float]) -> None:
    """`FlatModel.stats` takes the decision times' quantiles by partition: `quantiles`' floats."""
    recorder = LatencyRecorder(window)
    for seconds in times:
        recorder.record(seconds)
    assert [q.hex() for q in window_quantiles(recorder, *qs)] == [q.hex() for q in recorder.quantiles(*qs)]


def _mooncake(requests: int) -> Workload:
    return read_mooncake(shipped_trace("mooncake:conversation")[0], limit=requests)


@pytest.mark.parametrize("policy", STATE_POLICIES)
def test_the_mooncake_sample_as_a_table_and_as_a_list(policy: str) -> None:
    table = _mooncake(500)
    assert isinstance(table.requests, RequestTable)
    listed = Workload(list(table.requests), block_size=table.block_size, source="mooncake")
    capacity = max(1, unique_blocks(table) // 20)
    fast = _same(table, policy, capacity, max_running=32)
    assert _same(listed, policy, capacity, max_running=32).picture() == fast.picture()
    assert fast.row["evictions"] > 0 and 0 < fast.row["block_hits"] < fast.row["block_lookups"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", STATE_POLICIES)
def test_the_whole_mooncake_conversation_trace(policy: str) -> None:
    workload = _mooncake(12_031)
    _same(workload, policy, max(1, unique_blocks(workload) // 20))


def test_tenants_as_groups_and_a_progress_call_per_request() -> None:
    """Every request's progress call, tenants as groups, a long decode tail after the arrivals."""
    workload = synthetic(requests=120, rate=50.0, seed=5, tenants=3)
    fast = _same(workload, "s3fifo", max(1, unique_blocks(workload) // 8), progress_every=1, max_running=4)
    assert fast.progress == list(range(1, 121))
    assert len(fast.state.group_hits) == 3


def test_the_python_loop_stays_where_the_compiled_one_does_not_apply() -> None:
    workload = synthetic(requests=30, rate=20.0, seed=2)
    capacity = max(1, unique_blocks(workload) // 5)
    slru = Simulator(workload, "slru", capacity, cache_model="flat")  # no state in C
    slru.run()
    assert (slru.event_loop, slru.policy_calls) == ("python", "compiled")
    strings = Workload(
        [SimRequest(i, i * 0.1, (f"k{i % 3}", "x"), 32, 2) for i in range(8)],
        block_size=16,
        source="synthetic",
    )
    other_keys = Simulator(strings, "lru", 2, cache_model="flat")
    other_keys.run()
    assert other_keys.event_loop == "python"
    with native.pure_python():
        pure = Simulator(workload, "lru", capacity, cache_model="flat")
        pure.run()
    assert (pure.event_loop, pure.policy_calls) == ("python", "python")


def test_a_fleets_advance_is_the_python_loop_and_gives_the_run() -> None:
    """`advance` with a horizon (a fleet's replica) never takes the compiled call; driven in
    stretches it ends where the compiled `run` ends."""
    workload = synthetic(requests=40, rate=30.0, seed=9)
    capacity = max(1, unique_blocks(workload) // 6)
    whole = _Run(workload, "arc", capacity)
    sim = Simulator(workload, "arc", capacity, cache_model="flat")
    state = sim.start_run()
    end = workload.requests[-1].arrival_s
    for i in range(1, 11):
        sim.horizon = end * i / 10
        sim.advance(state, end * i / 10)
    sim.horizon = None
    sim.advance(state, float("inf"))
    assert sim.event_loop == "python"
    assert state.finished == whole.state.finished == 40
    assert float(state.clock).hex() == float(whole.state.clock).hex()
    assert sorted(state.ttfts) == whole.sim.ttft_s
