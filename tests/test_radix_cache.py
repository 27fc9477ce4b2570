"""The radix prefix cache: stable chained keys, longest-prefix match, ref counts, pins, cascading
leaf-only eviction, and what the policy is told."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.cache.block_keys import block_hashes, format_block_key, root_key
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.errors import BlockStateError, CacheInvariantError, PinLimitError
from engine_adapter.cache.radix_cache import RadixCache
from sage_eviction import EntryMeta, create_policy
from sage_eviction.policies.lru import LRUPolicy

REPO = Path(__file__).resolve().parent.parent


class RecordingLRU(LRUPolicy):
    """LRU that records every call of the incremental interface."""

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self.calls: list[tuple[Any, ...]] = []

    def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = True) -> None:
        self.calls.append(("insert", key, evictable))
        super().insert(key, meta, evictable=evictable)

    def access(self, key: Hashable, now: float | None = None) -> None:
        self.calls.append(("access", key))
        super().access(key, now)

    def set_evictable(self, key: Hashable, evictable: bool) -> None:
        self.calls.append(("set_evictable", key, evictable))
        super().set_evictable(key, evictable)

    def remove(self, key: Hashable) -> EntryMeta:
        self.calls.append(("remove", key))
        return super().remove(key)

    def evict(self, n: int = 1) -> list[Hashable]:
        victims = super().evict(n)
        self.calls.append(("evict", n, tuple(victims)))
        return victims


def chain(
    cache: RadixCache,
    keys: list[str],
    *,
    start: int = 0,
    parent: CachedBlock | None = None,
    locked: bool = False,
) -> list[CachedBlock]:
    """Insert `keys` as a chain under `parent`; block ids from `start`."""
    out = []
    for i, key in enumerate(keys):
        parent = cache.insert(parent, key, start + i, EntryMeta(), locked=locked)
        out.append(parent)
    return out


def make_cache(num_blocks: int = 16, ratio: float = 0.5) -> tuple[RadixCache, RecordingLRU]:
    policy = RecordingLRU()
    return RadixCache(policy, num_blocks=num_blocks, max_pinned_ratio=ratio), policy


# ---- keys --------------------------------------------------------------------------------------


def test_block_hashes_chain_and_prefix_property() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_hashes([1, 2, 3, 4, 9, 9], 2)
    assert len(a) == 3 and len(b) == 3  # only full blocks
    assert a[:2] == b[:2] and a[2] != b[2]
    # the same tokens in another position hash differently (the parent is part of the key)
    assert block_hashes([3, 4], 2)[0] != a[1]
    assert all(isinstance(k, int) and 0 <= k < 2**128 for k in a)


def test_block_hashes_continue_a_chain() -> None:
    tokens = list(range(20))
    full = block_hashes(tokens, 4, salt="s")
    tail = block_hashes(tokens, 4, parent=full[1], start_block=2)
    assert full[2:] == tail
    assert block_hashes(tokens, 4, salt="s", start_block=0) == full


def test_salt_isolates() -> None:
    tokens = [1, 2, 3, 4]
    assert block_hashes(tokens, 4) != block_hashes(tokens, 4, salt="tenant-a")
    assert block_hashes(tokens, 4, salt="a") != block_hashes(tokens, 4, salt="b")
    assert root_key("a") == root_key(b"a")


def test_block_hashes_are_stable_across_processes() -> None:
    code = (
        "from engine_adapter.cache.block_keys import block_hashes;"
        "print(block_hashes(list(range(12)), 4, salt='x'))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {str(block_hashes(list(range(12)), 4, salt="x")) + "\n"}


def test_format_block_key() -> None:
    assert format_block_key(255) == "ff"
    assert format_block_key(b"\x01\x02") == "0102"
    assert format_block_key(("t", 3)) == "('t', 3)"


# ---- match, lock, evictability -------------------------------------------------------------------


def test_match_returns_the_longest_cached_root_path() -> None:
    cache, _ = make_cache()
    a, b, c = chain(cache, ["a", "b", "c"])
    assert cache.match(["a", "b", "c", "d"]) == [a, b, c]
    assert cache.match(["a", "x", "c"]) == [a]
    assert cache.match(["b", "c"]) == []  # b is cached but not at the root
    assert cache.match([]) == []


def test_only_leaves_are_evictable_and_the_policy_is_told() -> None:
    cache, policy = make_cache()
    a, b = chain(cache, ["a", "b"])
    assert policy.calls == [
        ("insert", "a", True),
        ("set_evictable", "a", False),  # a got a child
        ("insert", "b", True),
    ]
    assert not a.evictable and b.evictable
    assert cache.num_evictable == 1 and cache.num_reclaimable == 2
    cache.check()


def test_lock_and_unlock_a_path() -> None:
    cache, policy = make_cache()
    path = chain(cache, ["a", "b"])
    policy.calls.clear()
    cache.lock(path)
    assert [blk.ref_count for blk in path] == [1, 1]
    assert policy.calls == [("set_evictable", "b", False)]
    assert cache.num_reclaimable == 0 and cache.num_evictable == 0
    cache.lock(path)
    cache.unlock(path)
    assert cache.num_evictable == 0
    cache.unlock(path)
    assert path[1].evictable and cache.num_reclaimable == 2
    cache.check()
    with pytest.raises(BlockStateError, match="already 0"):
        cache.unlock(path)
    assert [blk.ref_count for blk in path] == [0, 0]


def test_touch_reports_hits() -> None:
    cache, policy = make_cache()
    path = chain(cache, ["a", "b"])
    policy.calls.clear()
    cache.touch(path, now=5.0)
    assert policy.calls == [("access", "a"), ("access", "b")]
    assert path[1].meta.hits == 1 and path[1].meta.last_access == 5.0


# ---- eviction ---------------------------------------------------------------------------------------


def test_eviction_cascades_from_leaf_to_root() -> None:
    cache, policy = make_cache()
    chain(cache, ["a", "b", "c"])
    victims, seconds = cache.evict(3)
    assert [v.key for v in victims] == ["c", "b", "a"]
    assert 0.0 < seconds < 1.0  # the wall time of the policy's decision, measured
    assert len(cache) == 0 and len(policy) == 0
    cache.check()


def test_eviction_is_leaf_only_and_skips_locked_paths() -> None:
    cache, _ = make_cache()
    a, _b = chain(cache, ["a", "b"])
    (x,) = chain(cache, ["x"], start=2, parent=a)
    cache.lock([a, x])
    victims, _ = cache.evict(5)
    assert [v.key for v in victims] == ["b"]  # a has a locked child, x is locked
    assert cache.match(["a", "x"]) == [a, x]
    cache.check()
    cache.unlock([a, x])
    victims, _ = cache.evict(5)
    assert [v.key for v in victims] == ["x", "a"]
    cache.check()


def test_eviction_order_follows_lru_with_cascade() -> None:
    cache, _ = make_cache()
    a, b = chain(cache, ["a", "b"])
    (_c,) = chain(cache, ["c"], start=2)
    cache.touch([a, b], now=1.0)  # a and b are now more recent than c
    victims, _ = cache.evict(1)
    assert [v.key for v in victims] == ["c"]
    victims, _ = cache.evict(2)
    assert [v.key for v in victims] == ["b", "a"]


def test_evict_asks_one_victim_at_a_time() -> None:
    cache, policy = make_cache()
    chain(cache, ["a", "b"])
    policy.calls.clear()
    cache.evict(2)
    evicts = [c for c in policy.calls if c[0] == "evict"]
    assert evicts == [("evict", 1, ("b",)), ("evict", 1, ("a",))]


def test_a_policy_choosing_a_locked_block_is_caught() -> None:
    class Rogue(LRUPolicy):
        def evict(self, n: int = 1) -> list[Hashable]:
            return ["a"]

    cache = RadixCache(Rogue(), num_blocks=8)
    path = chain(cache, ["a"], locked=True)
    with pytest.raises(CacheInvariantError, match="evicted a"):
        cache.evict(1)
    assert cache.match(["a"]) == path


# ---- pins ----------------------------------------------------------------------------------------------


def test_pins_protect_and_nest() -> None:
    cache, _ = make_cache(num_blocks=8, ratio=0.5)
    path = chain(cache, ["a", "b"])
    assert cache.pin(path) == 2
    assert cache.pin(path) == 0  # nested
    assert cache.num_pinned == 2 and cache.num_reclaimable == 0
    assert cache.evict(5)[0] == []
    assert cache.unpin(path) == 0
    assert cache.evict(5)[0] == []
    assert cache.unpin(path) == 2
    assert [v.key for v in cache.evict(5)[0]] == ["b", "a"]
    cache.check()


def test_pin_beyond_the_ratio_is_an_error_that_changes_nothing() -> None:
    cache, policy = make_cache(num_blocks=8, ratio=0.25)  # at most 2 pinned
    path = chain(cache, ["a", "b", "c"])
    cache.pin(path[:1])
    calls = len(policy.calls)
    with pytest.raises(PinLimitError, match=r"max_pinned_ratio=0\.25"):
        cache.pin(path)
    assert [blk.pin_count for blk in path] == [1, 0, 0]
    assert cache.num_pinned == 1 and len(policy.calls) == calls
    cache.check()


def test_unpin_of_an_unpinned_block_changes_nothing() -> None:
    cache, _ = make_cache()
    path = chain(cache, ["a", "b"])
    cache.pin(path[:1])
    with pytest.raises(BlockStateError, match="not pinned"):
        cache.unpin(path)
    assert path[0].pin_count == 1
    cache.check()


def test_bad_ratio() -> None:
    with pytest.raises(ValueError, match="max_pinned_ratio"):
        RadixCache(LRUPolicy(), num_blocks=8, max_pinned_ratio=1.5)


# ---- insert, remove, checks ------------------------------------------------------------------------------


def test_insert_twice_or_under_a_missing_parent_is_an_error() -> None:
    cache, _ = make_cache()
    (a,) = chain(cache, ["a"])
    with pytest.raises(BlockStateError, match="already cached"):
        cache.insert(None, "a", 5, EntryMeta())
    cache.evict(1)
    with pytest.raises(BlockStateError, match="not cached"):
        cache.insert(a, "b", 6, EntryMeta())


def test_locked_insert_is_not_evictable() -> None:
    cache, policy = make_cache()
    (a,) = chain(cache, ["a"], locked=True)
    assert policy.calls == [("insert", "a", False)]
    assert cache.num_reclaimable == 0
    cache.unlock([a])
    assert cache.num_evictable == 1


def test_remove_and_reclaim_all_use_policy_remove() -> None:
    cache, policy = make_cache()
    a, _b = chain(cache, ["a", "b"])
    (x,) = chain(cache, ["x"], start=2, locked=True)
    with pytest.raises(BlockStateError):
        cache.remove(a)  # has a child
    policy.calls.clear()
    removed = cache.reclaim_all()
    assert [blk.key for blk in removed] == ["b", "a"]
    assert ("remove", "b") in policy.calls and not any(c[0] == "evict" for c in policy.calls)
    assert cache.match(["x"]) == [x]
    cache.check()


def test_check_finds_corruption() -> None:
    cache, _ = make_cache()
    a, b = chain(cache, ["a", "b"])
    cache.check()
    a.num_children = 0
    with pytest.raises(CacheInvariantError, match="children"):
        cache.check()
    a.num_children = 1
    b.ref_count = 1
    with pytest.raises(CacheInvariantError):
        cache.check()
    b.ref_count = 0
    cache.policy.set_evictable("b", False)
    with pytest.raises(CacheInvariantError, match="evictable"):
        cache.check()


@pytest.mark.parametrize("name", ["lru", "fifo", "lfu", "slru"])
def test_works_with_registered_policies(name: str) -> None:
    cache = RadixCache(create_policy(name), num_blocks=16)
    path = chain(cache, ["a", "b", "c"])
    (_d,) = chain(cache, ["d"], start=3, parent=path[0])
    cache.touch(path, now=1.0)
    victims, _ = cache.evict(4)
    assert sorted(v.key for v in victims) == ["a", "b", "c", "d"]
    assert victims[-1].key == "a"  # the root goes last
    cache.check()


def test_chain_insert_as_non_leaf_then_refresh() -> None:
    cache, policy = make_cache()
    a = cache.insert(None, "a", 0, EntryMeta(), leaf=False)
    b = cache.insert(a, "b", 1, EntryMeta(), leaf=False)
    assert policy.calls == [("insert", "a", False), ("insert", "b", False)]  # no flips
    with pytest.raises(CacheInvariantError):
        cache.check()  # b is a leaf the policy thinks is not evictable
    cache.refresh(b)
    cache.refresh(a)  # no change: it has a child
    assert policy.calls[-1] == ("set_evictable", "b", True)
    cache.check()
    assert [v.key for v in cache.evict(2)[0]] == ["b", "a"]
