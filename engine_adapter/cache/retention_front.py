"""The prompt-cache retention methods of `CacheManager` (docs/architecture.md, "Retention").

Imports `handoff_lock` and `retention`.
"""

from __future__ import annotations

from typing import Any

from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.retention import Retention

__all__ = ["RetentionFront"]


class RetentionFront:
    """The retention methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    _retention: Retention

    @property
    def retention(self) -> Retention:
        """The prompt-cache lifetimes (read it under `lock`; checks and tests)."""
        return self._retention

    def retention_counters(self) -> dict[str, Any]:
        """Blocks retained now, and retentions granted, refused, broken and expired so far (cheap:
        the engine reads it after each step for /metrics)."""
        with self.lock:
            return self._retention.counters()
