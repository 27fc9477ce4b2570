"""`none`: no token-level eviction, the spec's default (spec 002: behaviour unchanged by default).

Imports `presses.base` and `SequenceKV`, not torch itself.
"""

from __future__ import annotations

from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = ["NoEvictionPolicy"]


class NoEvictionPolicy(TokenEvictionPolicy):
    """The default: never evicts; behaviour identical to an engine without token eviction."""

    def name(self) -> str:
        return "none"

    def always_kept(self, length: int, target_len: int) -> list[int]:
        return list(range(length))

    def should_evict(self, cache: SequenceKV, mem_available: int) -> bool:
        return False

    def evict(self, cache: SequenceKV, target_len: int, *, ratio: float | None = None) -> int:
        return 0
