"""The cache manager's methods for waiting requests: queue-aware protection of their cached
prefixes (`queue_protection`).

A mixin of `CacheManager` (split off when the KV tiers grew the front past one module), as the
policy base keeps its handover in `sage_eviction.handover`; the prefetch of a waiting request's
host/disk prefix is in `tier_front`. Every method takes the manager's lock. Imports
`admission`, `cached_block`, `handoff_lock`, `queue_protection` and `request`.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine_adapter.cache.admission import Admission
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.request import CacheRequest

__all__ = ["QueueFront"]


class QueueFront:
    """The queue-protection methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    _protection: QueueProtection
    _admission: Admission

    @property
    def max_protected(self) -> int:
        """Distinct blocks the waiting requests' protections may hold (0: protection off)."""
        return self._protection.max_protected

    @property
    def protections_yielded(self) -> int:
        """Protections dropped so that an allocation could proceed."""
        return self._protection.yielded

    @property
    def num_protected_blocks(self) -> int:
        """Distinct blocks protected for waiting requests now."""
        return self._protection.num_blocks

    def protect_queued_prefix(self, request: CacheRequest) -> int:
        """Protect from eviction the cached prefix a waiting request will hit, until it is
        allocated (`allocate` with the same `sequence_id`) or leaves the queue (`release_queued`).

        All protections stay within `protect_queued` of the pool (a prefix is protected from its
        head as far as it fits) and yield, newest first, to an allocation or a decode block that
        could not be had otherwise (`queue_protection`). Protecting is no hit. A no-op when
        `protect_queued` is 0.

        Returns:
            Blocks it protects.
        """
        with self.lock:
            return self._admission.protect(request)

    def release_queued(self, request_id: Hashable) -> int:
        """End a waiting request's protection (it left the queue); returns blocks it protected."""
        with self.lock:
            return self._protection.release(request_id)

    def protected_paths(self) -> list[list[CachedBlock]]:
        """The locked paths of the waiting requests' protections (for the invariants)."""
        return self._protection.paths()
