"""sage's policies inside other serving engines: vLLM, SGLang and LMCache.

Each submodule imports its engine lazily, inside the functions that need it, so importing this
package (or `sage_eviction`) never loads an engine or torch; nothing here imports
`engine_adapter` or `sage_cli` (docs/architecture.md, "Engine integrations"). Modules:

- `bridge`: `PolicyBridge`, the one translation from an engine's cache events into sage's
  incremental calls, and its event log.
- `compat`: the engine releases tested, the check that refuses others, and `EngineClass`, the
  base of the engine mixins.
- `vllm`: the GPU prefix cache (`SageBlockPool`, the `vllm.general_plugins` entry point) and
  the KV-offload `CachePolicy` (`SagePolicy`, `Sage_<name>`).
- `sglang`: `SageFullComponent` for SGLang's radix cache and its `sglang.srt.plugins` entry
  point; `sglang_hicache`: its HiCache host tier, ordered by a second policy.
- `lmcache`: sage's entries in LMCache's two policy factories (`install`).

Each engine class is a module-level mixin that a cached factory puts over the engine's own
class once the engine is imported.
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
