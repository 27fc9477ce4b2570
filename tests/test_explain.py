"""Every registered policy explains its choices, and the explanation is the order it evicts in.

Over hypothesis-generated operation sequences (insert, access, set_evictable, remove, evict)
on each registered online policy (a policy registered later, such as a learned one, is
covered without a change here):

- before each `evict(n)`, `explain_next(n)` names exactly the victims `evict(n)` returns, in
  order, and each explanation is the one `explain` gives;
- at the end, sorting the evictable keys by the explanation's `rank` (the policies that rank by
  one key per entry) or by its `order` (the adaptive ones: ARC, S3-FIFO, SIEVE, SLRU, MQ) gives
  the order in which draining the policy evicts them;
- a key that is not evictable is explained too (its `rank` is what it would rank by now), and
  an unknown key is an `UnknownKeyError`.

Policy-specific values are checked where they can be: ARC names the list REPLACE takes from
next and the victim comes from it; S3-FIFO's and MQ's queue and SLRU's segment agree with their
introspection methods.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import pytest
from conftest import ONLINE_POLICIES, build_policy
from hypothesis import given
from hypothesis import strategies as st

from sage_eviction import EntryMeta, EvictionPolicy, UnknownKeyError

KEYS = st.integers(0, 15)
CAPACITY = 8

_meta = st.builds(
    EntryMeta,
    size=st.integers(1, 4),
    cost=st.sampled_from([0.5, 1.0, 2.0]),
    priority=st.integers(0, 2),
    tenant=st.sampled_from([None, "a", "b"]),
    last_access=st.floats(0, 100),
    hits=st.sampled_from([0, 0, 1, 3]),
    estimated_lifetime=st.one_of(st.none(), st.sampled_from([0.5, 2.0, 20.0])),
    seq_len=st.integers(0, 40),
    max_len=st.sampled_from([0, 10, 40]),
    deadline=st.one_of(st.none(), st.floats(0, 200)),
)

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), KEYS, _meta, st.booleans()),
        st.tuples(st.just("access"), KEYS, st.floats(0, 200)),
        st.tuples(st.just("set_evictable"), KEYS, st.booleans()),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("evict"), st.integers(1, 3)),
    ),
    max_size=60,
)


def _apply(policy: EvictionPolicy, ops: list[tuple[Any, ...]]) -> None:
    """Run `ops` on `policy` as a cache would (a full cache evicts before it inserts), checking
    `explain_next` against every `evict`."""
    for op in ops:
        kind = op[0]
        if kind == "insert":
            _, key, meta, evictable = op
            full = len(policy) >= CAPACITY
            if key in policy or (full and not policy.num_evictable):
                continue
            policy.prepare_insert(key)
            if full:
                _check_evict(policy, 1)
            policy.insert(key, replace(meta), evictable=evictable)
        elif kind == "access" and op[1] in policy:
            policy.access(op[1], op[2])
        elif kind == "set_evictable" and op[1] in policy:
            policy.set_evictable(op[1], op[2])
        elif kind == "remove" and op[1] in policy:
            policy.remove(op[1])
        elif kind == "evict":
            _check_evict(policy, op[1])


def _check_evict(policy: EvictionPolicy, n: int) -> list[Hashable]:
    before = policy.explain_next(n)
    for key, why in before:
        assert why == policy.explain(key)
        assert why["evictable"] is True
    _check_specific(policy, [key for key, _ in before])
    victims = policy.evict(n)
    assert [key for key, _ in before] == victims
    return victims


def _check_specific(policy: EvictionPolicy, upcoming: list[Hashable]) -> None:
    """What each adaptive policy's own values promise about its next victim."""
    if not upcoming:
        return
    why = policy.explain(upcoming[0])
    if policy.name == "arc":
        assert why["list"] == why["replace_from"]
        assert why["order"] == 0
    if policy.name == "slru":
        assert why["segment"] == policy.segment_of(upcoming[0])  # type: ignore[attr-defined]
    if policy.name in ("s3fifo", "mq"):
        assert why["queue"] == policy.queue_of(upcoming[0])  # type: ignore[attr-defined]


def _sort_key(why: dict[str, object]) -> Any:
    assert "rank" in why or "order" in why, (
        f"{why.get('policy')}: explain() of an evictable entry must give 'rank' or 'order' "
        "(start from super().explain(key), or add values through _explain_values)"
    )
    return why["rank"] if "rank" in why else why["order"]


@pytest.mark.parametrize("name", ONLINE_POLICIES)
@given(ops=_ops)
def test_explained_order_is_the_eviction_order(name: str, ops: list[tuple[Any, ...]]) -> None:
    policy = build_policy(name, CAPACITY)
    _apply(policy, ops)
    held = [key for key in range(16) if key in policy]
    explained = {key: policy.explain(key) for key in held}
    for key, why in explained.items():
        assert why["policy"] == policy.name
        assert why["evictable"] == policy.is_evictable(key)
        assert why["hits"] == policy.meta(key).hits
        if not why["evictable"]:
            assert "order" not in why  # only evictable entries have a place in the order
    evictable = [key for key in held if policy.is_evictable(key)]
    implied = sorted(evictable, key=lambda key: _sort_key(explained[key]))
    drained: list[Hashable] = []
    while policy.num_evictable:
        drained.extend(_check_evict(policy, 1))
    assert drained == implied


@pytest.mark.parametrize("name", ONLINE_POLICIES)
def test_rank_is_all_or_nothing_and_unknown_keys_are_errors(name: str) -> None:
    """A policy either ranks every entry by a key (pinned ones too) or none: the log's
    "skipped" list compares pinned blocks with the victim only when it does."""
    policy = build_policy(name, CAPACITY)
    policy.insert("a", EntryMeta(last_access=1.0))
    policy.insert("b", EntryMeta(last_access=2.0), evictable=False)
    ranks = [policy.rank("a"), policy.rank("b")]
    assert all(r is None for r in ranks) or all(isinstance(r, tuple) for r in ranks)
    assert isinstance(policy.explains_by, str) and policy.explains_by
    with pytest.raises(UnknownKeyError):
        policy.explain("missing")
    with pytest.raises(UnknownKeyError):
        policy.rank("missing")
    assert policy.explain_next(0) == [] and policy.peek(0) == []


def test_lru_explains_by_its_clock() -> None:
    """A worked example: LRU's values are its logical ticks, and a hit moves a block back."""
    policy = build_policy("lru")
    for key in "abc":
        policy.insert(key)
    policy.access("a", 5.0)
    [(first, why), (second, _)] = policy.explain_next(2)
    assert (first, second) == ("b", "c")
    assert why["rank"] == (2,) and why["tick"] == 2 and why["clock"] == 4
    assert policy.explain("a")["rank"] == (4,)
