"""The disk tier of the KV cache (``--disk-kv-cache DIR --disk-kv-size SIZE``): one file per block.

The host tier demotes here what it would otherwise drop (issue 30; LMCache's local disk backend
does the same). A slot's file is ``s<slot>-<digest>.kv``, `digest` a stable 128-bit blake2b of
the block's radix key (`key_digest`), so a read of (slot, key) opens only a file written for that
very block in that very slot: a slot since given to another block has another file name.

A file is a header and the block's bytes::

    b"SAGEKV" 0x00 0x01 | header length (u32, little-endian) | header (compact JSON) | payload

The header says the key's digest, the dtype, the shape ``[2, num_layers, block_size,
num_kv_heads, head_dim]`` (K then V), the payload's length and its blake2b checksum. A read checks
every field against what this store expects and the checksum against the payload: a missing,
truncated, corrupt or foreign file is a failed read (`read_blocks` says which), never K/V of the
wrong block. Files are written to a temporary name and renamed, so a reader (or a crash) never
sees half a file. They are not fsync'ed: the tier is a cache of one engine's lifetime, and a file
lost to a power cut is a failed read like any other.

The store owns the files of its pattern in its folder: it removes those a previous engine left
(the cache core knows nothing of them), and nothing else.

Imports: torch and the model's KV pool.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

import torch

from engine_adapter.model.kv_pool import PagedKVPool, check_positive_ints, resolve_dtype

__all__ = ["DiskKVStore", "key_digest"]

_MAGIC = b"SAGEKV\x00\x01"
_LEN = struct.Struct("<I")
_MAX_HEADER = 4096
_FILE = re.compile(r"^\.?s[0-9]+-[0-9a-f]{32}\.kv(\.tmp)?$")


def _key_bytes(key: object) -> bytes:
    """A canonical byte string of a radix key: ints (the chained block hashes, Mooncake's
    hash_ids), strings, bytes and tuples of them. ``hash()`` is salted per process for strings,
    and ``repr`` of other objects may hold an address: neither names a file stably."""
    if isinstance(key, bool):
        return b"?" + str(int(key)).encode()
    if isinstance(key, int):
        return b"i" + str(key).encode()
    if isinstance(key, str):
        return b"s" + key.encode("utf-8")
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, tuple):
        parts = [_key_bytes(item) for item in key]
        return b"t" + b"".join(_LEN.pack(len(p)) + p for p in parts)
    raise TypeError(f"a disk KV block key is an int, str, bytes or a tuple of them, not {type(key).__name__}")


def key_digest(key: object) -> str:
    """The 32 hex digits that name `key`'s files: stable across processes and machines."""
    return hashlib.blake2b(_key_bytes(key), digest_size=16).hexdigest()


class DiskKVStore:
    """Blocks of K/V in files under `directory`, `num_blocks` slots.

    Args:
        directory: The folder (created when missing).
        num_blocks: Slots of the store (``--disk-kv-size`` over the pool's bytes per block).
        num_layers, num_kv_heads, head_dim, block_size, dtype: The device pool's block shape.

    Raises:
        ValueError: A bad shape, or a folder that cannot be created or written.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        num_blocks: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype | str = torch.float32,
    ) -> None:
        check_positive_ints(
            num_blocks=num_blocks,
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
        )
        self.directory = Path(directory)
        self.num_blocks = num_blocks
        self.dtype = resolve_dtype(dtype)
        self.num_layers = num_layers
        self.block_shape = (block_size, num_kv_heads, head_dim)
        self.bytes_per_block = PagedKVPool.bytes_for_block(
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            dtype=self.dtype,
        )
        self._slot_files: list[str | None] = [None] * num_blocks
        self._open_directory()

    @classmethod
    def like(cls, pool: PagedKVPool, directory: str | os.PathLike[str], num_blocks: int) -> DiskKVStore:
        """A store of `num_blocks` slots for blocks of `pool` (same shape and dtype)."""
        return cls(
            directory,
            num_blocks,
            num_layers=pool.num_layers,
            num_kv_heads=pool.num_kv_heads,
            head_dim=pool.head_dim,
            block_size=pool.block_size,
            dtype=pool.dtype,
        )

    def _open_directory(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"disk KV cache folder {self.directory}: {exc.strerror or exc}") from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ValueError(f"disk KV cache folder {self.directory} is not writable")
        for entry in os.scandir(self.directory):
            if _FILE.match(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def path_of(self, slot: int, key: object) -> Path:
        """The file of `key` in `slot`."""
        return self.directory / f"s{slot}-{key_digest(key)}.kv"

    def _header(self, key: object, payload: memoryview | None = None, nbytes: int | None = None) -> bytes:
        fields = {
            "key": key_digest(key),
            "dtype": str(self.dtype).removeprefix("torch."),
            "shape": [2, self.num_layers, *self.block_shape],
            "nbytes": self.bytes_per_block if nbytes is None else nbytes,
            "blake2b": "" if payload is None else hashlib.blake2b(payload, digest_size=16).hexdigest(),
        }
        return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode("ascii")

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_blocks:
            raise IndexError(f"disk slot {slot} is outside the disk store's {self.num_blocks} slots")

    # ---- writes ----------------------------------------------------------------------------

    def write_blocks(
        self,
        slots: Sequence[int],
        keys: Sequence[object],
        k: Sequence[torch.Tensor],
        v: Sequence[torch.Tensor],
    ) -> list[bool]:
        """Write block i of the batch (layer l's K is ``k[l][i]``) to ``slots[i]`` as ``keys[i]``.

        Returns:
            Per block, whether its file is in place (False: an OS error such as a full disk; the
            slot then holds nothing and a read of it fails).
        """
        for slot in slots:
            self._check_slot(slot)
        if len(slots) != len(keys):
            raise ValueError(f"{len(slots)} slots for {len(keys)} keys")
        # [n, 2, layers, block_size, heads, head_dim]: each block's bytes contiguous, one copy.
        blocks = torch.stack([torch.stack(list(k)), torch.stack(list(v))]).to("cpu", self.dtype)
        blocks = blocks.permute(2, 0, 1, 3, 4, 5).contiguous()
        return [
            self._write_one(slot, key, blocks[i])
            for i, (slot, key) in enumerate(zip(slots, keys, strict=True))
        ]

    def _write_one(self, slot: int, key: object, block: torch.Tensor) -> bool:
        self._drop_slot(slot)
        payload = block.view(torch.uint8).numpy().data.cast("B")
        header = self._header(key, payload, payload.nbytes)
        path = self.path_of(slot, key)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_MAGIC + _LEN.pack(len(header)) + header)
                f.write(payload)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self._slot_files[slot] = path.name
        return True

    def _drop_slot(self, slot: int) -> None:
        """Remove the file `slot` held: the slot now means another block (or none)."""
        old = self._slot_files[slot]
        self._slot_files[slot] = None
        if old is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / old)

    # ---- reads -----------------------------------------------------------------------------

    def read_blocks(
        self, slots: Sequence[int], keys: Sequence[object]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[bool]]:
        """Blocks of `slots` (written as `keys`), as per-layer ``[n, block_size, heads, head_dim]``
        CPU tensors of K and V, and per block whether it was read (False: missing, truncated,
        corrupt or written for another key; its rows are zeros)."""
        for slot in slots:
            self._check_slot(slot)
        n = len(slots)
        raw = torch.zeros((n, self.bytes_per_block), dtype=torch.uint8)
        ok = [
            self._read_one(slot, key, raw[i]) for i, (slot, key) in enumerate(zip(slots, keys, strict=True))
        ]
        for i, good in enumerate(ok):
            if not good:
                raw[i].zero_()
        blocks = raw.view(self.dtype).view(n, 2, self.num_layers, *self.block_shape)
        k = [blocks[:, 0, layer] for layer in range(self.num_layers)]
        v = [blocks[:, 1, layer] for layer in range(self.num_layers)]
        return k, v, ok

    def _read_one(self, slot: int, key: object, out: torch.Tensor) -> bool:
        path = self.path_of(slot, key)
        expected = self._header(key)
        try:
            with open(path, "rb") as f:
                head = f.read(len(_MAGIC) + _LEN.size)
                if len(head) != len(_MAGIC) + _LEN.size or head[: len(_MAGIC)] != _MAGIC:
                    return False
                (length,) = _LEN.unpack(head[len(_MAGIC) :])
                if length > _MAX_HEADER:
                    return False
                header = json.loads(f.read(length))
                view = out.numpy().data.cast("B")
                got = f.readinto(view)
                trailing = f.read(1)
        except (OSError, ValueError):
            return False
        want = json.loads(expected)
        checksum = header.pop("blake2b", None) if isinstance(header, dict) else None
        want.pop("blake2b")
        if header != want or got != self.bytes_per_block or trailing:
            return False
        return checksum == hashlib.blake2b(view, digest_size=16).hexdigest()

    def __repr__(self) -> str:
        return f"DiskKVStore({str(self.directory)!r}, num_blocks={self.num_blocks}, dtype={self.dtype})"
