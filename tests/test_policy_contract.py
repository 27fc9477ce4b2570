"""The contract every registered online policy keeps (cachetools' CacheTestMixin, applied to
the registry): the incremental interface and the module spec's interface (docs/architecture.md,
"Policy interface").

Offline policies (`offline = True`, e.g. Belady) need the future and are tested at the end of
this file through their own documented entry point.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

import pytest
from conftest import OFFLINE_POLICIES, ONLINE_POLICIES, build_policy, policy_capacity
from hypothesis import given
from hypothesis import strategies as st

from sage_eviction import (
    DuplicateKeyError,
    EntryMeta,
    EvictionCandidate,
    EvictionMetrics,
    EvictionPolicy,
    PolicyEntry,
    PolicyStateError,
    UnknownKeyError,
    get_policy_class,
)
from sage_eviction.preemption import get_order

# ---- helpers -------------------------------------------------------------------------------


def _meta(i: int) -> EntryMeta:
    """A varied but deterministic meta for the i-th key."""
    return EntryMeta(
        size=1 + i % 4,
        cost=float(1 + i % 5),
        priority=i % 3,
        tenant=("a", "b", None)[i % 3],
        created_at=float(i),
        last_access=float(i),
        estimated_lifetime=None if i % 4 == 0 else float(5 + (i * 7) % 11),
        seq_len=10 + i,
        max_len=40 + (i % 3) * 20,
        deadline=None if i % 5 == 0 else float(100 + (i * 13) % 17),
    )


def _populate(policy: EvictionPolicy, n: int = 30, seed: int = 0) -> dict[int, bool]:
    """Insert `n` keys (every fourth pinned), hit some, flip some flags; returns key -> evictable."""
    rng = random.Random(seed)
    state: dict[int, bool] = {}
    for i in range(n):
        evictable = i % 4 != 3
        policy.insert(i, _meta(i), evictable=evictable)
        state[i] = evictable
        if i and rng.random() < 0.5:
            key = rng.randrange(i)
            policy.access(key, now=float(n + i))
    for key in rng.sample(range(n), n // 5):
        state[key] = not state[key]
        policy.set_evictable(key, state[key])
    return state


def _drain(policy: EvictionPolicy) -> list[Hashable]:
    victims: list[Hashable] = []
    while batch := policy.evict(1):
        victims.extend(batch)
    return victims


def _params(name: str) -> dict[str, Any]:
    capacity = policy_capacity(name)
    return {} if capacity is None else {"capacity": capacity}


# ---- evict ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100])
def test_evict_returns_at_most_n_distinct_evictable_keys_and_forgets_them(
    policy: EvictionPolicy, n: int
) -> None:
    state = _populate(policy)
    while True:
        before = len(policy)
        evictable_before = policy.num_evictable
        assert evictable_before == sum(state.values())
        victims = policy.evict(n)
        assert len(victims) == min(n, evictable_before)
        assert len(set(victims)) == len(victims)
        for key in victims:
            assert state.pop(key) is True, f"evicted {key!r}, which was not evictable"
            assert key not in policy
            assert not policy.is_evictable(key)
        assert len(policy) == before - len(victims)
        assert policy.num_evictable == evictable_before - len(victims)
        if not victims:
            break
    assert set(state) == {k for k in range(30) if k in policy}
    assert not any(state.values())
    assert policy.evict(5) == []


def test_evict_on_empty_and_evict_zero(policy: EvictionPolicy) -> None:
    assert policy.evict(1) == []
    assert policy.evict(10) == []
    policy.insert("a", EntryMeta())
    assert policy.evict(0) == []
    assert len(policy) == 1
    assert policy.evict(1) == ["a"]
    assert len(policy) == 0
    assert policy.evict(1) == []


def test_pinned_entries_are_never_evicted(policy: EvictionPolicy) -> None:
    for i in range(40):
        policy.insert(i, _meta(i), evictable=i % 2 == 0)
    for i in range(0, 40, 4):
        policy.access(i, now=100.0 + i)
    victims = _drain(policy)
    assert sorted(victims) == list(range(0, 40, 2))  # type: ignore[type-var]
    assert len(policy) == 20
    assert policy.num_evictable == 0
    for i in range(1, 40, 2):
        policy.set_evictable(i, True)
    assert sorted(_drain(policy)) == list(range(1, 40, 2))  # type: ignore[type-var]
    assert len(policy) == 0


def test_a_key_can_come_back_after_eviction_or_removal(policy: EvictionPolicy) -> None:
    for i in range(10):
        policy.insert(i, _meta(i))
    victims = policy.evict(3)
    removed = next(k for k in range(10) if k in policy)
    policy.remove(removed)
    for key in [*victims, removed]:
        policy.insert(key, _meta(0))
        assert key in policy
        assert policy.is_evictable(key)
    assert len(policy) == 10
    assert sorted(_drain(policy)) == list(range(10))  # type: ignore[type-var]


def test_keys_of_any_hashable_type_are_never_compared(policy: EvictionPolicy) -> None:
    keys: list[Hashable] = [3, "3", b"3", (3, "x"), frozenset({3}), 3.5, None, ("a", 1)]
    for key in keys:
        policy.insert(key, EntryMeta())  # equal metas: the order falls to the tie-breaks
    for key in keys[::3]:
        policy.access(key, now=1.0)
    assert sorted(map(repr, _drain(policy))) == sorted(map(repr, keys))


# ---- bookkeeping ---------------------------------------------------------------------------


def test_access_updates_the_meta(policy: EvictionPolicy) -> None:
    meta = EntryMeta(last_access=1.0)
    policy.insert("k", meta)
    policy.access("k", now=5.0)
    policy.access("k", now=7.5)
    assert policy.meta("k") is meta
    assert (meta.hits, meta.last_access) == (2, 7.5)
    policy.access("k")  # wall time
    assert meta.hits == 3
    assert meta.last_access > 7.5


def test_remove_returns_the_meta_and_forgets_the_key(policy: EvictionPolicy) -> None:
    metas = {i: _meta(i) for i in range(6)}
    for i, meta in metas.items():
        policy.insert(i, meta, evictable=i != 5)
    assert policy.remove(2) is metas[2]
    assert policy.remove(5) is metas[5]  # a pinned one too
    assert 2 not in policy
    assert 5 not in policy
    assert (len(policy), policy.num_evictable) == (4, 4)
    assert sorted(_drain(policy)) == [0, 1, 3, 4]


def test_set_evictable_is_idempotent(policy: EvictionPolicy) -> None:
    policy.insert("a", EntryMeta(), evictable=False)
    policy.insert("b", EntryMeta())
    policy.set_evictable("a", False)
    policy.set_evictable("b", True)
    assert policy.num_evictable == 1
    policy.set_evictable("a", True)
    policy.set_evictable("a", True)
    assert policy.num_evictable == 2
    assert sorted(_drain(policy)) == ["a", "b"]


# ---- errors --------------------------------------------------------------------------------


def test_double_insert_raises_duplicate_key_error(policy: EvictionPolicy) -> None:
    policy.insert(("seq", 7), EntryMeta())
    with pytest.raises(DuplicateKeyError) as info:
        policy.insert(("seq", 7), EntryMeta(), evictable=False)
    assert isinstance(info.value, KeyError)
    assert "('seq', 7)" in str(info.value)
    assert (len(policy), policy.num_evictable) == (1, 1)
    assert policy.evict(2) == [("seq", 7)]


@pytest.mark.parametrize(
    "operation",
    [
        lambda p, k: p.access(k, now=1.0),
        lambda p, k: p.remove(k),
        lambda p, k: p.set_evictable(k, True),
        lambda p, k: p.set_evictable(k, False),
        lambda p, k: p.meta(k),
    ],
    ids=["access", "remove", "set_evictable-true", "set_evictable-false", "meta"],
)
def test_unknown_key_raises_unknown_key_error(policy: EvictionPolicy, operation: Any) -> None:
    policy.insert("held", EntryMeta(), evictable=False)
    policy.insert("evicted", EntryMeta())
    assert policy.evict(1) == ["evicted"]
    policy.set_evictable("held", True)
    for key in ("block-0xdeadbeef", "evicted"):  # never held, and held no more
        with pytest.raises(UnknownKeyError) as info:
            operation(policy, key)
        assert isinstance(info.value, KeyError)
        assert repr(key) in str(info.value)
        assert (len(policy), policy.num_evictable) == (1, 1)
    assert policy.evict(1) == ["held"]


# ---- hot swap: entries() and from_entries() ------------------------------------------------


def _snapshot(policy: EvictionPolicy) -> dict[Hashable, tuple[EntryMeta, bool]]:
    entries = policy.entries()
    assert all(isinstance(e, PolicyEntry) for e in entries)
    snapshot = {e.key: (e.meta, e.evictable) for e in entries}
    assert len(snapshot) == len(entries) == len(policy), "entries() repeats or misses a key"
    return snapshot


def test_from_entries_keeps_every_entry(policy_name: str) -> None:
    old = build_policy(policy_name)
    state = _populate(old, n=40, seed=3)
    snapshot = _snapshot(old)
    assert {k: ev for k, (_, ev) in snapshot.items()} == state
    for key, (meta, _) in snapshot.items():
        assert meta == old.meta(key)

    new = type(old).from_entries(old.entries(), **_params(policy_name))
    assert type(new) is type(old)
    assert len(new) == len(old)
    assert new.num_evictable == old.num_evictable
    for key, (meta, evictable) in snapshot.items():
        assert key in new
        assert new.meta(key) == meta
        assert new.is_evictable(key) is evictable
    assert _snapshot(new).keys() == snapshot.keys()


def test_from_entries_preserves_the_eviction_order(policy_name: str) -> None:
    cls = get_policy_class(policy_name)
    if not cls.order_preserving:
        pytest.skip(f"{policy_name} declares order_preserving = False")
    for seed in range(5):
        old = build_policy(policy_name)
        _populate(old, n=40, seed=seed)
        new = cls.from_entries(old.entries(), **_params(policy_name))
        assert _drain(new) == _drain(old), f"seed {seed}"


def test_from_entries_of_an_empty_policy(policy_name: str) -> None:
    old = build_policy(policy_name)
    assert old.entries() == []
    new = type(old).from_entries([], **_params(policy_name))
    assert len(new) == 0
    assert new.evict(1) == []


def test_from_entries_rejects_a_repeated_key(policy_name: str) -> None:
    entries = [PolicyEntry("a", EntryMeta(), True), PolicyEntry("a", EntryMeta(), False)]
    with pytest.raises(DuplicateKeyError, match="'a'"):
        get_policy_class(policy_name).from_entries(entries, **_params(policy_name))


# ---- select_victims, update_access, get_metrics (the module spec's interface) ---------------

# (blocks, last access, access count, priority, pinned, lifetime, length, room left)
_candidate = st.tuples(
    st.integers(0, 6),
    st.sampled_from([0.0, 1.0, 2.0, 2.5, 10.0]),
    st.integers(0, 10),
    st.integers(0, 2),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from([0.5, 3.0, 30.0])),
    st.integers(0, 64),
    st.integers(0, 64),
)


def _candidates(raw: list[tuple[Any, ...]]) -> list[EvictionCandidate]:
    out = []
    next_block = 0
    for sid, (blocks, last, count, prio, pinned, life, seq, extra) in enumerate(raw):
        out.append(
            EvictionCandidate(
                sequence_id=100 + sid * 3,
                block_ids=list(range(next_block, next_block + blocks)),
                last_access_time=last,
                access_count=count,
                priority=prio,
                is_pinned=pinned,
                estimated_lifetime=life,
                sequence_length=seq,
                max_length=seq + extra,
            )
        )
        next_block += blocks
    return out


def _check_selection(candidates: list[EvictionCandidate], required: int, victims: list[int]) -> None:
    by_id = {c.sequence_id: c for c in candidates}
    unpinned = [c for c in candidates if not c.is_pinned]
    assert len(set(victims)) == len(victims), "a sequence chosen twice"
    for sid in victims:
        assert sid in by_id, f"victim {sid} is not a candidate"
        assert not by_id[sid].is_pinned, f"pinned sequence {sid} chosen"
    if required <= 0:
        assert victims == []
        return
    freed = sum(len(by_id[s].block_ids) for s in victims)
    available = sum(len(c.block_ids) for c in unpinned)
    if available >= required:
        assert freed >= required
        before_last = freed - len(by_id[victims[-1]].block_ids)
        assert before_last < required, "kept choosing after enough blocks were freed"
    else:
        assert sorted(victims) == sorted(c.sequence_id for c in unpinned)


@pytest.mark.parametrize("name", ONLINE_POLICIES)
@given(
    raw=st.lists(_candidate, max_size=25), required=st.integers(-3, 60), accessed=st.lists(st.integers(0, 30))
)
def test_select_victims_contract(name: str, raw: list[Any], required: int, accessed: list[int]) -> None:
    policy = build_policy(name)
    candidates = _candidates(raw)
    for i in accessed:
        policy.update_access(100 + i * 3)
    victims = policy.select_victims(candidates, required)
    _check_selection(candidates, required, victims)
    # the input is left as it was
    assert [c.sequence_id for c in candidates] == [100 + 3 * i for i in range(len(raw))]


def _naive_select(candidates: list[EvictionCandidate], required: int, key: Any) -> list[int]:
    """The definition: unpinned candidates sorted by (key, position), taken until enough."""
    if required <= 0:
        return []
    victims, freed = [], 0
    for _, _, c in sorted((key(c), i, c) for i, c in enumerate(candidates) if not c.is_pinned):
        if freed >= required:
            break
        victims.append(c.sequence_id)
        freed += len(c.block_ids)
    return victims


@pytest.mark.parametrize("name", ONLINE_POLICIES)
@given(
    data=st.data(),
    n=st.sampled_from([0, 1, 5, 129, 300, 1000]),
    required=st.sampled_from([-1, 0, 1, 7, 50, 100, 400, 3000, 10**6]),
)
def test_select_in_order_takes_exactly_the_policy_order(
    name: str, data: st.DataObject, n: int, required: int
) -> None:
    """`select_in_order`'s sampling shortcut changes nothing: the victims are exactly those of
    a full sort, for large lists too, with ties, pins and blocks of any count."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    pinned = data.draw(st.sampled_from([0.0, 0.1, 0.5, 0.95, 1.0]), label="pinned fraction")
    distinct_times = data.draw(st.sampled_from([1, 3, 1000]), label="distinct access times")
    candidates = [
        EvictionCandidate(
            sequence_id=i,
            block_ids=list(range(rng.choice((0, 1, 10, 10, 10, 40)))),
            last_access_time=float(rng.randrange(distinct_times)),
            access_count=rng.randint(1, 10),
            priority=rng.randint(0, 2),
            is_pinned=rng.random() < pinned,
            estimated_lifetime=rng.choice((None, rng.uniform(0.1, 30.0))),
            sequence_length=rng.randint(0, 100),
            max_length=rng.randint(0, 200),
        )
        for i in range(n)
    ]
    if data.draw(st.booleans(), label="descending"):
        candidates.sort(key=lambda c: -c.last_access_time)
    policy = build_policy(name)
    victims = policy.select_victims(candidates, required)
    assert victims == _naive_select(candidates, required, get_order(type(policy).preemption_order).key)
    _check_selection(candidates, required, victims)


def test_select_victims_module_spec_scenario(policy: EvictionPolicy) -> None:
    rng = random.Random(7)
    candidates = [
        EvictionCandidate(
            sequence_id=i,
            block_ids=list(range(i * 10, (i + 1) * 10)),
            last_access_time=1000.0 + rng.random(),
            access_count=rng.randint(1, 10),
            priority=rng.randint(0, 2),
            is_pinned=i % 10 == 0,
        )
        for i in range(1000)
    ]
    victims = policy.select_victims(candidates, required_blocks=100)
    _check_selection(candidates, 100, victims)
    assert len(victims) == 10
    assert policy.select_victims(candidates, required_blocks=0) == []
    assert policy.select_victims(candidates, required_blocks=-1) == []
    everything = policy.select_victims(candidates, required_blocks=10**6)
    assert sorted(everything) == [i for i in range(1000) if i % 10]
    assert policy.select_victims([], required_blocks=5) == []


def test_update_access_and_get_metrics(policy: EvictionPolicy) -> None:
    for sid in (1, 2, 2, 3, 3, 3):
        policy.update_access(sid)
    candidates = [EvictionCandidate(s, [s], float(s), s, 1, False) for s in (1, 2, 3, 4)]
    _check_selection(candidates, 2, policy.select_victims(candidates, 2))

    for i in range(10):
        policy.insert(i, _meta(i))
    policy.access(3, now=50.0)
    assert len(policy.evict(3)) == 3
    assert len(policy.evict(1)) == 1
    metrics = policy.get_metrics()
    assert isinstance(metrics, EvictionMetrics)
    assert metrics.total_evictions == 4
    assert metrics.strategy
    assert 0.0 <= metrics.hit_rate <= 1.0
    assert 0.0 <= metrics.fairness_score <= 1.0
    assert metrics.re_prefill_rate == 0.0
    # The decision time is select_victims' (called once above), measured: never zero.
    assert metrics.extra["select_victims_calls"] == 1
    assert metrics.avg_eviction_time > 0.0
    assert metrics.p99_eviction_time >= metrics.p50_eviction_time > 0.0
    assert isinstance(metrics.to_dict(), dict)


def test_re_prefill_rate_counts_evicted_keys_that_come_back(policy: EvictionPolicy) -> None:
    for i in range(8):
        policy.insert(i, EntryMeta())
    victims = policy.evict(4)
    policy.insert(victims[0], EntryMeta())
    assert policy.get_metrics().re_prefill_rate == pytest.approx(1 / 4)


# ---- offline policies ----------------------------------------------------------------------
#
# An offline policy needs the future; Belady documents `set_future(keys, strict=...)`, called
# before the first insert or access, with every lookup the cache will serve in order.


def _drive_offline(policy: EvictionPolicy, trace: list[int], capacity: int) -> list[int | None]:
    victims: list[int | None] = []
    for i, key in enumerate(trace):
        if key in policy:
            policy.access(key, now=float(i))
            victims.append(None)
            continue
        chosen = policy.evict(1) if len(policy) >= capacity else []
        assert len(chosen) <= 1
        policy.insert(key, EntryMeta(created_at=float(i), last_access=float(i)))
        victims.append(chosen[0] if chosen else None)  # type: ignore[arg-type]
    return victims


def _offline(name: str) -> EvictionPolicy:
    if name not in OFFLINE_POLICIES:
        pytest.skip(f"offline policy {name!r} is not registered")
    return build_policy(name)


def test_offline_policies_are_flagged_and_kept_out_of_the_online_list() -> None:
    for name in OFFLINE_POLICIES:
        cls = get_policy_class(name)
        assert cls.offline is True
        assert cls.paper
        assert name not in ONLINE_POLICIES


@pytest.mark.parametrize("capacity", [1, 2, 3, 5])
@given(trace=st.lists(st.integers(0, 7), max_size=60))
def test_belady_evicts_the_farthest_next_use(capacity: int, trace: list[int]) -> None:
    """Every victim's next use is the farthest of those held (ties only among keys never
    used again, which any choice of gives the same misses)."""
    policy = _offline("belady")
    policy.set_future(trace)  # type: ignore[attr-defined]
    held: set[int] = set()
    for i, (key, victim) in enumerate(zip(trace, _drive_offline(policy, trace, capacity), strict=True)):
        if victim is None:
            held.add(key)
            continue

        def next_use(k: int, start: int = i) -> int:
            return trace.index(k, start) if k in trace[start:] else len(trace)

        assert victim in held
        assert next_use(victim) == max(map(next_use, held)), f"position {i}: evicted {victim}"
        held.discard(victim)
        held.add(key)


def test_belady_misses_no_more_than_any_online_policy() -> None:
    rng = random.Random(11)
    trace = [int(rng.paretovariate(1.2)) % 40 for _ in range(2000)]

    def misses(policy: EvictionPolicy) -> int:  # inserts: what is still held plus what was evicted
        evicted = sum(v is not None for v in _drive_offline(policy, trace, 8))
        return len(policy) + evicted

    belady = _offline("belady")
    belady.set_future(trace)  # type: ignore[attr-defined]
    optimal = misses(belady)
    online = {name: misses(build_policy(name, capacity=8)) for name in ONLINE_POLICIES}
    assert all(optimal <= m for m in online.values()), (optimal, online)
    assert optimal < min(online.values())


def test_belady_strict_future_errors() -> None:
    policy = _offline("belady")
    with pytest.raises(PolicyStateError, match="set_future"):
        policy.insert("a", EntryMeta())
    policy.set_future(["a", "b", "a"])  # type: ignore[attr-defined]
    policy.insert("a", EntryMeta())
    with pytest.raises(PolicyStateError, match="'c'"):
        policy.insert("c", EntryMeta())  # position 1 is 'b'
    policy.insert("b", EntryMeta())
    policy.access("a", now=1.0)
    with pytest.raises(PolicyStateError):
        policy.access("b", now=2.0)  # past the end of the future
    assert policy.evict(1) == ["b"]  # never used again
