"""The adaptive batch in the compiled radix loop (issue 50, item 4) against the Python loop.

With `adaptive_batch=True` the running limit starts at `max_running` and follows the re-prefill
rate (`AdaptiveBatch`, engine_adapter/cache/adaptive_batch.py). The compiled loop admits within
its current limit and calls its `observe` when a decision is due, with the steps run since its
last call (between decisions a call only adds them up), and once at the end; it runs a copy, so
a row handed back to the Python loop starts from the run's own. These tests hold its rows, and
the adaptive batch's state after them, to the Python loop: the golden row of
tests/test_adaptive_batch.py, hypothesis draws (the unbounded row among them, which may run
twice), and a Mooncake sample.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_rows import assert_same_outcomes, outcome
from sim_strategies import COSTS, workloads

from engine_adapter.sim import radix_run
from engine_adapter.sim.benchmark import build_workload
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)


def _run(
    workload: Workload, policy: str, capacity: int | None, python: bool, **options: Any
) -> dict[str, Any]:
    """One adaptive run's `outcome`, and the adaptive batch's state after it."""
    sim = Simulator(workload, policy, capacity, adaptive_batch=True, **options)
    found = outcome(sim, python)
    if "raised" in found:
        return found
    adaptive = sim.adaptive
    assert adaptive is not None
    state = (adaptive.current, adaptive.steps, adaptive.shrinks, adaptive.grows, adaptive.next_decision)
    return {**found, "adaptive": state, "changes": list(adaptive.changes)}


def _same(workload: Workload, policy: str, capacity: int | None, **options: Any) -> dict[str, Any]:
    compiled = _run(workload, policy, capacity, False, **options)
    assert_same_outcomes(compiled, _run(workload, policy, capacity, True, **options))
    return compiled


def test_the_golden_row_under_memory_pressure_runs_compiled() -> None:
    """tests/test_adaptive_batch.py's golden row: 211 changes of the limit, the same ones."""
    workload = build_workload(workload="synthetic", requests=300, seed=0)
    outcome = _same(workload, "lru", 452)
    assert outcome["row"]["batch_changes"] == 211 and len(outcome["changes"]) == 211
    assert outcome["row"]["preemptions"] == 29


@pytest.mark.parametrize("policy", ["s3fifo", "arc", "lfu"])
def test_the_golden_workload_with_other_policies(policy: str) -> None:
    workload = build_workload(workload="synthetic", requests=300, seed=0)
    assert _same(workload, policy, 452)["row"]["batch_changes"] > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=workloads(),
    policy=st.sampled_from(("lru", "fifo", "s3fifo", "arc", "unbounded")),
    spare=st.sampled_from([0, 1, 2, 5]) | st.integers(0, 30),
    max_running=st.sampled_from([1, 2, 3, 8, 256]),
    cost=st.sampled_from(COSTS),
    protect=st.sampled_from([0.0, 0.0, 0.3]),
)
def test_drawn_adaptive_rows_are_the_python_loops(
    drawn: tuple[list[SimRequest], int], policy: str, spare: int, max_running: int, cost: Any, protect: float
) -> None:
    requests, block_size = drawn
    workload = Workload(requests, block_size=block_size, source="synthetic")
    capacity = None if policy == "unbounded" else max(1, min_capacity(workload)) + spare
    options: dict[str, Any] = dict(max_running=max_running, cost_model=cost)
    if protect and policy != "unbounded":
        options["protect_queued"] = protect
    _same(workload, policy, capacity, **options)


def test_a_mooncake_sample_with_the_adaptive_batch() -> None:
    workload = read_mooncake(shipped_trace("mooncake:conversation")[0], limit=600)
    capacity = max(min_capacity(workload), unique_blocks(workload) // 20)
    _same(workload, "lru", capacity, protect_queued=0.2)
