"""Per-salt quotas: the most device and host blocks one isolation key may hold (issue 51, item 4).

A quota names a salt (the request's isolation key: its ``cache_salt``, or its tenant when
tenants are isolated) and caps what its *cached* blocks may hold (docs/architecture.md,
"Per-salt quotas"):

- ``device_blocks``: blocks of the salt in the device prefix cache. A running sequence's private
  blocks (not yet cached) do not count: capping them would refuse or preempt requests, and a
  quota never does either. Cached blocks a running sequence holds do count (they are the
  salt's cache). When the salt is at its quota, each block it would newly cache (at a commit or
  a finish) first makes the cache evict one of the salt's *own* evictable blocks, the one the
  policy would take first among them (its `rank`; the least recently used where the policy has
  no fixed rank), demoted to host as any device victim; another salt's blocks are never
  touched. When the salt has nothing evictable, the block is not cached: it stays the
  sequence's and is freed at its finish. A promotion from host into the device is cut to the
  room the quota leaves (the rest is recomputed and cached under the rule above).
- ``host_blocks``: the salt's blocks living on the host tier only (write-through copies of
  device blocks are not counted: dropping them loses nothing). A demotion that takes the salt
  past its quota drops its own oldest host blocks (leaves first), never another salt's.

What counts is what the cache has *seen* of the salt since the quota was set: the blocks it
wrote, hit or had promoted (a block's key is a one-way hash of its salt, so an older block's
salt cannot be read back); set quotas before a tenant's traffic, or reset the cache.

Bookkeeping, bounded: at most `MAX_QUOTA_SALTS` salts have a quota; each keeps the device blocks
it was seen with (kept exact: every exit from the device tree tells `left`) and the host keys it
demoted (checked against the host tier when counted); `owner` maps those keys back to their salt
(a demoted device victim's). A write costs O(the salt's blocks) only when it is at its quota (one
pass to rank its evictable blocks), never O(the pool), and nothing without quotas. Called under
the cache manager's lock. Imports `cached_block`, `radix_cache` and `tiers`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.tiers import TierStore

__all__ = ["MAX_QUOTA_SALTS", "QuotaLimitError", "SaltQuota", "SaltQuotas"]

MAX_QUOTA_SALTS = 1024
"""The most salts that may have a quota at once: bounds the books and the /metrics labels."""

_SLACK = 16  # stale entries a salt's books may hold beyond twice its live count before compaction


class QuotaLimitError(ValueError):
    """`MAX_QUOTA_SALTS` salts have a quota already; a new salt's quota is refused."""


@dataclass(frozen=True, slots=True)
class SaltQuota:
    """The caps of one salt (None: that tier is not capped).

    Attributes:
        device_blocks: The most cached device blocks the salt may hold.
        host_blocks: The most host-only blocks the salt may hold.
    """

    device_blocks: int | None = None
    host_blocks: int | None = None

    def __post_init__(self) -> None:
        for name in ("device_blocks", "host_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}={value!r} must be null or a number of blocks (0 or more)")


@dataclass(slots=True)
class _Books:
    """What one salt with a quota holds, as far as the cache has seen it, and its counters."""

    quota: SaltQuota
    device: dict[Hashable, CachedBlock] = field(default_factory=dict)  # seen in the device tree
    host: dict[Hashable, None] = field(default_factory=dict)  # demoted to host, oldest first
    live_device: int = 0  # at the last count
    live_host: int = 0
    device_evictions: int = 0  # its own blocks evicted to make room for its writes
    not_cached: int = 0  # blocks it could not cache (nothing of its own evictable)
    promotions_cut: int = 0  # promotions refused by the quota (recomputed instead)
    host_drops: int = 0  # its own host blocks dropped past its host quota


class SaltQuotas:
    """The quotas by salt and their enforcement (see the module docstring).

    Args:
        radix: The device tree (what a salt's device blocks are checked against).
        tiers: The host/disk tiers, or None (host quotas are then recorded, never reached).
        evict_own: Evicts the given evictable device blocks of one salt (demoted, freed,
            counted; `EvictionStep.evict_chosen`), or None: nothing is evicted for a quota (the
            block is not cached instead).
    """

    def __init__(
        self,
        radix: RadixCache,
        tiers: TierStore | None,
        evict_own: Callable[[list[CachedBlock]], int] | None,
    ) -> None:
        self._radix = radix
        self._tiers = tiers
        self._evict_own = evict_own
        self._books: dict[str, _Books] = {}
        self.owner: dict[Hashable, str] = {}  # key -> salt, for the keys in some salt's books

    def __len__(self) -> int:
        return len(self._books)

    def __bool__(self) -> bool:
        return bool(self._books)

    def tracks(self, salt: str | None) -> bool:
        """Whether `salt` has a quota (its writes are seen and counted)."""
        return salt is not None and salt in self._books

    # ---- the record ---------------------------------------------------------------------------

    def set(self, salt: str, quota: SaltQuota) -> None:
        """Give `salt` `quota` (replacing one it had: what it holds stays counted).

        Raises:
            QuotaLimitError: `salt` is new and `MAX_QUOTA_SALTS` salts have a quota.
        """
        books = self._books.get(salt)
        if books is not None:
            books.quota = quota
            return
        if len(self._books) >= MAX_QUOTA_SALTS:
            raise QuotaLimitError(
                f"{MAX_QUOTA_SALTS} salts have a quota already (the most there may be); delete one first"
            )
        self._books[salt] = _Books(quota)

    def get(self, salt: str) -> SaltQuota | None:
        """`salt`'s quota, or None."""
        books = self._books.get(salt)
        return None if books is None else books.quota

    def delete(self, salt: str) -> bool:
        """Drop `salt`'s quota and books; whether it had one."""
        books = self._books.pop(salt, None)
        if books is None:
            return False
        for key in (*books.device, *books.host):
            self.owner.pop(key, None)
        return True

    def clear_books(self) -> None:
        """Forget every salt's blocks, keeping the quotas (a prefix-cache reset)."""
        for books in self._books.values():
            books.device.clear()
            books.host.clear()
            books.live_device = books.live_host = 0
        self.owner.clear()

    # ---- counting -----------------------------------------------------------------------------

    def device_count(self, salt: str) -> int:
        """`salt`'s blocks in the device tree now (its books pruned of blocks that left)."""
        books = self._books[salt]
        get = self._radix.get
        gone = [k for k, b in books.device.items() if get(k) is not b]
        books.live_device = self._forget(books.device, books.host, gone)
        return books.live_device

    def host_count(self, salt: str) -> int:
        """`salt`'s host-only blocks now (its books pruned of keys that left the host or are
        device copies again)."""
        books = self._books[salt]
        if self._tiers is None:
            return 0
        entries = self._tiers.host.entries
        gone = [k for k in books.host if (e := entries.get(k)) is None or e.on_device]
        books.live_host = self._forget(books.host, books.device, gone)
        return books.live_host

    def _forget(self, tier: dict[Hashable, Any], other: dict[Hashable, Any], gone: list[Hashable]) -> int:
        """`gone` leave a salt's books of one tier (a key's owner too once the salt's `other`
        tier lacks it): the tier's size after."""
        for key in gone:
            del tier[key]
            if key not in other:
                self.owner.pop(key, None)
        return len(tier)

    def _seen_on_device(self, salt: str, blocks: Sequence[CachedBlock]) -> None:
        books = self._books[salt]
        device, owner = books.device, self.owner
        for block in blocks:
            device[block.key] = block
            owner[block.key] = salt
        if len(device) > 2 * books.live_device + _SLACK:
            self.device_count(salt)  # compaction: stale entries never outgrow the live ones

    # ---- enforcement ------------------------------------------------------------------------------

    def left(self, blocks: Sequence[CachedBlock]) -> None:
        """`blocks` left the device tree (evicted, demoted, removed): out of their salt's books,
        which so stay exact. Called after a demotion has entered a victim in its host books."""
        owner, books_of = self.owner, self._books
        for block in blocks:
            salt = owner.get(block.key)
            if salt is None:
                continue
            books = books_of[salt]
            if books.device.get(block.key) is block:
                del books.device[block.key]
                if block.key not in books.host:
                    del owner[block.key]

    def seen(self, salt: str | None, blocks: Sequence[CachedBlock]) -> None:
        """`blocks` of `salt` are in the device tree (it hit them, or cached them within `room`)."""
        if blocks and salt is not None and salt in self._books:
            self._seen_on_device(salt, blocks)

    def room(self, salt: str | None, wanted: int, *, evict: bool = True) -> int:
        """How many of `wanted` new device blocks `salt` may cache now; when short and `evict`,
        its own evictable blocks are evicted first, in policy order, to make room."""
        books = None if salt is None else self._books.get(salt)
        if books is None or books.quota.device_blocks is None or wanted <= 0:
            return wanted
        assert salt is not None  # books exist only for a salt
        cap = books.quota.device_blocks
        short = wanted - (cap - len(books.device))  # the books are exact (`left`)
        if short > 0 and evict and self._evict_own is not None:
            books.device_evictions += self._evict_own_blocks(books, short)
            short = wanted - (cap - len(books.device))
        return wanted if short <= 0 else max(wanted - short, 0)

    def refused(self, salt: str | None, n: int, *, promotion: bool = False) -> None:
        """`n` blocks of `salt` were not cached (or not promoted) because of its quota."""
        books = None if salt is None else self._books.get(salt)
        if books is not None and n > 0:
            if promotion:
                books.promotions_cut += n
            else:
                books.not_cached += n

    def _evict_own_blocks(self, books: _Books, n: int) -> int:
        """Evict up to `n` of the salt's evictable device blocks, one at a time in the order the
        policy would take them among themselves: the smallest `rank` where the policy has one,
        else the least recently used; a parent left a leaf by its child's eviction joins the
        candidates, as in the policy's own order. One pass over the salt's books, then a heap.
        Returns blocks evicted."""
        assert self._evict_own is not None  # checked by the caller
        heap = [(self._rank(b), i, b) for i, b in enumerate(books.device.values()) if b.evictable]
        heapq.heapify(heap)
        pushed, evicted = len(heap), 0
        device = books.device
        while evicted < n and heap:
            block = heapq.heappop(heap)[2]
            evicted += self._evict_own([block])  # it leaves the books there (`left`)
            parent = block.parent
            if parent is not None and parent.evictable and device.get(parent.key) is parent:
                pushed += 1
                heapq.heappush(heap, (self._rank(parent), pushed, parent))
        return evicted

    def _rank(self, block: CachedBlock) -> Any:
        """The device policy's sort key for `block`; its last access where the policy has no
        fixed key (an adaptive order: ARC, S3-FIFO, SIEVE, SLRU, MQ)."""
        rank = self._radix.policy.rank(block.key)
        return (block.meta.last_access,) if rank is None else rank

    def demoted(self, key: Hashable) -> list[Hashable]:
        """The device victim `key` was demoted to host: if its salt has a host quota it joins
        the salt's host books; returns the salt's own oldest host keys to drop to stay within
        its quota (leaves first: a key with a below-device child waits until its child goes)."""
        salt = self.owner.get(key)
        books = None if salt is None else self._books.get(salt)
        if books is None or books.quota.host_blocks is None:
            return []
        assert salt is not None
        cap = books.quota.host_blocks
        books.host[key] = None
        if len(books.host) <= cap or self.host_count(salt) <= cap:
            return []
        return self._oldest_host(books, books.live_host - cap)

    def _oldest_host(self, books: _Books, n: int) -> list[Hashable]:
        tiers = self._tiers
        assert tiers is not None  # only a tiered cache demotes
        leaves = [k for k in books.host if not tiers.children_of(k)]
        return leaves[:n]

    def dropped_host(self, demoted: Hashable) -> None:
        """One host block of the salt of `demoted` was dropped for its host quota."""
        salt = self.owner.get(demoted)
        if salt is not None:
            self._books[salt].host_drops += 1

    # ---- views ------------------------------------------------------------------------------------

    def view(self, salt: str) -> dict[str, Any]:
        """`salt`'s quota, use now and counters (the API's answer)."""
        books = self._books[salt]
        return {
            "salt": salt,
            "device_blocks": books.quota.device_blocks,
            "host_blocks": books.quota.host_blocks,
            "device_blocks_used": self.device_count(salt),
            "host_blocks_used": self.host_count(salt),
            "device_evictions": books.device_evictions,
            "not_cached_blocks": books.not_cached,
            "promotions_cut": books.promotions_cut,
            "host_drops": books.host_drops,
        }

    def views(self) -> list[dict[str, Any]]:
        """Every quota's `view`, by salt (at most `MAX_QUOTA_SALTS`)."""
        return [self.view(salt) for salt in sorted(self._books)]

    def stats(self) -> tuple[dict[str, Any], ...]:
        """`views` for `CacheStats.salt_quotas` (empty, and free, without quotas)."""
        return tuple(self.views()) if self._books else ()
