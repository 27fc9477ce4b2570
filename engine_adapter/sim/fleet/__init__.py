"""The fleet simulator: one trace over N replicas of the simulated engine, behind a router.

``sage llm benchmark --replicas N --router NAME`` runs it (docs/fleet.md). Each replica is a
`engine_adapter.sim.simulator.Simulator` with its own `CacheManager`, policy and capacity; one
virtual clock drives them all: at each arrival every replica runs the steps that start before
it, the router picks a replica from what it sees then, and the request joins that replica's
queue (`run.simulate_fleet`).

    replica.py         `Replica`: a simulator driven step by step, and what routers read of it
    router.py          `Router`, the base of the routers, and their `name:k=v` params
    round_robin.py     `round_robin`: in turn
    least_load.py      `least_load`: the fewest outstanding tokens
    cache_aware.py     `cache_aware`: sgl-router's approximate tree of routed prompts
    approx_tree.py     that tree: routed prompts' block keys per replica, its size bounded
    precise.py         `precise`: the longest prefix really cached (a KV-event-fed router)
    predicted_ttft.py  `predicted_ttft`: cached prefix and queue through the cost model
    registry.py        the routers by name; spec parsing for the CLI (light: no simulator)
    run.py             `simulate_fleet`: the replay, and `FleetResult`, its row
    plan.py            the fleets a benchmark sweep runs (sizes and routers, checked)

Importing this package imports no submodule.
"""

from __future__ import annotations

__all__: list[str] = []
