"""The per-salt quota methods of `CacheManager` (docs/architecture.md, "Per-salt quotas").

Imports `eviction`, `handoff_lock`, `quotas`, `radix_cache` and `tiers`.
"""

from __future__ import annotations

from typing import Any

from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.quotas import SaltQuota, SaltQuotas
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.tiers import TierStore

__all__ = ["QuotaFront"]


class QuotaFront:
    """The quota methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    _quotas: SaltQuotas

    def _bind_quotas(
        self, radix: RadixCache, tiers: TierStore | None, eviction: EvictionStep, *, evict_own: bool
    ) -> SaltQuotas:
        """The manager's quotas, told to `eviction` (host quotas act on its demotions); without
        `evict_own` (compress-on-evict) a salt at its quota does not cache instead of evicting."""
        quotas = self._quotas = eviction.quotas = SaltQuotas(
            radix, tiers, eviction.evict_chosen if evict_own else None
        )
        return quotas

    def _quota_fields(self) -> dict[str, Any]:
        """The quotas' fields of `CacheStats` (called under `lock`)."""
        return {"salt_quotas": self._quotas.stats()}

    def set_quota(self, salt: str, device_blocks: int | None = None, host_blocks: int | None = None) -> None:
        """Cap what `salt` may cache on the device and hold on host (None: that tier uncapped);
        replaces its quota. Takes effect at its next write or demotion.

        Raises:
            ValueError: A negative or non-integer cap.
            QuotaLimitError: `salt` is new and `quotas.MAX_QUOTA_SALTS` salts have a quota.
        """
        quota = SaltQuota(device_blocks, host_blocks)
        with self.lock:
            self._quotas.set(salt, quota)

    def quota(self, salt: str) -> dict[str, Any] | None:
        """`salt`'s quota, its use now and its counters, or None when it has none."""
        with self.lock:
            return self._quotas.view(salt) if self._quotas.get(salt) is not None else None

    def quotas(self) -> list[dict[str, Any]]:
        """Every quota as `quota` gives it, by salt."""
        with self.lock:
            return self._quotas.views()

    def delete_quota(self, salt: str) -> bool:
        """Drop `salt`'s quota (what it holds stays cached); whether it had one."""
        with self.lock:
            return self._quotas.delete(salt)
