"""Block keys: the chained hashes that name a prompt's full blocks (docs/architecture.md, "Cache core").

A block's key is a hash of its parent's key, its token ids and an isolation key (``cache_salt``
or tenant), so equal keys mean equal prefixes. Callers that already have chained block ids (the
Mooncake traces' ``hash_ids``) use them as keys directly. The radix index (`radix_cache`) and a
request's keys (`prompt_keys`) are built on these functions; this module imports nothing of the
cache.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Hashable, Sequence

__all__ = ["block_hashes", "format_block_key", "root_key"]

_KEY_BYTES = 16  # 128-bit keys: collisions are negligible at any cache size


def root_key(salt: str | bytes | None = None) -> int:
    """The chain's starting key for an isolation key (``cache_salt`` or tenant); stable across
    processes and machines."""
    if salt is None:
        data = b"sage/root"
    elif isinstance(salt, str):
        data = b"sage/root/" + salt.encode("utf-8")
    else:
        data = b"sage/root/" + bytes(salt)
    return int.from_bytes(hashlib.blake2b(data, digest_size=_KEY_BYTES).digest(), "little")


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    salt: str | bytes | None = None,
    parent: int | None = None,
    start_block: int = 0,
) -> list[int]:
    """Chained keys of the full blocks of `token_ids`.

    Key of block i = blake2b(key of block i-1 || token ids of block i, as little-endian int64),
    128 bits, as an int; block 0 chains from `root_key(salt)`.

    Args:
        token_ids: Token ids of the sequence from its start.
        block_size: Tokens per block.
        salt: Isolation key; different salts never share blocks.
        parent: Key of block `start_block - 1` when continuing a chain (then `salt` is unused).
        start_block: First block to hash (the earlier ones are already known).

    Returns:
        Keys of blocks `start_block .. len(token_ids) // block_size - 1`.
    """
    prev = root_key(salt) if parent is None else parent
    keys: list[int] = []
    n_full = len(token_ids) // block_size
    pack = struct.Struct(f"<{block_size}q").pack
    blake = hashlib.blake2b
    for i in range(start_block, n_full):
        chunk = token_ids[i * block_size : (i + 1) * block_size]
        digest = blake(prev.to_bytes(_KEY_BYTES, "little") + pack(*chunk), digest_size=_KEY_BYTES).digest()
        prev = int.from_bytes(digest, "little")
        keys.append(prev)
    return keys


def format_block_key(key: Hashable) -> str:
    """A block key for logs: hex for int keys, ``str`` otherwise."""
    if isinstance(key, int):
        return f"{key:x}" if key >= 0 else str(key)
    if isinstance(key, bytes):
        return key.hex()
    return str(key)
