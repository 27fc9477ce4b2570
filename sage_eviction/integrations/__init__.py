"""sage's policies inside other serving engines: vLLM, SGLang and LMCache.

Each submodule imports its engine lazily, inside the functions that need it, so importing this
package (or `sage_eviction`) never loads an engine or torch. They share one bridge,
`sage_eviction.integrations.bridge.PolicyBridge`, which turns an engine's cache events into
sage's incremental calls (docs/architecture.md, "Engine integrations").
"""

from __future__ import annotations

from sage_eviction.integrations.bridge import BridgeStats, PolicyBridge, policy_spec_from_env
from sage_eviction.integrations.compat import TESTED_VERSIONS, UnsupportedEngineVersion, check_version

__all__ = [
    "TESTED_VERSIONS",
    "BridgeStats",
    "PolicyBridge",
    "UnsupportedEngineVersion",
    "check_version",
    "policy_spec_from_env",
]
