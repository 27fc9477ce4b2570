"""The KV tiers under the device pool: where each cached block's K/V lives, and the moves.

`TierStore` keeps the host tier and the optional disk tier (`tier_level.TierLevel` each) below
the device radix index (docs/architecture.md, "Tiers"). The device tree stays what it was: the
blocks in device blocks. A block the device policy evicts is *demoted* into a host slot
(`demote`) instead of dropped; the host policy makes room by demoting to disk, or, without a
disk tier, by dropping; a lookup that runs past the device tree into host or disk entries
(`match`) has them *promoted* into fresh device blocks (`promote`). Each decision appends a
`TierMove` for the engine, handed over by `take_moves`, in causal order: a slot is copied out
before it is reused.

The tree property (as SGLang's HiCache keeps it): a block's ancestors are at least as resident
as the block. The device tree is prefix-closed (the radix index evicts leaves only), and so is
the union of all tiers: an entry's parent is cached in some tier. A host entry therefore never
has device children. What may leave a tier:

- a copy of a block that is also on the device (write-through, or a key cached again on the
  device while its old copy stayed below): always; nothing is lost;
- an entry with a tier below it: always, it moves down whatever its children;
- an entry of the last tier: only without children in the tiers (leaf first): it is dropped.

An entry read by a promotion or prefetch in progress is held (not evictable). When a block
leaves every tier while it has descendants below (the device dropped it because the host had no
room, or a move failed), those descendants are dropped too (``orphan``): they are useless past
the gap. Called under the cache manager's lock. Imports `block_keys`, `cached_block`, `events`,
`explain`, `records`, `stats`, `tier_level`, `tier_moves` and the policy library.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.events import EvictionEventLog
from engine_adapter.cache.explain import jsonable
from engine_adapter.cache.records import SwapResult
from engine_adapter.cache.retention import Retention
from engine_adapter.cache.stats import TierStats
from engine_adapter.cache.tier_level import TierEntry, TierLevel
from engine_adapter.cache.tier_moves import Tier, TierMove
from sage_eviction import EntryMeta

__all__ = ["WRITE_POLICIES", "TierConfig", "TierStore"]

WRITE_POLICIES = ("write_back", "write_through")


@dataclass(frozen=True, slots=True)
class TierConfig:
    """The KV tiers a `CacheManager` keeps under its device pool (capacities in blocks; the
    engine converts ``--host-kv-cache 8GiB`` with the pool's bytes per block).

    Attributes:
        host_blocks: Host slots; 0: no tiers at all.
        disk_blocks: Disk slots; 0: no disk tier.
        host_policy, host_policy_params: The host tier's eviction policy (any registered one).
        disk_policy, disk_policy_params: The disk tier's.
        write_policy: ``write_back`` or ``write_through`` (as SGLang's HiCache names them).
        prefetch_blocks: Blocks queued requests' prefetches may hold promoted at once (0: off).
    """

    host_blocks: int = 0
    disk_blocks: int = 0
    host_policy: str = "lru"
    host_policy_params: dict[str, Any] = field(default_factory=dict)
    disk_policy: str = "lru"
    disk_policy_params: dict[str, Any] = field(default_factory=dict)
    write_policy: str = "write_back"
    prefetch_blocks: int = 0

    def __post_init__(self) -> None:
        for name in ("host_blocks", "disk_blocks", "prefetch_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be 0 (off) or a positive number of blocks")

    @property
    def enabled(self) -> bool:
        return self.host_blocks > 0 or self.disk_blocks > 0


class TierStore:
    """The host and disk tiers, their moves and their tree bookkeeping.

    Args:
        host_blocks: Host slots (positive).
        disk_blocks: Disk slots; 0: no disk tier.
        host_policy, host_policy_params: The host tier's policy spec and params.
        disk_policy, disk_policy_params: The disk tier's.
        write_policy: ``write_back`` (copy a block down when the device evicts it) or
            ``write_through`` (copy it to host when it is cached on the device; a promotion
            from host keeps the host copy).
        events: Where ``demote`` / ``promote`` / ``drop`` events go, or None.
        clock: Time source (the policies' access times and the events').
        on_drop: Told the keys of blocks that left every tier (the re-prefill tracker).

    Attributes:
        explain: A tier policy's ``demote`` / ``drop`` event says why it chose (its explanation,
            as the device's ``evict`` events do; O(n) per choice). Set by the eviction step.
        retention: The prompt-cache lifetimes (set by the manager): the last tier's policy never
            chooses an unexpired retained entry; when nothing else may go, the one closest to its
            expiry is dropped and the break counted (`_break_retention`). None: none.
    """

    def __init__(
        self,
        *,
        host_blocks: int,
        disk_blocks: int = 0,
        host_policy: str = "lru",
        host_policy_params: dict[str, Any] | None = None,
        disk_policy: str = "lru",
        disk_policy_params: dict[str, Any] | None = None,
        write_policy: str = "write_back",
        events: EvictionEventLog | None = None,
        clock: Callable[[], float],
        on_drop: Callable[[list[Hashable]], None] | None = None,
    ) -> None:
        if host_blocks <= 0:
            raise ValueError(
                f"host_blocks={host_blocks} must be positive (a disk tier sits under a host tier)"
            )
        if disk_blocks < 0:
            raise ValueError(f"disk_blocks={disk_blocks} must be 0 (off) or positive")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy={write_policy!r} must be one of {', '.join(WRITE_POLICIES)}")
        self.write_through = write_policy == "write_through"
        self.levels = [TierLevel(Tier.HOST, host_blocks, host_policy, host_policy_params)]
        if disk_blocks:
            self.levels.append(TierLevel(Tier.DISK, disk_blocks, disk_policy, disk_policy_params))
        self.events = events
        self._clock = clock
        self._on_drop = on_drop
        self._moves: list[TierMove] = []
        self.explain = False
        self.retention: Retention | None = None
        self.on_dropped: Callable[[Hashable, str, str], None] | None = None  # (key, tier, reason)
        # parent key -> keys of its children that live only below the device (whatever tier
        # the parent is in): what keeps a last-tier entry from being dropped before them
        self._children: dict[Hashable, set[Hashable]] = {}

    @classmethod
    def from_config(
        cls,
        config: TierConfig | None,
        events: EvictionEventLog | None,
        clock: Callable[[], float],
        on_drop: Callable[[list[Hashable]], None],
    ) -> TierStore | None:
        """The tiers `config` asks for, or None when it asks for none."""
        if config is None or not config.enabled:
            return None
        return cls(
            host_blocks=config.host_blocks,
            disk_blocks=config.disk_blocks,
            host_policy=config.host_policy,
            host_policy_params=config.host_policy_params,
            disk_policy=config.disk_policy,
            disk_policy_params=config.disk_policy_params,
            write_policy=config.write_policy,
            events=events,
            clock=clock,
            on_drop=on_drop,
        )

    @property
    def write_policy(self) -> str:
        return "write_through" if self.write_through else "write_back"

    @property
    def host(self) -> TierLevel:
        return self.levels[0]

    # ---- queries ------------------------------------------------------------------------

    def entry(self, key: Hashable) -> TierEntry | None:
        """The host or disk copy of `key`, or None (a key has at most one)."""
        for level in self.levels:
            found = level.entries.get(key)
            if found is not None:
                return found
        return None

    def _level(self, entry: TierEntry) -> TierLevel:
        return self.levels[0] if entry.tier is Tier.HOST else self.levels[1]

    def children_of(self, key: Hashable) -> set[Hashable]:
        """Keys of the below-device children of `key` (a copy; for checks and the tree view)."""
        return set(self._children.get(key, ()))

    def match(self, keys: Sequence[Hashable], start: int) -> list[TierEntry]:
        """The entries continuing a device hit of ``keys[:start]`` below the device: the longest
        run ``keys[start:]`` cached in host or disk, each under the one before."""
        found: list[TierEntry] = []
        parent = keys[start - 1] if start else None
        for key in keys[start:]:
            entry = self.entry(key)
            if entry is None or entry.on_device or entry.parent_key != parent:
                break
            found.append(entry)
            parent = key
        return found

    def take_moves(self) -> list[TierMove]:
        """The moves decided since the last call, in the order the engine must run them."""
        moves, self._moves = self._moves, []
        return moves

    # ---- evictability -----------------------------------------------------------------------

    def _refresh(self, entry: TierEntry) -> None:
        """Tell the entry's tier policy whether it may be chosen (the rules in the docstring)."""
        level = self._level(entry)
        if entry.key not in level.policy:
            return  # chosen and on its way down or out (`_evict_entry`): refreshed where it lands
        has_lower = level is not self.levels[-1]
        should = entry.holds == 0 and (entry.on_device or has_lower or not self._children.get(entry.key))
        if should and not (has_lower or entry.on_device) and self.retention is not None:
            should = not self.retention.protects(entry.key)  # held until it expires
        level.set_evictable(entry, should)

    def refresh_key(self, key: Hashable) -> None:
        """`key`'s retention lapsed: its entry, if any, may be chosen again."""
        found = self.entry(key)
        if found is not None:
            self._refresh(found)

    def _link(self, entry: TierEntry) -> None:
        """`entry` now lives only below the device: it counts as its parent's child."""
        kids = self._children.get(entry.parent_key)
        if kids is None:
            self._children[entry.parent_key] = {entry.key}
        else:
            kids.add(entry.key)
        parent = self.entry(entry.parent_key) if entry.parent_key is not None else None
        if parent is not None:
            self._refresh(parent)

    def _unlink(self, entry: TierEntry) -> None:
        """`entry` is on the device again or gone: its parent loses a below-device child."""
        kids = self._children.get(entry.parent_key)
        if kids is not None:
            kids.discard(entry.key)
            if not kids:
                del self._children[entry.parent_key]
        parent = self.entry(entry.parent_key) if entry.parent_key is not None else None
        if parent is not None:
            self._refresh(parent)

    def hold(self, entries: Sequence[TierEntry]) -> None:
        """Keep `entries` from eviction while a promotion or prefetch reads them."""
        for entry in entries:
            entry.holds += 1
            self._refresh(entry)

    # ---- room, eviction and drops ----------------------------------------------------------

    def _make_room(self, index: int, incoming: Hashable | None = None) -> bool:
        """A free slot in tier `index` for the block `incoming` (None: a copy), evicting one
        entry through its policy if needed; when the last tier's policy may choose none, a
        retained entry that expires before `incoming` gives way (a break)."""
        level = self.levels[index]
        if level.num_free == 0 and self.retention is not None:
            self.retention.expire()
        while level.num_free == 0:
            why = None
            if self.explain and self.events is not None:
                upcoming = level.policy.explain_next(1)
                why = {"tier": level.tier.value, "values": jsonable(upcoming[0][1])} if upcoming else None
            victims = level.policy.evict(1)
            if not victims:
                if index == len(self.levels) - 1 and self._break_retention(level, incoming):
                    continue
                return False
            self._evict_entry(index, level.entries[victims[0]], why)
        return True

    def _break_retention(self, level: TierLevel, incoming: Hashable | None) -> bool:
        """The last tier is full of entries its policy may not choose, and the retained block
        `incoming` comes down: drop the retained entry closest to its expiry that may leave (a
        leaf, not being read), a break, unless `incoming` expires first (the caller drops it:
        the break is its). The retention heap is walked in expiry order (`first_to_expire`),
        not the tier scanned. False when nothing may leave or `incoming` is not retained (it is
        dropped, no break)."""
        retention = self.retention
        if retention is None or incoming is None or incoming not in retention.expiry:
            return False

        def may_leave(key: Hashable) -> bool:
            entry = level.entries.get(key)
            if entry is None or entry.holds or entry.on_device:
                return False
            return not self._children.get(key)  # a leaf below the device: nothing hangs off it

        key = retention.first_to_expire(retention.expiry[incoming], may_leave)
        if key is None:
            return False
        self._drop(level.entries[key], None, "retention_break")  # `forget` counts the break
        return True

    def _evict_entry(self, index: int, entry: TierEntry, why: dict[str, Any] | None = None) -> None:
        """The tier policy chose `entry` (already gone from the policy): move it down or drop it."""
        level = self.levels[index]
        if entry.on_device:
            level.discard(entry)  # a copy of a device block: nothing is lost
            return
        if index + 1 < len(self.levels) and self._make_room(index + 1, entry.key):
            lower = self.levels[index + 1]
            level.discard(entry)
            moved = lower.add(entry.key, entry.parent_key, entry.meta, False)
            self._moves.append(TierMove(level.tier, entry.slot, lower.tier, moved.slot, entry.key))
            level.moved_out += 1
            lower.moved_in += 1
            lower.demotions += 1
            self._event(
                "demote", entry, moved.tier.value, moved.slot, level.binding.name, "evict", explain=why
            )
            self._refresh(moved)
            return
        self._drop(entry, level.binding.name, "evict", why)

    def _drop(
        self, entry: TierEntry, policy: str | None, reason: str, why: dict[str, Any] | None = None
    ) -> None:
        """`entry` leaves every tier; its below-device descendants go with it (``orphan``)."""
        level = self._level(entry)
        level.discard(entry)
        level.drops += 1
        if not entry.on_device:
            self._unlink(entry)
            if self.retention is not None:
                self.retention.forget(entry.key)
            if self.on_dropped is not None:
                self.on_dropped(entry.key, level.tier.value, reason)
        self._event("drop", entry, None, None, policy, reason, explain=why)
        if self._on_drop is not None:
            self._on_drop([entry.key])
        self.drop_below(entry.key)

    def drop_below(self, key: Hashable) -> None:
        """Drop the below-device descendants of `key`, which left every tier (``orphan``)."""
        for child in list(self._children.get(key, ())):
            found = self.entry(child)
            if found is not None:
                self._drop(found, None, "orphan")

    def drop_key(self, key: Hashable, reason: str) -> bool:
        """Drop the copy of `key` (a failed move's block) and its descendants below; whether
        there was one."""
        found = self.entry(key)
        if found is None:
            return False
        self._drop(found, None, reason)
        return True

    # ---- the device's side -----------------------------------------------------------------

    def demote(self, block: CachedBlock, policy: str) -> bool:
        """The device policy (`policy`) evicted `block` (its device block id is about to be
        freed): keep its K/V on host. Returns False when the host has no room (the caller drops
        it and calls `drop_below`)."""
        host = self.host
        entry = self.entry(block.key)
        if entry is not None:  # a copy is already below: nothing to copy
            entry.on_device = False
            host_level = self._level(entry)
            host_level.demotions += 1
            self._link(entry)
            self._event("demote", entry, entry.tier.value, entry.slot, policy, "evict", block.block_id)
            self._refresh(entry)
            return True
        if not self._make_room(0, block.key):
            return False
        entry = host.add(block.key, None if block.parent is None else block.parent.key, block.meta, False)
        self._moves.append(TierMove(Tier.DEVICE, block.block_id, Tier.HOST, entry.slot, block.key))
        host.moved_in += 1
        host.demotions += 1
        self._link(entry)
        self._event("demote", entry, Tier.HOST.value, entry.slot, policy, "evict", block.block_id)
        self._refresh(entry)
        return True

    def cached_on_device(self, blocks: Sequence[CachedBlock]) -> None:
        """`blocks` were newly cached in the device tree: a copy below is now a copy of a
        device block; under write-through, each block without one is copied to host."""
        for block in blocks:
            entry = self.entry(block.key)
            if entry is not None:
                if not entry.on_device:
                    entry.on_device = True
                    self._unlink(entry)
                    self._refresh(entry)
            elif self.write_through and self._make_room(0):
                host = self.host
                parent_key = None if block.parent is None else block.parent.key
                entry = host.add(block.key, parent_key, copy.copy(block.meta), True)
                self._moves.append(TierMove(Tier.DEVICE, block.block_id, Tier.HOST, entry.slot, block.key))
                host.moved_in += 1
                self._refresh(entry)

    def promote(self, entries: Sequence[TierEntry], block_ids: Sequence[int], reason: str) -> list[EntryMeta]:
        """Load held `entries` into device blocks `block_ids` (the caller caches them in the device
        tree); their holds end. A host copy stays under write-through; otherwise the slot is freed.

        Returns:
            The policy records for the device tree (the tier's own under write-back).
        """
        now = self._clock()
        metas: list[EntryMeta] = []
        for entry, block_id in zip(entries, block_ids, strict=True):
            level = self._level(entry)
            self._moves.append(TierMove(entry.tier, entry.slot, Tier.DEVICE, block_id, entry.key))
            level.hits += 1
            level.promotions += 1
            level.moved_out += 1
            self._event("promote", entry, Tier.DEVICE.value, block_id, None, reason)
            entry.holds -= 1
            self._unlink(entry)
            if self.write_through and entry.tier is Tier.HOST:
                entry.on_device = True
                level.policy.access(entry.key, now)
                metas.append(copy.copy(entry.meta))
                self._refresh(entry)
            else:
                level.discard(entry)
                metas.append(entry.meta)
        return metas

    def resident_below(self) -> dict[str, list[Hashable]]:
        """Each lower tier's blocks that are not copies of device blocks (the KV events' view)."""
        return {
            level.tier.value: [k for k, e in level.entries.items() if not e.on_device]
            for level in self.levels
        }

    def clear(self) -> int:
        """Forget every entry (a prefix-cache reset); no moves. Returns entries forgotten."""
        count = 0
        for level in self.levels:
            for entry in list(level.entries.values()):
                level.discard(entry)
                count += 1
        self._children.clear()
        return count

    # ---- policies, stats, events ----------------------------------------------------------

    def level(self, tier: Tier) -> TierLevel:
        """The level of `tier` (HOST or DISK).

        Raises:
            ValueError: No such tier here.
        """
        for level in self.levels:
            if level.tier is tier:
                return level
        raise ValueError(f"no {tier.value} tier (tiers: {', '.join(lv.tier.value for lv in self.levels)})")

    def swap_policy(self, tier: Tier, spec: str, **params: Any) -> SwapResult:
        """Hot swap the policy of `tier` (HOST or DISK), nothing lost.

        Raises:
            ValueError: No such tier here.
            UnknownPolicyError, PolicyParamError: As `resolve_policy`; nothing changed.
        """
        return self.level(tier).swap_policy(spec, **params)

    def stats(self) -> tuple[TierStats, ...]:
        return tuple(level.stats() for level in self.levels)

    def _event(
        self,
        kind: str,
        entry: TierEntry,
        to_tier: str | None,
        to_slot: int | None,
        policy: str | None,
        reason: str,
        device_block: int | None = None,
        explain: dict[str, Any] | None = None,
    ) -> None:
        """A ``demote`` event comes from the device (`device_block`) or from `entry`'s tier;
        `explain` says why the tier's policy chose it (with explanation on)."""
        if self.events is None:
            return
        from_device = device_block is not None
        self.events.tier(
            kind,
            block=format_block_key(entry.key),
            tier=Tier.DEVICE.value if from_device else entry.tier.value,
            slot=device_block if device_block is not None else entry.slot,
            to_tier=to_tier,
            to_slot=to_slot,
            policy=policy,
            reason=reason,
            ts=self._clock(),
            explain=explain,
        )
