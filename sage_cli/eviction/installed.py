"""The eviction policies installed where the CLI runs: ``sage llm eviction policies`` with no engine.

Read from the policy registry in the CLI's own process (built-ins and entry-point plugins), in
the shape of the engine's ``GET /v1/eviction/policies``, offline policies included (they run in
the simulator). This is the one module of ``sage llm eviction`` that imports `sage_eviction`
(pure Python, never torch), and only when `installed_policies` is called.
"""

from __future__ import annotations

from typing import Any

__all__ = ["installed_policies"]


def installed_policies() -> list[dict[str, Any]]:
    """Each registered policy: name, strategy, paper, whether it is offline, its params with their
    defaults (``capacity`` aside: the cache gives it)."""
    from sage_eviction import available_policies, get_policy_class, policy_params

    listing = []
    for name in available_policies(include_offline=True):
        cls = get_policy_class(name)
        params = {k: p.default for k, p in policy_params(cls).items() if k != "capacity"}
        strategy = cls.strategy.name
        listing.append(
            {"name": name, "strategy": strategy, "paper": cls.paper, "offline": cls.offline, "params": params}
        )
    return listing
