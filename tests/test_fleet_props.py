"""Property tests of the fleet's routers (hypothesis): every request is routed exactly once to a
replica in range and runs to its end; `precise` never picks a shorter cached prefix where the
loads are equal; `least_load` always picks the fewest outstanding tokens."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_adapter.sim.fleet.registry import ROUTERS
from engine_adapter.sim.fleet.replica import Replica
from engine_adapter.sim.fleet.run import simulate_fleet
from engine_adapter.sim.simulator import min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

_SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _workload(seed: int, requests: int) -> tuple[Workload, int]:
    w = synthetic(requests=requests, seed=seed)
    return w, max(min_capacity(w), unique_blocks(w.requests) // 8)


@_SETTINGS
@given(
    seed=st.integers(0, 10_000),
    requests=st.integers(5, 40),
    replicas=st.integers(1, 5),
    router=st.sampled_from(sorted(ROUTERS)),
)
def test_every_request_is_routed_once_to_a_replica_in_range(
    seed: int, requests: int, replicas: int, router: str
) -> None:
    w, capacity = _workload(seed, requests)
    run = simulate_fleet(w, replicas, router, "lru", capacity)
    assert len(run.assignment) == len(w.requests)
    assert all(0 <= index < replicas for index in run.assignment)
    assert run.result.routed == [run.assignment.count(i) for i in range(replicas)]
    assert run.result.requests == len(w.requests)  # every one ran to its end
    assert sum(r.requests for r in run.replica_results) == len(w.requests)


@_SETTINGS
@given(seed=st.integers(0, 10_000), requests=st.integers(5, 40), replicas=st.integers(2, 5))
def test_precise_never_picks_a_shorter_cached_prefix_at_equal_load(
    seed: int, requests: int, replicas: int
) -> None:
    w, capacity = _workload(seed, requests)

    def observe(request: SimRequest, now: float, fleet: list[Replica], index: int) -> None:
        cached = [r.cached_prefix_blocks(request.block_hashes) for r in fleet]
        loads = [r.outstanding_tokens for r in fleet]
        for other in range(len(fleet)):
            if loads[other] == loads[index]:
                assert cached[other] <= cached[index]
        assert cached[index] == max(cached)  # and at any load: the score is the prefix alone

    simulate_fleet(w, replicas, "precise", "lru", capacity, observer=observe)


@_SETTINGS
@given(seed=st.integers(0, 10_000), requests=st.integers(5, 40), replicas=st.integers(2, 5))
def test_least_load_always_picks_the_fewest_outstanding_tokens(
    seed: int, requests: int, replicas: int
) -> None:
    w, capacity = _workload(seed, requests)

    def observe(request: SimRequest, now: float, fleet: list[Replica], index: int) -> None:
        loads = [r.outstanding_tokens for r in fleet]
        assert loads[index] == min(loads)

    simulate_fleet(w, replicas, "least_load", "lru", capacity, observer=observe)
