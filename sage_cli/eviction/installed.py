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
    """Each registered policy, offline ones included (`sage_eviction.describe_policies`)."""
    from sage_eviction import describe_policies

    return describe_policies(include_offline=True)
