"""Block moves between KV tiers: what the cache core decided, for the engine to copy."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["Tier", "TierMove"]

class Tier(str, Enum):
    DEVICE = "device"   # the paged KV pool the model reads (GPU memory, or the CPU pool)
    HOST = "host"       # --host-kv-cache: a second tensor pool in host memory
    DISK = "disk"       # --disk-kv-cache: one file per block on local disk

@dataclass(frozen=True, slots=True)
class TierMove:
    """Copy one block's K/V (all layers) from `src` slot of tier `src_tier` to `dst` slot of
    `dst_tier`. Slots are block ids in the device pool, slot indices in the host pool, slot
    indices in the disk store. `key` is the block's radix key (hashable, stable while cached):
    the disk store names and checks its file with it."""
    src_tier: Tier
    src: int
    dst_tier: Tier
    dst: int
    key: object
