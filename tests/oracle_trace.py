"""Helpers shared by the differential tests against libCacheSim (the `oracle` extra).

libCacheSim's oracleGeneral binary format is little-endian `<IQIq` per request: uint32 time,
uint64 object id, uint32 size, int64 virtual time of the object's next request (-1 for none);
its Belady reads the next-access times from there. Every object is written with size 1, so a
cache size of N bytes is N blocks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine_adapter.sim.shipped_traces import shipped_trace

# The Mooncake traces sage ships (gzipped, engine_adapter/sim/traces/): always there, no skip.
MOONCAKE = shipped_trace("mooncake:conversation")[0]
MOONCAKE_SYNTHETIC = shipped_trace("mooncake:synthetic")[0]
ORACLE_RECORD = struct.Struct("<IQIq")
ORACLE_POLICIES = ["lru", "fifo", "lfu", "arc", "s3fifo", "sieve", "mq", "belady"]


def write_oracle_general(path: Path, keys: Sequence[int]) -> None:
    """Write `keys` as an oracleGeneral trace of unit-size objects."""
    n = len(keys)
    next_access = [-1] * n
    seen: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        next_access[i] = seen.get(keys[i], -1)
        seen[keys[i]] = i
    pack = ORACLE_RECORD.pack
    path.write_bytes(b"".join(pack(i, key, 1, next_access[i]) for i, key in enumerate(keys)))


def libcachesim_class(policy: str) -> Any:
    """libCacheSim's class for one of `ORACLE_POLICIES`."""
    import libcachesim as lcs

    return {
        "lru": lcs.LRU,
        "fifo": lcs.FIFO,
        "lfu": lcs.LFU,
        "arc": lcs.ARC,
        "s3fifo": lcs.S3FIFO,
        "sieve": lcs.Sieve,
        "mq": lcs.MQ,
        "belady": lcs.Belady,
    }[policy]
