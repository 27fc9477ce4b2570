"""`from_entries` builds policies in bulk (C-level dict, set and OrderedDict operations instead of
one `_on_insert` per entry, for the hot swap at 1e6 blocks). This checks, for every registered
online policy, that the bulk build is the very state the one-by-one inserts give: the same
internal structures, the same `entries()`, the same victims, and the same behaviour under the
operations that follow.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import pytest
from conftest import CAPACITY, ONLINE_POLICIES, build_policy, policy_capacity

from sage_eviction import DuplicateKeyError, EntryMeta, EvictionPolicy, PolicyEntry, get_policy_class
from sage_eviction.policies.sieve import _Node
from sage_eviction.recency import _TickQueue

# Counters of lookups and re-prefills: `insert` counts them, a swap's load does not.
_NOT_STATE = {"_tenants", "_select_latency", "_re_prefills", "_evicted"}
_HEAPS = {"_heap", "_levels"}  # heap layouts may differ (heapify vs pushes); contents may not


def _norm(value: Any) -> Any:
    """A comparable picture of a policy attribute; dict order counts."""
    if isinstance(value, _TickQueue):
        return ("queue", value.level, list(value.order), sorted(value.side), list(value.side_live.items()))
    if isinstance(value, _Node):
        return ("node", value.key, value.visited, _key_of(value.newer), _key_of(value.older))
    if isinstance(value, dict):
        return [(k, _norm(v)) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    if isinstance(value, set):
        return ("set", frozenset(value))
    if hasattr(value, "__dict__") and not callable(value):  # a helper object (a predictor)
        return (type(value).__name__, _norm(vars(value)))
    return value


def _key_of(node: _Node | None) -> Any:
    return ("no node",) if node is None else node.key


def _state(policy: EvictionPolicy) -> dict[str, Any]:
    out = {}
    for name, value in vars(policy).items():
        if name in _NOT_STATE:
            continue
        if name in _HEAPS:  # a score heap (compiled or not) or a list
            out[name] = sorted(value.items() if hasattr(value, "items") else value, key=repr)
        else:
            out[name] = _norm(value)
    return out


def _params(name: str) -> dict[str, Any]:
    capacity = policy_capacity(name)
    return {} if capacity is None else {"capacity": capacity}


def _random_entries(seed: int, n: int = 70) -> list[PolicyEntry]:
    """Keys of mixed types (None included), metas with hits, priorities and lifetimes, about a
    third of them not evictable."""
    rng = random.Random(seed)
    keys: list[Hashable] = [None, "a", ("t", 1), 2.5]
    keys += [i if i % 3 else f"k{i}" for i in range(n - len(keys))]
    rng.shuffle(keys)
    entries = []
    for i, key in enumerate(keys):
        meta = EntryMeta(
            size=1 + i % 3,
            cost=float(1 + i % 7),
            priority=rng.randrange(3),
            tenant=rng.choice(["x", "y", None]),
            created_at=float(i),
            last_access=float(i + rng.randrange(5)),
            hits=rng.choice([0, 0, 1, 2, 5]),
            estimated_lifetime=rng.choice([None, 3.0, 9.0]),
            seq_len=10 + i,
            max_len=64,
            deadline=rng.choice([None, 50.0 + i]),
        )
        entries.append(PolicyEntry(key, meta, rng.random() < 0.65))
    return entries


def _source_entries(source: str, seed: int) -> list[PolicyEntry]:
    """`entries()` of a policy after a mixed history: hits (ARC's T2, SLRU's protected
    segment, LFU levels), entries pinned and made evictable again with old ticks, evictions."""
    rng = random.Random(seed)
    policy = build_policy(source)
    held: dict[int, bool] = {}
    for i in range(3 * CAPACITY // 2):
        if len(held) >= CAPACITY and policy.num_evictable:
            for victim in policy.evict(1):
                held.pop(victim)  # type: ignore[call-overload]
        evictable = rng.random() < 0.8
        policy.insert(i, EntryMeta(priority=rng.randrange(3), created_at=float(i)), evictable=evictable)
        held[i] = evictable
        for _ in range(2):
            if rng.random() < 0.5:
                policy.access(rng.choice(list(held)), now=float(i))
        if rng.random() < 0.3:
            key = rng.choice(list(held))
            held[key] = not held[key]
            policy.set_evictable(key, held[key])
    return policy.entries()


def _cases() -> list[tuple[str, int]]:
    return [("random", s) for s in range(3)] + [
        (src, s) for src in ("arc", "lru", "priority", "lfu", "s3fifo", "slru", "sieve") for s in range(2)
    ]


def _entries(source: str, seed: int) -> list[PolicyEntry]:
    return _random_entries(seed) if source == "random" else _source_entries(source, seed)


def _replay(policy: EvictionPolicy, ops: list[tuple[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for op, arg in ops:
        if op == "access" and arg in policy:
            policy.access(arg, now=1e6)
        elif op == "flip" and arg in policy:
            policy.set_evictable(arg, not policy.is_evictable(arg))
        elif op == "insert" and arg not in policy:
            policy.insert(arg, EntryMeta(priority=1))
        elif op == "evict":
            out.append(policy.evict(arg))
    while batch := policy.evict(1):
        out.append(batch)
    return out


@pytest.mark.parametrize("name", ONLINE_POLICIES)
@pytest.mark.parametrize(("source", "seed"), _cases())
def test_from_entries_is_the_one_by_one_build(name: str, source: str, seed: int) -> None:
    entries = _entries(source, seed)
    cls = get_policy_class(name)
    bulk = cls.from_entries(entries, **_params(name))
    each = cls(**_params(name))
    each._load_each(entries)
    inserted = cls(**_params(name))
    for key, meta, evictable in entries:
        inserted.insert(key, meta, evictable=evictable)
    assert bulk.meta(entries[0].key) is entries[0].meta  # the swap hands the metas over as they are

    assert _state(bulk) == _state(each)
    assert bulk.entries() == each.entries() == inserted.entries()
    assert len(bulk) == len(entries)
    assert bulk.num_evictable == sum(e.evictable for e in entries)

    rng = random.Random(seed)
    keys = [e.key for e in entries]
    ops: list[tuple[str, Any]] = []
    for i in range(120):
        op = rng.choice(["access", "access", "flip", "insert", "evict"])
        arg = (
            rng.randrange(1, 4)
            if op == "evict"
            else (10_000 + i if op == "insert" else rng.choice([*keys, 10000 + rng.randrange(i + 1)]))
        )
        ops.append((op, arg))

    # hits change the metas: each policy replays on its own copies
    def copied() -> list[PolicyEntry]:
        return [PolicyEntry(k, replace(m), f) for k, m, f in entries]

    bulk = cls.from_entries(copied(), **_params(name))
    each = cls(**_params(name))
    each._load_each(copied())
    inserted = cls(**_params(name))
    for key, meta, evictable in copied():
        inserted.insert(key, meta, evictable=evictable)
    assert _replay(bulk, ops) == _replay(each, ops) == _replay(inserted, ops)


@pytest.mark.parametrize("name", ONLINE_POLICIES)
def test_from_entries_accepts_any_iterable_and_rejects_a_repeated_key(name: str) -> None:
    entries = _random_entries(7, n=20)
    cls = get_policy_class(name)
    from_list = cls.from_entries(entries, **_params(name))
    from_iter = cls.from_entries(iter(entries), **_params(name))
    from_tuples = cls.from_entries([tuple(e) for e in entries], **_params(name))  # type: ignore[misc]
    assert from_list.entries() == from_iter.entries() == from_tuples.entries()
    with pytest.raises(DuplicateKeyError, match="appears twice"):
        cls.from_entries([*entries, entries[3]], **_params(name))


@pytest.mark.parametrize("name", ONLINE_POLICIES)
@pytest.mark.parametrize(("source", "seed"), [("random", 4), ("arc", 5), ("priority", 6)])
def test_the_swap_columns_are_the_entries(name: str, source: str, seed: int) -> None:
    """`entry_columns()` and `from_entry_columns`, the swap's path, match `entries()` and
    `from_entries`."""
    cls = get_policy_class(name)
    policy = cls.from_entries(_entries(source, seed), **_params(name))
    for _ in range(3):
        policy.evict(1)
    entries = policy.entries()
    keys, metas, flags = policy.entry_columns()
    assert entries == [PolicyEntry(*e) for e in zip(keys, metas, flags, strict=True)]
    for target in ONLINE_POLICIES:
        new_cls = get_policy_class(target)
        via_columns = new_cls.from_entry_columns(keys, metas, flags, **_params(target))
        via_entries = new_cls.from_entries(entries, **_params(target))
        assert _state(via_columns) == _state(via_entries)


def test_a_subclass_that_hooks_inserts_is_loaded_one_by_one() -> None:
    seen: list[Hashable] = []

    class Counting(get_policy_class("lru")):  # type: ignore[misc]
        def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
            seen.append(key)
            super()._on_insert(key, meta, evictable)

    entries = _random_entries(8, n=15)
    Counting.from_entries(entries)
    assert seen == [e.key for e in entries]
    seen.clear()
    Counting.from_entry_columns(*Counting.from_entries(entries).entry_columns())
    assert len(seen) == 2 * len(entries)
