"""Retention: the minimum lifetime a prompt-cache contract asks for its blocks (issue 51).

A request with a `CacheContract.ttl_s` gives each block it writes or hits an expiry (its
admission time plus the lifetime, never shortened by a later, shorter grant; a hit refreshes
it). Retention does not decide *order*: the block policies still choose their victims. It bounds
what may be *dropped* (docs/architecture.md, "Retention"):

- With KV tiers (`TierStore`), a device victim is demoted as always, and host to disk; only the
  last tier's policy is kept from choosing an unexpired retained entry (`protects`). When that
  tier holds nothing else it may drop, the entry closest to its expiry goes and the break is
  counted (`TierStore._break_retention`).
- Without a lower tier there is nowhere to demote to, so a retained block holds a *retention
  pin* on the device (one pin, on a root path, as `Pins` holds system prompts) until it
  expires; such pins hold at most `max_retained_fraction` of the pool: beyond it a grant is
  refused (the request's `retention_ttl_s` says 0). When an allocation would fall short, pins
  are given up, closest to expiry first (`unpin_for`), and each counts as a break: retention
  never refuses nor preempts a request.

Expiries sit in a dict by key and in a heap of (expiry, -depth, key) with lazy deletion: a
parent's expiry is never before its child's (every grant covers a root path with one time), so
the heap lets children go first and pins stay path-closed. Both shrink as blocks expire or
leave every tier: nothing grows with the requests served. Called under the cache manager's lock.
Imports `cached_block`, `contract`, `radix_cache`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.contract import CacheContract
from engine_adapter.cache.radix_cache import RadixCache

__all__ = ["Retention", "RetentionConfig"]


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """What the engine grants of a prompt-cache contract.

    Attributes:
        max_ttl_s: The longest lifetime granted (`--max-cache-ttl`); a longer ask is shortened.
        max_retained_fraction: Without a lower tier, the most of the device pool retained blocks
            may hold (`--max-retained-fraction`); 0 grants no retention there.
        cache_generated: Cache a finished request's generated tokens' blocks
            (`--cache-generated-tokens`); False frees them at finish.
    """

    max_ttl_s: float = 86400.0
    max_retained_fraction: float = 0.25
    cache_generated: bool = True

    def __post_init__(self) -> None:
        if not self.max_ttl_s >= 0:
            raise ValueError(f"max_ttl_s={self.max_ttl_s!r} must be 0 or more seconds")
        if not 0.0 <= self.max_retained_fraction <= 1.0:
            raise ValueError(f"max_retained_fraction={self.max_retained_fraction!r} must be within [0, 1]")


class Retention:
    """Each retained block's expiry, the grants, expiries and breaks.

    Args:
        config: What may be granted (None: the defaults).
        radix: The device index (retention pins, without tiers).
        clock: Time source (virtual in simulation and tests).
        tiered: A lower tier exists: retention demotes instead of pinning.

    Attributes:
        on_expire: Told each key whose retention lapsed (the tiers refresh its entry).
        on_lapse: Told each key whose retention lapsed, and when (the request receipts).
        granted, refused, broken, expired: Counters, in blocks.
    """

    def __init__(
        self, config: RetentionConfig | None, radix: RadixCache, clock: Callable[[], float], *, tiered: bool
    ) -> None:
        self.config = config = config or RetentionConfig()
        self._radix = radix
        self._clock = clock
        self.tiered = tiered
        self.max_pinned_blocks = int(config.max_retained_fraction * radix.num_blocks)
        self.expiry: dict[Hashable, float] = {}
        # Whose lifetime each retained block serves (the last grant's `owner`, opaque here): the
        # same keys as `expiry`, so bounded as it is; a break is billed to it (`on_break`).
        self.owners: dict[Hashable, object] = {}
        self.on_break: Callable[[Any], None] | None = None  # told the owner of each break
        self._heap: list[tuple[float, int, Hashable]] = []
        self.on_expire: Callable[[Hashable], None] | None = None
        self.on_lapse: Callable[[Hashable, float], None] | None = None  # (key, when): the receipts
        self.granted = self.refused = self.broken = self.expired = 0

    def __len__(self) -> int:
        return len(self.expiry)

    def ttl_for(self, contract: CacheContract | None) -> float | None:
        """The lifetime granted for `contract`'s ask (bounded by `max_ttl_s`), or None."""
        if contract is None or contract.ttl_s is None or contract.ttl_s <= 0:
            return None
        return min(contract.ttl_s, self.config.max_ttl_s)

    def protects(self, key: Hashable) -> bool:
        """Whether `key` is retained: not yet let go by `expire` (which runs before each choice
        that could drop it, so a lifetime is never cut short, only let go at the next choice)."""
        return key in self.expiry

    # ---- grants -------------------------------------------------------------------------------

    def grant(self, blocks: Sequence[CachedBlock], until: float, owner: object = None) -> bool:
        """Retain `blocks` (a root path's run, root first) until `until` (never shortening a
        longer retention), for `owner` (whom a break is billed to). Returns False when the device
        share refused some (then the rest, so that pins stay path-closed)."""
        self.expire()
        expiry, owners = self.expiry, self.owners
        for i, block in enumerate(blocks):
            old = expiry.get(block.key)
            if old is not None and old >= until:
                continue
            if old is None and not self.tiered and not self._pin(block):
                self.refused += len(blocks) - i
                return False
            expiry[block.key] = until
            owners[block.key] = owner
            heapq.heappush(self._heap, (until, -block.depth, block.key))
            self.granted += 1
        if len(self._heap) > 2 * len(expiry) + 64:  # refreshes leave stale entries: compact
            self._heap = [(t, d, k) for t, d, k in self._heap if expiry.get(k) == t]
            heapq.heapify(self._heap)
        return True

    def _pin(self, block: CachedBlock) -> bool:
        """A retention pin on `block` when the device share, the pin limit and the path allow."""
        radix = self._radix
        parent = block.parent
        if parent is not None and parent.key not in self.expiry:
            return False  # its parent holds no retention pin: pins must stay path-closed
        if len(self.expiry) >= self.max_pinned_blocks or radix.num_pinned >= radix.max_pinned:
            return False
        radix.pin([block])
        return True

    # ---- expiry, drops and breaks ---------------------------------------------------------------

    def expire(self) -> int:
        """Let every retention that lapsed by now go (unpinned, or its tier entry made
        evictable); returns how many."""
        heap, expiry = self._heap, self.expiry
        now = self._clock()
        count = 0
        while heap and heap[0][0] <= now:
            until, _, key = heapq.heappop(heap)
            if expiry.get(key) != until:
                continue  # refreshed since, or gone
            del expiry[key]
            self.owners.pop(key, None)
            self._release(key)
            if self.on_lapse is not None:
                self.on_lapse(key, until)
            count += 1
        self.expired += count
        return count

    def first_to_expire(self, limit: float, eligible: Callable[[Hashable], bool]) -> Hashable | None:
        """The retained key that expires first (ties: the deepest, then the smallest key) among
        those `eligible` accepts, if it expires no later than `limit`; else None.

        Walks the heap in expiry order without changing it (a frontier heap of heap indices: a
        node's children come after it), so a choice costs O(k log k) for the k entries it passes
        over (stale ones, ones `eligible` refuses), never a scan of every retained block: a
        lower tier full of retained blocks asks this at every block that comes down."""
        heap, expiry = self._heap, self.expiry
        while heap and expiry.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # stale (refreshed or forgotten): garbage at the front, gone for good
        frontier: list[tuple[tuple[float, int, Hashable], int]] = [(heap[0], 0)] if heap else []
        while frontier:
            (until, _, key), index = heapq.heappop(frontier)
            if until > limit:
                return None
            if expiry.get(key) == until and eligible(key):
                return key
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return None

    def _release(self, key: Hashable) -> None:
        if not self.tiered:
            block = self._radix.get(key)
            if block is not None and block.pin_count > 0:
                self._radix.unpin([block])
        elif self.on_expire is not None:
            self.on_expire(key)

    def forget(self, key: Hashable) -> None:
        """`key` left every tier: an unexpired retention ends with it, counted as a break."""
        until = self.expiry.pop(key, None)
        owner = self.owners.pop(key, None)
        if until is not None and until > self._clock():
            self._break(owner)

    def _break(self, owner: object) -> None:
        """One retained block dropped before its expiry, billed to `owner`."""
        self.broken += 1
        if self.on_break is not None and owner is not None:
            self.on_break(owner)

    def unpin_for(self, need: int, path: Sequence[CachedBlock]) -> bool:
        """Without tiers: give up retention pins, closest to expiry first, until `need` more
        blocks beside the locked `path` are reclaimable; each is a break. False (nothing changed)
        when even all of them would not make `need`."""
        if self.tiered or need <= 0:
            return need <= 0
        skip = {id(b) for b in path}
        get = self._radix.get
        blocks = [b for k in self.expiry if (b := get(k)) is not None]
        if sum(1 for b in blocks if b.ref_count == 0 and b.pin_count == 1 and id(b) not in skip) < need:
            return False
        heap, expiry = self._heap, self.expiry
        while need > 0 and heap:
            until, _, key = heapq.heappop(heap)
            if expiry.get(key) != until:
                continue
            del expiry[key]
            self._release(key)
            self._break(self.owners.pop(key, None))
            block = get(key)
            if block is not None and block.ref_count == 0 and block.pin_count == 0 and id(block) not in skip:
                need -= 1
        return True

    def clear(self) -> None:
        """Forget every retention (a prefix-cache reset): pins go, children first; no breaks."""
        heap, expiry = self._heap, self.expiry
        while heap:
            until, _, key = heapq.heappop(heap)
            if expiry.get(key) == until:
                del expiry[key]
                self._release(key)
        expiry.clear()
        self.owners.clear()

    def counters(self) -> dict[str, Any]:
        """The counters for `CacheStats` (blocks); `retained_blocks` is the unexpired count now."""
        self.expire()
        return {
            "retained_blocks": len(self.expiry),
            "retention_granted_blocks": self.granted,
            "retention_refused_blocks": self.refused,
            "retention_broken_blocks": self.broken,
            "retention_expired_blocks": self.expired,
        }
