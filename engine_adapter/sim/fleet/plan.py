"""The fleets a benchmark sweep runs: its replica counts and router specs, checked.

A fleet row is replicas x capacity x policy x router (`sim.benchmark` lays them out); a fleet has
no reference rows (Belady and the unbounded cache bound one engine, not a fleet).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.sim.fleet.registry import split_router_specs

__all__ = ["fleet_plan"]


def fleet_plan(
    replicas: Sequence[int] | None,
    routers: Sequence[str] | None,
    policies: Sequence[str],
    refused: str | None,
    offline: Sequence[str],
) -> tuple[list[int], list[str]] | None:
    """The fleet sizes and router specs, or None for one engine per row.

    Args:
        replicas: The fleet sizes asked for (None or empty: no fleet).
        routers: Router specs (``name:k=v``; default ``round_robin``).
        policies: The sweep's policy specs; a fleet runs online ones only.
        refused: What the sweep asks that a fleet does not run (a cache model, tiers...), or None.
        offline: The reference policies' names, which a fleet refuses.

    Raises:
        ValueError: (RouterError included) the one-line reason.
    """
    if not replicas:
        if routers:
            raise ValueError("--router needs --replicas N (the fleet's size)")
        return None
    for n in replicas:
        if type(n) is not int or n < 1:
            raise ValueError(f"--replicas {n!r}: a fleet needs at least one replica")
    specs = split_router_specs(",".join(routers or ("round_robin",)))
    if refused is not None:
        raise ValueError(f"--replicas runs without {refused}")
    if bad := [p for p in policies if p.split(":", 1)[0] in offline]:
        raise ValueError(f"--replicas runs online policies, not {', '.join(bad)}")
    return list(dict.fromkeys(replicas)), specs

