"""The fleet simulator (engine_adapter.sim.fleet): one replica is the plain run, the routers
decide as their docstrings say, golden figures on the shipped conversation trace."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from engine_adapter.sim.benchmark import build_workload, capacities_for
from engine_adapter.sim.fleet.approx_tree import ApproxTree
from engine_adapter.sim.fleet.cache_aware import CacheAware
from engine_adapter.sim.fleet.least_load import LeastLoad
from engine_adapter.sim.fleet.registry import ROUTERS, parse_router, split_router_specs
from engine_adapter.sim.fleet.replica import Replica
from engine_adapter.sim.fleet.round_robin import RoundRobin
from engine_adapter.sim.fleet.router import RouterError
from engine_adapter.sim.fleet.run import simulate_fleet
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import Simulator, min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

# Wall-clock fields and the eviction timings (wall time too) differ run to run.
_WALL = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}


@pytest.fixture(scope="module")
def workload() -> Workload:
    return synthetic(requests=120, seed=3)


def _capacity(w: Workload) -> int:
    return max(min_capacity(w), unique_blocks(w.requests) // 10)


@pytest.mark.parametrize("spread", [1.0, 20.0])
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_one_replica_behind_any_router_is_the_plain_run(
    workload: Workload, router: str, spread: float
) -> None:
    # Spread 20x, the engine idles and decodes with an empty queue between arrivals: the stretch
    # of decode steps must stop at the next arrival anywhere in the fleet (`Simulator.horizon`).
    workload = replace(
        workload, requests=[replace(r, arrival_s=r.arrival_s * spread) for r in workload.requests]
    )
    capacity = _capacity(workload)
    plain = Simulator(workload, "lru", capacity).run().to_dict()
    run = simulate_fleet(workload, 1, router, "lru", capacity)
    replica = run.replica_results[0].to_dict()
    assert {k: v for k, v in replica.items() if k not in _WALL} == {
        k: v for k, v in plain.items() if k not in _WALL
    }
    row = run.result
    assert (row.block_hits, row.block_lookups, row.hit_rate) == (
        plain["block_hits"],
        plain["block_lookups"],
        plain["hit_rate"],
    )
    assert (row.ttft_p50_s, row.ttft_p99_s, row.throughput_tok_s) == (
        plain["ttft_p50_s"],
        plain["ttft_p99_s"],
        plain["throughput_tok_s"],
    )
    assert row.load_spread == 1.0 and row.routed == [len(workload.requests)]


def test_round_robin_assigns_in_turn(workload: Workload) -> None:
    run = simulate_fleet(workload, 3, "round_robin", "lru", _capacity(workload))
    assert run.assignment == [i % 3 for i in range(len(workload.requests))]
    assert run.result.routed == [40, 40, 40]


def test_least_load_picks_the_fewest_outstanding_tokens(workload: Workload) -> None:
    seen: list[tuple[list[int], int]] = []

    def observe(request: SimRequest, now: float, fleet: list[Replica], index: int) -> None:
        seen.append(([r.outstanding_tokens for r in fleet], index))

    simulate_fleet(workload, 4, "least_load", "lru", _capacity(workload), observer=observe)
    assert len(seen) == len(workload.requests)
    for loads, index in seen:
        assert loads[index] == min(loads) and index == loads.index(min(loads))
    assert any(len(set(loads)) > 1 for loads, _ in seen)  # the loads did differ


def _fleet(w: Workload, n: int) -> list[Replica]:
    first = w.requests[0].arrival_s
    return [Replica(i, Simulator(w, "lru", _capacity(w)), first) for i in range(n)]


def test_least_load_on_replicas_loaded_by_hand(workload: Workload) -> None:
    fleet = _fleet(workload, 3)
    for request in workload.requests[:4]:
        fleet[0].submit(request)
    fleet[2].submit(workload.requests[4])
    assert LeastLoad(fleet).route(workload.requests[5], 0.0) == 1
    fleet[1].submit(workload.requests[5])
    fleet[1].submit(workload.requests[6])
    expected = min(range(3), key=lambda i: (fleet[i].outstanding_tokens, i))
    assert LeastLoad(fleet).route(workload.requests[7], 0.0) == expected


def test_cache_aware_balances_only_when_both_thresholds_are_crossed(workload: Workload) -> None:
    requests = workload.requests
    probes = iter(requests[60:])
    for loads, expected in (((2, 0), 0), ((3, 0), 1), ((4, 2), 0), ((5, 2), 1), ((9, 6), 0), ((10, 6), 1)):
        fleet = _fleet(workload, 2)
        router = CacheAware(fleet, balance_abs_threshold=2, balance_rel_threshold=1.5, cache_threshold=0.0)
        senders = iter(requests[:20])
        for replica, load in zip(fleet, loads, strict=True):
            for _ in range(load):
                replica.submit(next(senders))  # in flight: the replicas have not run
        probe = next(probes)
        router.tree.insert(probe.block_hashes, 0, 0.0)  # the tree says replica 0
        assert router.route(probe, 0.0) == expected, loads
        assert router.load_balanced == (expected == 1)


def test_cache_aware_follows_the_tree_above_the_threshold(workload: Workload) -> None:
    requests = workload.requests
    fleet = _fleet(workload, 3)
    router = CacheAware(fleet, cache_threshold=0.5)
    keys = requests[0].block_hashes
    router.tree.insert(keys, 2, 0.0)
    assert router.route(requests[0], 1.0) == 2  # full match on replica 2's part of the tree
    unmatched = next(r for r in requests if r.block_hashes[0] != keys[0])
    assert router.route(unmatched, 2.0) == 0  # no match: the smallest tree (0 and 1 are empty)


def test_approximate_tree_matches_inserts_and_evicts_lru_leaves() -> None:
    tree = ApproxTree(2)
    tree.insert(("a", "b", "c"), 0, 1.0)
    tree.insert(("a", "b", "d"), 1, 2.0)
    assert tree.sizes == [3, 3]
    assert tree.prefix_match(("a", "b", "c", "z"), 3.0) == (3, 0)
    assert tree.prefix_match(("a", "b"), 4.0) == (2, 0)  # both hold it; 0 touched it last (3.0)
    assert tree.prefix_match(("x",), 5.0) == (0, None)
    assert tree.smallest_tenant() == 0
    tree.insert(("a", "e"), 1, 6.0)
    assert tree.smallest_tenant() == 0 and tree.sizes == [3, 4]
    tree.evict_to(2)  # tenant 1: its oldest leaf (d, 2.0), then b (a leaf of its own now)
    assert tree.sizes == [2, 2]
    assert tree.prefix_match(("a", "b", "d"), 7.0) == (2, 0)
    assert tree.prefix_match(("a", "e"), 8.0) == (2, 1)


def test_router_specs_are_checked() -> None:
    assert parse_router("cache_aware:cache_threshold=0.3,max_tree_size=50") == (
        "cache_aware",
        {"cache_threshold": 0.3, "max_tree_size": 50},
    )
    assert split_router_specs(
        "round_robin, cache_aware:cache_threshold=0.3,balance_abs_threshold=8,precise"
    ) == [
        "round_robin",
        "cache_aware:cache_threshold=0.3,balance_abs_threshold=8",
        "precise",
    ]
    for spec, message in (
        ("nope", "unknown router 'nope'; routers: round_robin"),
        ("cache_aware:size=3", "has no param 'size'"),
        ("cache_aware:cache_threshold=2", "must be in [0, 1]"),
        ("cache_aware:balance_abs_threshold=x", "is not int"),
        ("precise:cache_threshold", "is not of the form k=v"),
    ):
        with pytest.raises(RouterError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_router(spec)


def test_bad_fleets_are_refused(workload: Workload) -> None:
    capacity = _capacity(workload)
    with pytest.raises(ValueError, match="at least one replica"):
        simulate_fleet(workload, 0, "round_robin", "lru", capacity)
    with pytest.raises(ValueError, match="online policies"):
        simulate_fleet(workload, 2, "round_robin", "belady", capacity)
    with pytest.raises(ValueError, match="radix cache model"):
        simulate_fleet(workload, 2, "round_robin", "lru", capacity, cache_model="flat")


# Golden figures: the first 1,000 requests of the shipped Mooncake conversation trace over four
# replicas of 10 % of its distinct blocks each, LRU, the default cost model. A change to any of
# them is a change of the simulator or of a router: say why in the commit that updates them.
GOLDEN: dict[str, tuple[int, int, float, list[int]]] = {
    "round_robin": (2130, 27305, 530.8538079322869, [250, 250, 250, 250]),
    "least_load": (1670, 27305, 464.8827057711149, [225, 258, 255, 262]),
    "cache_aware": (2811, 27305, 517.6459035488832, [242, 262, 230, 266]),
    "precise": (3536, 27305, 409.10118739473484, [252, 218, 262, 268]),
    "predicted_ttft": (2504, 27305, 471.71712227530145, [241, 240, 264, 255]),
}


@pytest.fixture(scope="module")
def conversation() -> tuple[Workload, int]:
    w = build_workload(trace=shipped_trace("mooncake:conversation")[0], requests=1000)
    return w, capacities_for(w, None, [0.1], "radix")[0]


@pytest.mark.slow
@pytest.mark.parametrize("router", sorted(GOLDEN))
def test_golden_figures_on_the_conversation_trace(conversation: tuple[Workload, int], router: str) -> None:
    w, capacity = conversation
    row = simulate_fleet(w, 4, router, "lru", capacity).result
    hits, lookups, ttft_p99, routed = GOLDEN[router]
    assert (row.block_hits, row.block_lookups, row.routed) == (hits, lookups, routed)
    assert row.ttft_p99_s == pytest.approx(ttft_p99, rel=1e-9)


def test_golden_figures_order_the_routers_as_the_issue_expects() -> None:
    hit: dict[str, Any] = {name: g[0] / g[1] for name, g in GOLDEN.items()}
    assert hit["precise"] > hit["cache_aware"] > hit["round_robin"]


class _OutOfRange(RoundRobin):
    """A router with a bug: it names a replica the fleet does not have."""

    name = "out_of_range"

    def route(self, request: SimRequest, now: float) -> int:
        return len(self.replicas)


def test_a_router_naming_a_missing_replica_is_an_error(
    workload: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ROUTERS, _OutOfRange.name, _OutOfRange)
    with pytest.raises(RouterError, match="router 'out_of_range' chose replica 2 of 2"):
        simulate_fleet(workload, 2, "out_of_range", "lru", _capacity(workload))
