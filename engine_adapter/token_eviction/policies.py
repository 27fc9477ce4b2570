"""The serving layer's one import for token policies: the interface, the kept count, the builder.

The policies themselves live one per file in `presses/`, their names in `registry.py`; this
module gathers what the engine and the scheduler use (`TokenEvictionPolicy`,
`kept_for_ratio`, `make_token_policy`). Imports torch (through `presses.base`).
"""

from __future__ import annotations

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio
from engine_adapter.token_eviction.registry import make_token_policy

__all__ = ["TokenEvictionPolicy", "kept_for_ratio", "make_token_policy"]
