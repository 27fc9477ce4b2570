"""Execute the cache core's tier moves: copy blocks' K/V between the device pool, the host pool
and the disk store (issue 30; the contract is `engine_adapter.cache.tier_moves`).

`execute_moves` runs the moves in the order given, before the forward of the step that scheduled
them. Consecutive moves between the same two tiers are one batch: one ``index_select`` per layer
on the source and one ``index_copy_`` per layer on the destination, whatever the number of
blocks (a per-block copy is a kernel launch, or a Python loop, per block and layer). A batch
gives exactly what the moves one by one would give:

- a move whose source is read in the batch after an earlier move of the batch wrote that slot
  (possible only between a tier and itself) starts a new batch;
- when two moves of a batch write the same slot, the last one whose source was read wins.

On CUDA the copies run on the host pool's copy stream, after the forward's stream (so a block
demoted is copied out after the step that wrote it), through pinned buffers, and the batch waits
for them before it returns (so the next forward reads the promoted blocks and may overwrite the
demoted ones).

Imports: torch, the cache core's move record, and this package's pools and disk store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.model.disk_store import DiskKVStore
from engine_adapter.model.host_pool import HostKVPool
from engine_adapter.model.kv_pool import PagedKVPool

__all__ = ["execute_moves", "move_batches"]

# Per layer, K and V of the blocks a batch moves: ``[n, block_size, num_kv_heads, head_dim]``.
_Layers = list[torch.Tensor]


def move_batches(moves: Sequence[TierMove]) -> Iterator[list[TierMove]]:
    """`moves` cut into the batches `execute_moves` copies at once, in order."""
    batch: list[TierMove] = []
    written: set[int] = set()
    for move in moves:
        if batch:
            first = batch[0]
            same_pair = (move.src_tier, move.dst_tier) == (first.src_tier, first.dst_tier)
            reads_own_write = move.src_tier == move.dst_tier and move.src in written
            if not same_pair or reads_own_write:
                yield batch
                batch, written = [], set()
        batch.append(move)
        written.add(move.dst)
    if batch:
        yield batch


def execute_moves(
    moves: Sequence[TierMove],
    device_pool: PagedKVPool,
    host_pool: HostKVPool | None,
    disk_store: DiskKVStore | None,
    on_load: Callable[[Tier, float], None] | None = None,
) -> list[TierMove]:
    """Copy each move's block from its source slot to its destination slot, in order.

    `on_load` is told the wall time of each batch that loads blocks from a lower tier into the
    pool (its source tier and seconds; on CUDA the copy stream is waited for, so the time is the
    copy's, not its launch's): the tiers' load time p50/p99.

    Returns:
        The moves that failed, in order: their source could not be read (a disk file missing,
        truncated, corrupt or of another block) or their destination not written (a disk
        error). Their destination slot holds nothing usable; the engine hands them to
        ``CacheManager.moves_failed``.

    Raises:
        ValueError: A move to or from a tier the engine does not have.
        IndexError: A slot outside its tier.
    """
    if not moves:
        return []
    stores = _Stores(device_pool, host_pool, disk_store)
    failed: list[TierMove] = []
    with torch.inference_mode(), stores.copy_scope(), _one_cpu_thread(device_pool.device.type == "cpu"):
        for batch in move_batches(moves):
            if on_load is None or batch[0].dst_tier is not Tier.DEVICE:
                failed.extend(stores.run(batch))
                continue
            t = time.perf_counter()
            failed.extend(stores.run(batch))
            stores.wait()
            on_load(batch[0].src_tier, time.perf_counter() - t)
    return failed


@contextlib.contextmanager
def _one_cpu_thread(on: bool) -> Iterator[None]:
    """The CPU copies on one intra-op thread. They are memory-bound and each op is its own
    parallel region: with 2 threads on a 2-core machine that other processes load, 32 blocks of
    SmolLM2 took 410 ms against 12 ms on one (the barriers wait for a descheduled thread)."""
    threads = torch.get_num_threads()
    if not on or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _Stores:
    """The three tiers of one engine, read and written a batch at a time."""

    def __init__(self, device: PagedKVPool, host: HostKVPool | None, disk: DiskKVStore | None) -> None:
        self.device = device
        self.host = host
        self.disk = disk
        self.stream: Any = host.copy_stream if host is not None and device.device.type == "cuda" else None

    @contextlib.contextmanager
    def copy_scope(self) -> Iterator[None]:
        """On CUDA: the copy stream, after the forward's, waited for at the end."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device.device))
        with torch.cuda.stream(self.stream):
            yield
        self.stream.synchronize()

    def wait(self) -> None:
        """The copies issued so far are done (on CUDA: the copy stream; on the CPU they are)."""
        if self.stream is not None:
            self.stream.synchronize()

    def run(self, batch: list[TierMove]) -> list[TierMove]:
        """Copy one batch; the moves that failed."""
        src_tier, dst_tier = batch[0].src_tier, batch[0].dst_tier
        k, v, ok = self.read(src_tier, [m.src for m in batch], [m.key for m in batch])
        last_good = {m.dst: i for i, m in enumerate(batch) if ok[i]}
        rows = sorted(last_good.values())
        bad = {i for i, good in enumerate(ok) if not good}
        if rows:
            if len(rows) != len(batch):
                index = torch.tensor(rows, dtype=torch.long, device=k[0].device)
                k = [t.index_select(0, index) for t in k]
                v = [t.index_select(0, index) for t in v]
            written = self.write(dst_tier, [batch[i].dst for i in rows], [batch[i].key for i in rows], k, v)
            bad.update(i for i, done in zip(rows, written, strict=True) if not done)
        return [m for i, m in enumerate(batch) if i in bad]

    def read(self, tier: Tier, slots: list[int], keys: list[object]) -> tuple[_Layers, _Layers, list[bool]]:
        if tier is Tier.DEVICE:
            index = self._device_index(slots)
            k = [t.index_select(0, index) for t in self.device.k_cache]
            v = [t.index_select(0, index) for t in self.device.v_cache]
            return k, v, [True] * len(slots)
        if tier is Tier.HOST:
            host = self._host()
            index = host.check_slots(slots)
            return (
                _host_gather(host, host.k_cache, index),
                _host_gather(host, host.v_cache, index),
                [True] * len(slots),
            )
        return self._disk().read_blocks(slots, keys)

    def write(self, tier: Tier, slots: list[int], keys: list[object], k: _Layers, v: _Layers) -> list[bool]:
        if tier is Tier.DEVICE:
            index = self._device_index(slots)
            for dst, src in zip(self.device.k_cache + self.device.v_cache, k + v, strict=True):
                dst.index_copy_(0, index, src.to(self.device.device, dst.dtype, non_blocking=True))
            return [True] * len(slots)
        if tier is Tier.HOST:
            host = self._host()
            index = host.check_slots(slots)
            staged = _to_host(k + v, pinned=host.pinned)
            for dst, src in zip(host.k_cache + host.v_cache, staged, strict=True):
                dst.index_copy_(0, index, src)
            return [True] * len(slots)
        staged = _to_host(k + v, pinned=self.host is not None and self.host.pinned)
        return self._disk().write_blocks(slots, keys, staged[: len(k)], staged[len(k) :])

    def _device_index(self, slots: list[int]) -> torch.Tensor:
        for slot in slots:
            if not 0 <= slot < self.device.num_blocks:
                raise IndexError(f"device block {slot} is outside the pool's {self.device.num_blocks} blocks")
        return torch.tensor(slots, dtype=torch.long, device=self.device.device)

    def _host(self) -> HostKVPool:
        if self.host is None:
            raise ValueError("a tier move to or from the host tier, but the engine has no host tier")
        return self.host

    def _disk(self) -> DiskKVStore:
        if self.disk is None:
            raise ValueError("a tier move to or from the disk tier, but the engine has no disk tier")
        return self.disk


def _host_gather(host: HostKVPool, layers: list[torch.Tensor], index: torch.Tensor) -> _Layers:
    """The rows `index` of each host tensor; into pinned buffers when the pool is pinned, so that
    their copy to the GPU is a DMA on the copy stream."""
    if not host.pinned:
        return [t.index_select(0, index) for t in layers]
    shape = (len(index), *host.block_shape)
    return [
        torch.index_select(t, 0, index, out=torch.empty(shape, dtype=t.dtype, pin_memory=True))
        for t in layers
    ]


def _to_host(tensors: _Layers, *, pinned: bool) -> _Layers:
    """`tensors` on the CPU. From CUDA: through pinned buffers on the current (copy) stream,
    waited for before the CPU reads them."""
    if all(t.device.type == "cpu" for t in tensors):
        return list(tensors)
    out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned) for t in tensors]
    for dst, src in zip(out, tensors, strict=True):
        dst.copy_(src, non_blocking=pinned)
    if pinned:
        torch.cuda.current_stream().synchronize()
    return out
