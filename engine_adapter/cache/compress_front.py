"""The compress-on-evict methods of `CacheManager` (docs/architecture.md, "Compress on evict").

Without `compress_on_evict` each is a cheap no-op: `take_compress_moves` returns [] and
`compressed_counters` None. Imports `compressed` and `handoff_lock`.
"""

from __future__ import annotations

from engine_adapter.cache.compressed import CompressedPrefixes, CompressMove
from engine_adapter.cache.handoff_lock import HandoffLock

__all__ = ["CompressFront"]


class CompressFront:
    """The compress-on-evict methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    _compressed: CompressedPrefixes | None

    @property
    def compressed(self) -> CompressedPrefixes | None:
        """The compressed prefixes, or None when compress-on-evict is off (read-only use)."""
        return self._compressed

    def take_compress_moves(self) -> list[CompressMove]:
        """The compactions decided since the last call, in order: the engine runs them before
        the forward pass of the step that decided them ([] when off)."""
        with self.lock:
            return [] if self._compressed is None else self._compressed.take_moves()

    def compressed_counters(self) -> dict[str, int] | None:
        """Entries and blocks held, compressions, drops and hits (None when off)."""
        with self.lock:
            return None if self._compressed is None else self._compressed.counters()
