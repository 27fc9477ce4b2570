"""The paged KV pool: free list, K/V read-back, slot mapping, sizing, and the meta device."""

from __future__ import annotations

import pytest
import torch

from engine_adapter.cache.errors import BlockStateError, PoolExhaustedError
from engine_adapter.cache.sizes import format_bytes, parse_bytes
from engine_adapter.model.kv_pool import PagedKVPool, resolve_device

SHAPE = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "block_size": 4}


def make_pool(num_blocks: int = 8, device: str = "cpu", **kw: object) -> PagedKVPool:
    params: dict[str, object] = {**SHAPE, "num_blocks": num_blocks, "device": device, **kw}
    return PagedKVPool(**params)  # type: ignore[arg-type]


# ---- free list --------------------------------------------------------------------------------


def test_fresh_pool_hands_out_ids_in_order_and_counts() -> None:
    pool = make_pool(8)
    assert (pool.allocator.num_free, pool.allocator.num_used) == (8, 0)
    assert pool.allocator.allocate(3) == [0, 1, 2]
    assert pool.allocator.allocate(0) == []
    assert (pool.allocator.num_free, pool.allocator.num_used) == (5, 3)
    pool.allocator.free([1])
    assert pool.allocator.allocate(1) == [1]  # the most recently freed goes out first


def test_allocate_more_than_free_raises_and_changes_nothing() -> None:
    pool = make_pool(4)
    pool.allocator.allocate(3)
    before = pool.allocator.free_block_ids()
    with pytest.raises(PoolExhaustedError, match="cannot allocate 2 blocks: 1 of 4 are free"):
        pool.allocator.allocate(2)
    assert pool.allocator.free_block_ids() == before
    assert isinstance(PoolExhaustedError("x"), MemoryError)


def test_negative_allocate_is_an_error() -> None:
    with pytest.raises(ValueError):
        make_pool().allocator.allocate(-1)


def test_double_free_raises_and_changes_nothing() -> None:
    pool = make_pool(4)
    ids = pool.allocator.allocate(2)
    pool.allocator.free([ids[0]])
    with pytest.raises(BlockStateError, match="double free of block 0"):
        pool.allocator.free([ids[1], ids[0]])
    # ids[1] was not freed by the failed call
    assert not pool.allocator.is_free(ids[1])
    assert pool.allocator.num_free == 3


def test_repeated_id_in_one_free_is_a_double_free() -> None:
    pool = make_pool(4)
    ids = pool.allocator.allocate(2)
    with pytest.raises(BlockStateError):
        pool.allocator.free([ids[0], ids[0]])
    assert pool.allocator.num_used == 2


def test_free_out_of_range_raises() -> None:
    pool = make_pool(4)
    with pytest.raises(BlockStateError, match="outside the pool"):
        pool.allocator.free([4])
    with pytest.raises(BlockStateError, match="outside the pool"):
        pool.allocator.free([-1])


def test_every_block_can_be_allocated_and_freed() -> None:
    pool = make_pool(16)
    ids = pool.allocator.allocate(16)
    assert sorted(ids) == list(range(16))
    with pytest.raises(PoolExhaustedError):
        pool.allocator.allocate(1)
    pool.allocator.free(ids)
    assert pool.allocator.num_free == 16
    assert sorted(pool.allocator.free_block_ids()) == list(range(16))


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_constructor_rejects_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        make_pool(bad)  # type: ignore[arg-type]


# ---- K/V storage -----------------------------------------------------------------------------


def test_tensors_have_the_documented_shape_and_are_allocated_once() -> None:
    pool = make_pool(8, dtype=torch.float16)
    assert len(pool.k_cache) == len(pool.v_cache) == 2
    for t in (*pool.k_cache, *pool.v_cache):
        assert t.shape == (8, 4, 2, 4)
        assert t.dtype == torch.float16
        assert t.device.type == "cpu"
    ptr = pool.k_cache[0].data_ptr()
    pool.allocator.free(pool.allocator.allocate(5))
    assert pool.k_cache[0].data_ptr() == ptr
    assert pool.bytes_per_block == 2 * 2 * 4 * 2 * 4 * 2


def test_slot_mapping_follows_the_block_table() -> None:
    slots = PagedKVPool.slot_mapping([5, 2, 7], 2, 10, 4)
    assert slots.dtype == torch.int64
    assert slots.tolist() == [22, 23, 8, 9, 10, 11, 28, 29]
    assert PagedKVPool.slot_mapping([5], 0, 0, 4).tolist() == []
    with pytest.raises(ValueError):
        PagedKVPool.slot_mapping([5], 0, 5, 4)  # position 4 needs a second block
    with pytest.raises(ValueError):
        PagedKVPool.slot_mapping([5], 3, 2, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_write_then_gather_is_bit_identical(dtype: torch.dtype) -> None:
    pool = make_pool(8, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    table = [6, 1, 3]  # not contiguous, not sorted
    n = 10  # the last block is partial
    slots = PagedKVPool.slot_mapping(table, 0, n, pool.block_size)
    for layer in range(pool.num_layers):
        k = torch.randn(n, 2, 4, generator=gen).to(dtype)
        v = torch.randn(n, 2, 4, generator=gen).to(dtype)
        pool.write(layer, slots, k, v)
        got_k, got_v = pool.gather(layer, table, n)
        assert got_k.shape == (n, 2, 4)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
        # a tensor block table gives the same, and so does a prefix
        got_k2, _ = pool.gather(layer, torch.tensor(table), 5)
        assert torch.equal(got_k2, k[:5])


def test_writes_in_two_chunks_equal_one_write() -> None:
    pool = make_pool(8)
    table = [2, 4, 0]
    k = torch.randn(11, 2, 4)
    v = torch.randn(11, 2, 4)
    pool.write(1, PagedKVPool.slot_mapping(table, 0, 6, 4), k[:6], v[:6])
    pool.write(1, PagedKVPool.slot_mapping(table, 6, 11, 4), k[6:], v[6:])
    got_k, got_v = pool.gather(1, table, 11)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    assert torch.count_nonzero(pool.k_cache[0]) == 0  # the other layer is untouched


def test_gather_rejects_a_short_block_table() -> None:
    pool = make_pool(8)
    with pytest.raises(ValueError, match="cannot hold 9 tokens"):
        pool.gather(0, [0, 1], 9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pool_write_gather() -> None:
    pool = make_pool(8, device="cuda")
    assert pool.device.type == "cuda"
    k = torch.randn(6, 2, 4, device="cuda")
    v = torch.randn(6, 2, 4, device="cuda")
    pool.write(0, PagedKVPool.slot_mapping([3, 1], 0, 6, 4), k, v)
    got_k, got_v = pool.gather(0, [3, 1], 6)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)


# ---- devices -----------------------------------------------------------------------------------


def test_meta_device_allocates_no_memory() -> None:
    # 2 TB of K/V if it were real: on meta it has shapes and nothing behind them.
    pool = PagedKVPool(
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        num_blocks=1_000_000,
        dtype=torch.float16,
        device="meta",
    )
    assert pool.total_bytes > 10**12
    assert all(t.is_meta for t in (*pool.k_cache, *pool.v_cache))
    assert pool.k_cache[0].shape == (1_000_000, 16, 8, 128)
    ids = pool.allocator.allocate(1000)
    assert len(ids) == 1000
    pool.allocator.free(ids)
    assert pool.allocator.num_free == 1_000_000


def test_auto_device_is_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert make_pool(2, device="auto").device.type == "cpu"


def test_unknown_device_and_dtype_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="not a torch device"):
        make_pool(2, device="floppy")
    with pytest.raises(ValueError, match="dtype 'int3'"):
        make_pool(2, dtype="int3")
    assert make_pool(2, dtype="bf16").dtype == torch.bfloat16


# ---- sizing ---------------------------------------------------------------------------------------


def test_blocks_for_memory_from_bytes_and_strings() -> None:
    per_block = PagedKVPool.bytes_for_block(**SHAPE, dtype=torch.float16)
    assert per_block == 2 * 2 * 4 * 2 * 4 * 2
    assert PagedKVPool.blocks_for_memory("2GiB", **SHAPE, dtype=torch.float16) == 2 * 1024**3 // per_block
    assert PagedKVPool.blocks_for_memory("512MiB", **SHAPE, dtype=torch.float16) == 512 * 1024**2 // per_block
    assert PagedKVPool.blocks_for_memory(per_block * 7 + 1, **SHAPE, dtype=torch.float16) == 7
    assert PagedKVPool.blocks_for_memory(str(per_block * 3), **SHAPE, dtype="float16") == 3


def test_blocks_for_memory_too_small_or_malformed() -> None:
    with pytest.raises(ValueError, match="holds no block"):
        PagedKVPool.blocks_for_memory(10, **SHAPE, dtype=torch.float32)
    with pytest.raises(ValueError, match="unknown unit"):
        PagedKVPool.blocks_for_memory("2 parsecs", **SHAPE, dtype=torch.float32)


def test_blocks_for_utilization_on_cpu_reads_meminfo(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine_adapter.model.kv_pool as pool_module

    monkeypatch.setattr(pool_module, "_mem_available_bytes", lambda: 1024**3)
    per_block = PagedKVPool.bytes_for_block(**SHAPE, dtype=torch.float32)
    n = PagedKVPool.blocks_for_utilization(0.5, device="cpu", **SHAPE)
    assert n == (1024**3 // 2) // per_block


def test_blocks_for_utilization_real_meminfo_is_positive() -> None:
    assert PagedKVPool.blocks_for_utilization(0.01, device="cpu", **SHAPE) > 0


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_blocks_for_utilization_rejects_bad_fractions(fraction: float) -> None:
    with pytest.raises(ValueError, match="memory utilization"):
        PagedKVPool.blocks_for_utilization(fraction, device="cpu", **SHAPE)


def test_blocks_for_utilization_on_meta_is_an_error() -> None:
    with pytest.raises(ValueError, match="meta"):
        PagedKVPool.blocks_for_utilization(0.5, device="meta", **SHAPE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("512 mib", 512 * 1024**2),
        ("1.5G", 1_500_000_000),
        ("4096", 4096),
        ("10KB", 10_000),
        ("1TiB", 1024**4),
        (123, 123),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "-1GiB", "2 GiBs", "two", -5, True, None])
def test_parse_bytes_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)  # type: ignore[arg-type]


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 1024**3 // 2) == "1.5 GiB"
