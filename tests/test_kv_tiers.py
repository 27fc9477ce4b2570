"""The KV tiers' storage (issue 30): the host pool, the disk store and the move executor.

Round trips device -> host -> disk -> host -> device are bit-exact in every KV dtype; a disk
file that is missing, truncated, corrupt or of another block is a failed move and never K/V;
batches equal the moves one by one; and random move sequences agree with a dict model of what
each slot holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.model.disk_store import DiskKVStore, key_digest
from engine_adapter.model.host_pool import HostKVPool
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.tier_copy import execute_moves, move_batches

SHAPE = {"num_layers": 3, "num_kv_heads": 2, "head_dim": 4, "block_size": 4}
KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
D, H, K = Tier.DEVICE, Tier.HOST, Tier.DISK


def filled_pool(num_blocks: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> PagedKVPool:
    """A pool whose every block holds distinct random K/V (all bit patterns of a random normal)."""
    pool = PagedKVPool(**SHAPE, num_blocks=num_blocks, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(num_blocks)
    for t in pool.k_cache + pool.v_cache:
        t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
    return pool


def block(pool: PagedKVPool | HostKVPool, slot: int) -> list[torch.Tensor]:
    """One block's K and V over all layers, on the CPU."""
    return [t[slot].cpu().clone() for t in pool.k_cache + pool.v_cache]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bit for bit (a NaN equals itself; -0.0 differs from 0.0)."""
    return all(
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b, strict=True)
    )


def tiers(pool: PagedKVPool, tmp_path: Path, host: int = 8, disk: int = 8) -> tuple[HostKVPool, DiskKVStore]:
    return HostKVPool.like(pool, host), DiskKVStore.like(pool, tmp_path / "kv", disk)


# ---- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_device_host_disk_host_device_round_trip_is_bit_exact(dtype: torch.dtype, tmp_path: Path) -> None:
    pool = filled_pool(8, dtype)
    # Odd bit patterns survive too: NaN, infinities, a negative zero, the smallest subnormal.
    pool.k_cache[0][2, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-45]).to(dtype)
    before = {b: block(pool, b) for b in (2, 3, 4)}
    host, disk = tiers(pool, tmp_path)
    moves = [TierMove(D, b, H, i, ("k", b)) for i, b in enumerate((2, 3, 4))]
    moves += [TierMove(H, i, K, 5 - i, ("k", b)) for i, b in enumerate((2, 3, 4))]
    moves += [TierMove(K, 5 - i, H, 7 - i, ("k", b)) for i, b in enumerate((2, 3, 4))]
    moves += [TierMove(H, 7 - i, D, 5 + i, ("k", b)) for i, b in enumerate((2, 3, 4))]
    assert execute_moves(moves, pool, host, disk) == []
    for i, b in enumerate((2, 3, 4)):
        assert same(block(pool, 5 + i), before[b])
        assert same(block(host, 7 - i), before[b])
    assert sorted(p.name for p in (tmp_path / "kv").iterdir()) == sorted(
        f"s{5 - i}-{key_digest(('k', b))}.kv" for i, b in enumerate((2, 3, 4))
    )


def test_device_to_disk_and_back_without_a_host_tier(tmp_path: Path) -> None:
    pool = filled_pool(4)
    want = block(pool, 1)
    disk = DiskKVStore.like(pool, tmp_path, 2)
    assert execute_moves([TierMove(D, 1, K, 0, 7), TierMove(K, 0, D, 3, 7)], pool, None, disk) == []
    assert same(block(pool, 3), want)


def test_a_move_to_a_tier_the_engine_lacks_is_an_error(tmp_path: Path) -> None:
    pool = filled_pool(4)
    with pytest.raises(ValueError, match="no host tier"):
        execute_moves([TierMove(D, 0, H, 0, 1)], pool, None, None)
    with pytest.raises(ValueError, match="no disk tier"):
        execute_moves([TierMove(D, 0, K, 0, 1)], pool, HostKVPool.like(pool, 2), None)
    with pytest.raises(IndexError, match="host slot 2"):
        execute_moves([TierMove(D, 0, H, 2, 1)], pool, HostKVPool.like(pool, 2), None)
    with pytest.raises(IndexError, match="device block 4"):
        execute_moves([TierMove(D, 4, H, 0, 1)], pool, HostKVPool.like(pool, 2), None)


# ---- the disk store's failures ----------------------------------------------------------------


def demoted_to_disk(tmp_path: Path) -> tuple[PagedKVPool, DiskKVStore, Path, list[torch.Tensor]]:
    """A pool whose block 0 went to disk slot 1 as key 42; block 3 of the pool zeroed."""
    pool = filled_pool(4)
    disk = DiskKVStore.like(pool, tmp_path, 2)
    assert execute_moves([TierMove(D, 0, K, 1, 42)], pool, None, disk) == []
    for t in pool.k_cache + pool.v_cache:
        t[3].zero_()
    return pool, disk, disk.path_of(1, 42), block(pool, 3)


def corrupt_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # one bit of the last layer's V
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def append_byte(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


def corrupt_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b'"nbytes"')
    data[at + 1] = ord("N")
    path.write_bytes(bytes(data))


def corrupt_magic(path: Path) -> None:
    path.write_bytes(b"X" + path.read_bytes()[1:])


@pytest.mark.parametrize(
    "damage", [os.unlink, corrupt_payload, truncate, append_byte, corrupt_header, corrupt_magic]
)
def test_a_damaged_disk_file_is_a_failed_move_and_writes_nothing(damage: object, tmp_path: Path) -> None:
    pool, disk, path, zeroed = demoted_to_disk(tmp_path)
    damage(path)  # type: ignore[operator]
    load = TierMove(K, 1, D, 3, 42)
    assert execute_moves([load], pool, None, disk) == [load]
    assert same(block(pool, 3), zeroed)
    # The store itself hands back zeros for a failed block, never the bytes it read.
    k, v, ok = disk.read_blocks([1], [42])
    assert ok == [False] and not any(t.any() for t in k + v)


def test_a_truncated_file_whose_lost_tail_was_zeros_is_a_failed_read(tmp_path: Path) -> None:
    # The checksum alone would pass it: the unread bytes of the buffer are zeros too.
    pool = filled_pool(4)
    pool.v_cache[-1][0, -1, -1, -1] = 0.0
    disk = DiskKVStore.like(pool, tmp_path, 2)
    assert execute_moves([TierMove(D, 0, K, 1, 42)], pool, None, disk) == []
    path = disk.path_of(1, 42)
    path.write_bytes(path.read_bytes()[:-4])
    load = TierMove(K, 1, D, 3, 42)
    assert execute_moves([load], pool, None, disk) == [load]


def test_an_intact_file_loads(tmp_path: Path) -> None:
    # The control of the test above: the same load, undamaged, succeeds.
    pool, disk, _path, _zeroed = demoted_to_disk(tmp_path)
    want = block(pool, 0)
    assert execute_moves([TierMove(K, 1, D, 3, 42)], pool, None, disk) == []
    assert same(block(pool, 3), want)


def test_a_file_of_another_key_or_slot_is_a_failed_read(tmp_path: Path) -> None:
    pool, disk, path, _zeroed = demoted_to_disk(tmp_path)
    assert execute_moves([TierMove(K, 1, D, 3, 43)], pool, None, disk) != []  # another key
    assert execute_moves([TierMove(K, 0, D, 3, 42)], pool, None, disk) != []  # another slot
    # A file renamed to pose as another block's is refused by its header.
    os.replace(path, disk.path_of(1, 43))
    assert execute_moves([TierMove(K, 1, D, 3, 43)], pool, None, disk) != []


def test_overwriting_a_slot_removes_its_file_and_a_reopened_store_clears_stale_files(tmp_path: Path) -> None:
    pool = filled_pool(4)
    disk = DiskKVStore.like(pool, tmp_path, 2)
    (tmp_path / "notes.txt").write_text("not ours")
    execute_moves([TierMove(D, 0, K, 0, 1), TierMove(D, 1, K, 0, 2)], pool, None, disk)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.txt", disk.path_of(0, 2).name])
    DiskKVStore.like(pool, tmp_path, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_failed_disk_write_is_a_failed_move(tmp_path: Path) -> None:
    pool = filled_pool(4)
    disk = DiskKVStore.like(pool, tmp_path, 2)
    # A folder where the temporary file goes: open() fails as on a full disk (root ignores
    # permissions, not this).
    path = disk.path_of(0, 5)
    path.with_name(f".{path.name}.tmp").mkdir()
    move = TierMove(D, 0, K, 0, 5)
    assert execute_moves([move], pool, None, disk) == [move]
    assert not path.exists()
    assert execute_moves([TierMove(K, 0, D, 1, 5)], pool, None, disk) != []


def test_key_digest_is_stable_and_typed() -> None:
    # A fixed value: the digest names files, so it must not change between processes or releases.
    assert key_digest(1) == key_digest(1) != key_digest("1")
    assert key_digest((1, "a")) != key_digest((1, "a", ()))
    assert key_digest(2**127 + 1) == "298d2193640cc9790a9bcf22666c2c1d"
    assert key_digest((1, "a")) == "2058d4ee2ce95573f18cc1e2b69753c9"
    with pytest.raises(TypeError, match="block key"):
        key_digest(1.5)


# ---- batching ---------------------------------------------------------------------------------


def test_batches_cut_on_tier_pairs_and_on_reads_of_own_writes() -> None:
    moves = [
        TierMove(D, 0, H, 0, 1),
        TierMove(D, 1, H, 1, 2),
        TierMove(H, 0, K, 0, 1),
        TierMove(H, 1, H, 2, 2),
        TierMove(H, 3, H, 4, 3),
        TierMove(H, 2, H, 5, 2),  # reads host slot 2, written two moves ago: a new batch
    ]
    assert [len(b) for b in move_batches(moves)] == [2, 1, 2, 1]


def run_one_by_one(
    moves: list[TierMove], pool: PagedKVPool, host: HostKVPool, disk: DiskKVStore
) -> list[TierMove]:
    failed: list[TierMove] = []
    for move in moves:
        failed += execute_moves([move], pool, host, disk)
    return failed


def state(pool: PagedKVPool, host: HostKVPool) -> list[torch.Tensor]:
    return [t.clone() for t in pool.k_cache + pool.v_cache + host.k_cache + host.v_cache]


moves_strategy = st.lists(
    st.builds(
        TierMove,
        st.sampled_from(list(Tier)),
        st.integers(0, 3),
        st.sampled_from(list(Tier)),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    max_size=24,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=moves_strategy)
def test_batched_moves_equal_moves_one_by_one(
    moves: list[TierMove], tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.mktemp("batch")
    results = []
    for name, run in (("batched", execute_moves), ("single", run_one_by_one)):
        pool = filled_pool(4)
        host, disk = HostKVPool.like(pool, 4), DiskKVStore.like(pool, base / name, 4)
        failed = run(moves, pool, host, disk)
        results.append((failed, state(pool, host), sorted(p.name for p in (base / name).iterdir())))
    (failed_a, state_a, files_a), (failed_b, state_b, files_b) = results
    assert failed_a == failed_b
    assert files_a == files_b
    assert all(torch.equal(a, b) for a, b in zip(state_a, state_b, strict=True))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=moves_strategy)
def test_random_moves_agree_with_a_model_of_slot_contents(
    moves: list[TierMove], tmp_path_factory: pytest.TempPathFactory
) -> None:
    pool = filled_pool(4)
    host, disk = HostKVPool.like(pool, 4), DiskKVStore.like(pool, tmp_path_factory.mktemp("model"), 4)
    original = {b: block(pool, b) for b in range(4)}
    # What each slot holds: the original device block its bytes came from (None: zeros), and on
    # disk also the key it was written as (a read with another key, or of no file, fails).
    no_file = object()
    model: dict[Tier, list[tuple[int | None, object]]] = {
        D: [(b, None) for b in range(4)],
        H: [(None, None)] * 4,
        K: [(None, no_file)] * 4,
    }
    expected_failed = []
    for move in moves:
        content, key = model[move.src_tier][move.src]
        if move.src_tier is K and key != move.key:
            expected_failed.append(move)
            continue
        model[move.dst_tier][move.dst] = (content, move.key)
    assert execute_moves(moves, pool, host, disk) == expected_failed
    zeros = [torch.zeros_like(t) for t in original[0]]
    for tier, store in ((D, pool), (H, host)):
        for slot, (content, _key) in enumerate(model[tier]):
            assert same(block(store, slot), zeros if content is None else original[content]), (tier, slot)


# ---- CUDA -------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_cuda_round_trip_through_the_pinned_host_pool(dtype: torch.dtype, tmp_path: Path) -> None:
    pool = filled_pool(8, dtype, device="cuda")
    host, disk = tiers(pool, tmp_path)
    assert host.pinned and host.copy_stream is not None
    assert all(t.is_pinned() for t in host.k_cache + host.v_cache)
    want = [block(pool, b) for b in (1, 2)]
    moves = [
        TierMove(D, 1, H, 0, 1),
        TierMove(D, 2, H, 1, 2),
        TierMove(H, 0, K, 0, 1),
        TierMove(H, 1, K, 1, 2),
    ]
    moves += [
        TierMove(K, 0, H, 2, 1),
        TierMove(K, 1, H, 3, 2),
        TierMove(H, 2, D, 6, 1),
        TierMove(H, 3, D, 7, 2),
    ]
    # The forward's stream writes block 1 after the moves: the demotion must have copied it out.
    assert execute_moves(moves, pool, host, disk) == []
    for t in pool.k_cache:
        t[1].fill_(7.0)
    torch.cuda.synchronize()
    assert same(block(pool, 6), want[0]) and same(block(pool, 7), want[1])
    assert same(block(host, 0), want[0])
