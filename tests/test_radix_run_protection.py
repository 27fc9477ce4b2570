"""Queue protection in the compiled radix loop (issue 50, item 4) against the Python loop.

With `protect_queued`, each waiting request's cached prefix is locked from its arrival (and from
its requeue after a preemption) until it is admitted, within a budget of the pool, the newest
protections yielding to an allocation or a decode block that needs their blocks
(`QueueProtection`, engine_adapter/cache/queue_protection.py). The compiled loop ports it
(`CacheCore.protect`, `release_protection`, `_reclaimable_for`, `_yield_for`); these tests hold
its rows to the Python event loop over the real `CacheManager`, field for field and TTFTs bit for
bit: hypothesis-drawn workloads in small pools (protections that fill the budget, yield, and
protect blocks a preempted sequence comes back to), a conversation row, and a Mooncake sample.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from radix_probe_ops import pinned_conversations
from radix_rows import assert_same_outcomes, assert_same_rows, outcome, run_row
from sim_strategies import COSTS, workloads

from engine_adapter.sim import radix_run
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)

POLICIES = ("lru", "fifo", "s3fifo", "arc", "lfu", "sieve")
FRACTIONS = (0.05, 0.2, 0.5, 1.0)


def _outcome(workload: Workload, policy: str, capacity: int, python: bool, **options: Any) -> dict[str, Any]:
    found = outcome(Simulator(workload, policy, capacity, **options), python)
    if python and "row" in found:  # what the draws reach (hypothesis's statistics)
        event(f"preempted: {found['row']['preemptions'] > 0}")
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=workloads(),
    policy=st.sampled_from(POLICIES),
    fraction=st.sampled_from(FRACTIONS),
    spare=st.sampled_from([0, 1, 2, 5]) | st.integers(0, 30),
    max_running=st.sampled_from([1, 2, 3, 8]),
    cost=st.sampled_from(COSTS),
)
def test_protected_rows_are_the_python_loops(
    drawn: tuple[list[SimRequest], int],
    policy: str,
    fraction: float,
    spare: int,
    max_running: int,
    cost: Any,
) -> None:
    requests, block_size = drawn
    workload = Workload(requests, block_size=block_size, source="synthetic")
    capacity = max(1, min_capacity(workload)) + spare
    options: dict[str, Any] = dict(protect_queued=fraction, max_running=max_running, cost_model=cost)
    compiled = _outcome(workload, policy, capacity, False, **options)
    reference = _outcome(workload, policy, capacity, True, **options)
    assert_same_outcomes(compiled, reference)


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "arc", "lfu"])
@pytest.mark.parametrize(
    ("capacity", "max_running", "fraction"), [(50, 4, 0.3), (60, 2, 0.1), (60, 8, 0.6), (80, 8, 1.0)]
)
def test_pinned_conversation_rows_with_protection(
    policy: str, capacity: int, max_running: int, fraction: float
) -> None:
    """Conversations whose next turns queue behind the running slots: their prefixes are
    protected, fill the budget and yield, the newest first (the pinned workload of
    tests/test_radix_run.py; these settings are ones where yielding the oldest first, or not
    protecting a preempted request again, changes the row)."""
    assert_same_rows(
        pinned_conversations(), policy, capacity, protect_queued=fraction, max_running=max_running
    )


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_rows_that_preempt_with_protection(policy: str) -> None:
    """Long outputs on a pool of 1.5 x the largest request: preempted sequences go back to the
    head of the queue and their cached prefixes are protected again (the workload of
    tests/test_radix_run.py's `test_rows_that_preempt`)."""
    workload = synthetic(
        requests=160, rate=40.0, input_tokens=128.0, input_sigma=0.3, output_tokens=200.0,
        output_sigma=0.3, max_input_tokens=512, seed=3, tenants=3,
    )  # fmt: skip
    row = assert_same_rows(workload, policy, 87, protect_queued=0.1, max_running=8)
    assert row["preemptions"] > 0


def test_protection_changes_the_row_it_runs_in() -> None:
    """Not a no-op: the protected row's hits and evictions differ from the unprotected row's,
    both compiled."""
    plain_sim, plain = run_row(pinned_conversations(), "lru", 60, max_running=2)
    sim, protected = run_row(pinned_conversations(), "lru", 60, protect_queued=0.1, max_running=2)
    assert (plain_sim.event_loop, sim.event_loop) == ("compiled", "compiled")
    assert protected["block_hits"] != plain["block_hits"]
    assert protected["evictions"] != plain["evictions"]


@pytest.mark.parametrize("policy", ["lru", "s3fifo"])
def test_a_mooncake_sample_with_protection(policy: str) -> None:
    workload = read_mooncake(shipped_trace("mooncake:conversation")[0], limit=600)
    capacity = max(min_capacity(workload), unique_blocks(workload) // 20)
    assert_same_rows(workload, policy, capacity, protect_queued=0.2)
