"""The request-receipt methods of `CacheManager`, and the wiring of the receipts into the cache
(docs/architecture.md, "Request receipts").

Imports `accounting`, `handoff_lock`, `radix_cache`, `receipts`, `retention`, `sequences`, `tiers`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from engine_adapter.cache.accounting import CacheAccounting
from engine_adapter.cache.handoff_lock import HandoffLock
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.receipts import RequestReceipts
from engine_adapter.cache.retention import Retention
from engine_adapter.cache.sequences import RunningSequences
from engine_adapter.cache.tiers import TierStore

__all__ = ["ReceiptsFront", "attach_receipts"]


def attach_receipts(
    accounting: CacheAccounting,
    running: RunningSequences,
    retention: Retention,
    tiers: TierStore | None,
    radix: RadixCache,
    block_size: int,
    clock: Callable[[], float],
) -> RequestReceipts:
    """A `RequestReceipts` told what the parts do: lookups and evictions (the accounting, whose
    ghost set it reads), writes, grants and blocks not written (the running sequences), lapsed
    lifetimes (the retention) and drops from the last tier (the tiers). Its windows are as long
    as the ghost set."""

    def cached(key: Hashable) -> bool:
        return key in radix or (tiers is not None and tiers.entry(key) is not None)

    ghosts = accounting.ghosts
    receipts = RequestReceipts(block_size, ghosts.capacity, clock, cached, ghost=ghosts.__contains__)
    accounting.receipts = running.receipts = receipts
    retention.on_lapse = receipts.lapsed
    retention.on_break = receipts.broken  # the owners it grants for are `receipts.owner`'s
    if tiers is not None:
        tiers.on_dropped = receipts.dropped
    return receipts


class ReceiptsFront:
    """The request-receipt methods of `CacheManager` (which sets these attributes)."""

    lock: HandoffLock
    _receipts: RequestReceipts

    def request_receipt(self, request_id: str) -> dict[str, Any] | None:
        """What the cache did for a recent request and why it missed what it missed
        (``GET /v1/cache/requests/{id}``); None when unknown or past the table's window."""
        with self.lock:
            return self._receipts.get(request_id)

    def _receipt_fields(self) -> dict[str, Any]:
        """The receipts' fields of `CacheStats` (called under `lock`)."""
        return {"cache_accounts": tuple(self._receipts.accounts())}

    def cache_accounts(self) -> list[dict[str, Any]]:
        """Tokens read per tier and written, and lifetimes granted and refused, per tenant and
        salt (cheap: the engine reads it at each scrape for /metrics)."""
        with self.lock:
            return self._receipts.accounts()
