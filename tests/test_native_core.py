"""The policies' compiled core (sage_eviction/_core.pyx) against the pure-Python reference.

Differential tests: every registered policy is built twice, once with the compiled core and
once inside `native.pure_python()` (the reference), and both twins are driven through the same
hypothesis-generated operation sequences (insert, access, set_evictable, remove, evict,
select_victims, a hot swap through from_entries / from_entry_columns). They must return the
same victims in the same order, raise the same errors, and end with the same entries, peek,
rank, explanations and metrics. The core's copy of every named preemption order
(`sage_eviction.preemption.ORDERS`) is also held to a third, plain reference: a stable sort of
the unpinned candidates by the order's Python key.

NaN scores are left out: NaN is not ordered, and neither implementation promises an order for
it (the compiled heap hands such items to the pure-Python heap, whose layout differs).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import subprocess
import sys
from collections.abc import Callable, Hashable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import CAPACITY, COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_eviction import (
    EntryMeta,
    EvictionCandidate,
    EvictionPolicy,
    available_policies,
    create_policy,
    get_policy_class,
    native,
    resolve_policy,
)
from sage_eviction.flat import FlatCache
from sage_eviction.heap import HeapPolicy, _ListHeap
from sage_eviction.policies.lru import LRUPolicy
from sage_eviction.preemption import ORDERS, get_order

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

ONLINE = available_policies(include_offline=False)
ALL = available_policies()
ROOT = Path(__file__).resolve().parents[1]


def _params(name: str) -> dict[str, Any]:
    return {"capacity": CAPACITY} if get_policy_class(name).needs_capacity else {}


def twins(name: str) -> tuple[EvictionPolicy, EvictionPolicy]:
    """(compiled, pure) instances of `name`."""
    compiled = create_policy(name, **_params(name))
    with native.pure_python():
        pure = create_policy(name, **_params(name))
    assert compiled._compiled and not pure._compiled
    if isinstance(compiled, HeapPolicy):
        assert not isinstance(compiled._heap, _ListHeap) and isinstance(pure._heap, _ListHeap)
    return compiled, pure


# ---- strategies ------------------------------------------------------------------------------

# ints beyond 2**53 are exact in Python and not in a double: the core must hand them to Python
numbers = st.one_of(st.floats(0.0, 1e4, allow_nan=False), st.integers(0, 1000), st.integers(2**53, 2**60))

metas = st.builds(
    EntryMeta,
    size=st.integers(1, 32),
    cost=st.one_of(st.floats(0.0, 1e4), st.integers(0, 2**60), st.sampled_from([0.0, 1.0, 16.0, math.inf])),
    priority=st.integers(0, 2),
    tenant=st.sampled_from([None, "a", "b"]),
    last_access=st.one_of(st.floats(0.0, 100.0), st.integers(0, 100)),
    estimated_lifetime=st.one_of(st.none(), numbers),
    seq_len=st.integers(0, 4096),
    max_len=st.integers(0, 4096),
    deadline=st.one_of(st.none(), st.floats(-10.0, 200.0)),
    depth=st.integers(0, 8),
    pos_from_end=st.integers(-2, 40),
    prompt_blocks=st.integers(0, 64),
)

keys = st.integers(0, 12)


@st.composite
def candidate_lists(draw: st.DrawFn, plain: bool = False, most: int = 300) -> list[EvictionCandidate]:
    """Up to `most` candidates with many ties (few distinct times and counts), built from a
    drawn seed (fast to draw at this size); `plain`: only values the compiled core reads itself
    (no huge ints, no NaN). Over 128 of them take the reference's sampled fast path."""
    n = draw(st.integers(0, most))
    rng = random.Random(draw(st.integers(0, 2**32)))
    times = draw(st.lists(st.one_of(st.floats(0.0, 100.0), st.integers(0, 100)), min_size=1, max_size=6))
    pinned = draw(st.sampled_from([0.0, 0.3, 0.9]))
    odd = 0.0 if plain else draw(st.sampled_from([0.0, 0.02, 0.3]))  # huge ints, NaN lifetimes
    ids = list(range(-n // 2, n - n // 2))
    rng.shuffle(ids)
    lifetimes: list[Any] = [None, None, 0.0, 2.5, 7, 30.0]
    out = []
    for i in range(n):
        out.append(
            EvictionCandidate(
                sequence_id=ids[i],
                block_ids=list(range(rng.randint(0, 12))),
                last_access_time=rng.choice(times),
                access_count=rng.randint(2**53, 2**60) if rng.random() < odd else rng.randint(0, 12),
                priority=rng.randint(0, 3),
                is_pinned=rng.random() < pinned,
                estimated_lifetime=math.nan if rng.random() < odd else rng.choice(lifetimes),
                sequence_length=rng.randint(0, 4096),
                max_length=rng.choice((0, rng.randint(0, 4096))),
            )
        )
    return out


def reference_select(
    candidates: list[EvictionCandidate], required: int, key: Callable[[EvictionCandidate], Any]
) -> list[int]:
    """The plainest reading of select_victims: stable sort by key, take unpinned until enough."""
    if required <= 0:
        return []
    victims, freed = [], 0
    for c in sorted(candidates, key=key):
        if not c.is_pinned:
            victims.append(c.sequence_id)
            freed += len(c.block_ids)
            if freed >= required:
                break
    return victims


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), keys, metas, st.booleans()),
        st.tuples(st.just("access"), keys, st.one_of(st.floats(0.0, 1e3), st.integers(0, 1000))),
        st.tuples(st.just("set_evictable"), keys, st.booleans()),
        st.tuples(st.just("remove"), keys),
        st.tuples(st.just("evict"), st.integers(0, 4)),
        st.tuples(st.just("peek"), st.integers(0, 5)),
        st.tuples(st.just("swap"), st.sampled_from(ONLINE), st.booleans()),
        st.tuples(st.just("select"), candidate_lists(most=20), st.integers(0, 60)),
    ),
    max_size=70,
)


# ---- driving two policies side by side ---------------------------------------------------------


def _apply(policy: EvictionPolicy, op: tuple[Any, ...]) -> tuple[EvictionPolicy, Any]:
    """Run one op; returns the policy (a swap replaces it) and what the op gave or raised."""
    kind = op[0]
    try:
        if kind == "insert":
            return policy, policy.insert(op[1], replace(op[2]), evictable=op[3])  # own meta copy
        if kind == "access":
            return policy, policy.access(op[1], op[2])
        if kind == "set_evictable":
            return policy, policy.set_evictable(op[1], op[2])
        if kind == "remove":
            return policy, policy.remove(op[1])
        if kind == "evict":
            return policy, policy.evict(op[1])
        if kind == "peek":
            return policy, policy.peek(op[1])
        if kind == "select":
            return policy, policy.select_victims(op[1], op[2])
        if kind == "swap":  # the cache manager's hot swap, by entries or by columns
            cls = get_policy_class(op[1])
            if op[2]:
                return cls.from_entry_columns(*policy.entry_columns(), **_params(op[1])), "swapped"
            return cls.from_entries(policy.entries(), **_params(op[1])), "swapped"
    except Exception as exc:  # the same error, by type and message
        return policy, ("raised", type(exc).__name__, str(exc))
    raise AssertionError(op)


def _picture(policy: EvictionPolicy) -> dict[str, Any]:
    """Everything a user can read of a policy, timings aside."""
    m = policy.get_metrics()
    entries = policy.entries()
    return {
        "name": policy.name,
        "len": len(policy),
        "evictable": policy.num_evictable,
        "entries": [(e.key, e.meta, e.evictable) for e in entries],
        "peek": policy.peek(len(policy) + 1),
        "rank": {e.key: policy.rank(e.key) for e in entries},
        "explain": {e.key: policy.explain(e.key) for e in entries},
        "explain_next": policy.explain_next(3),
        "metrics": (m.total_evictions, m.re_prefill_rate, m.fairness_score, m.strategy, m.hit_rate, m.extra),
        "describe": policy.describe(),
    }


def _drive(name: str, sequence: list[tuple[Any, ...]]) -> tuple[EvictionPolicy, EvictionPolicy]:
    compiled, pure = twins(name)
    for step, op in enumerate(sequence):
        compiled, got = _apply(compiled, op)
        with native.pure_python():  # a swap builds the pure twin's successor pure too
            pure, want = _apply(pure, op)
        assert got == want, f"{name}, step {step} {op[0]}: compiled {got!r}, pure-python {want!r}"
    assert _picture(compiled) == _picture(pure)
    return compiled, pure


@pytest.mark.parametrize("name", ONLINE)
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sequence=ops)
def test_compiled_and_pure_python_policies_agree_on_every_operation(
    name: str, sequence: list[tuple[Any, ...]]
) -> None:
    _drive(name, sequence)


@pytest.mark.parametrize("name", ONLINE)
def test_the_twins_agree_under_a_long_seeded_churn(name: str) -> None:
    """Thousands of operations: heaps that grow, refill and pop many stale items."""
    rng = random.Random(name)
    sequence: list[tuple[Any, ...]] = []
    for i in range(3000):
        r = rng.random()
        key = rng.randrange(400)
        if r < 0.4:
            meta = EntryMeta(
                size=rng.randint(1, 16), cost=float(rng.randint(1, 64)), priority=rng.randint(0, 2),
                last_access=float(i), seq_len=rng.randint(0, 512), max_len=rng.choice((0, 512)),
                estimated_lifetime=rng.choice((None, rng.uniform(0, 30))),
                deadline=rng.choice((None, i + rng.uniform(-5, 60))),
            )  # fmt: skip
            sequence.append(("insert", key, meta, rng.random() < 0.9))
        elif r < 0.7:
            sequence.append(("access", key, float(i)))
        elif r < 0.8:
            sequence.append(("set_evictable", key, rng.random() < 0.6))
        elif r < 0.85:
            sequence.append(("remove", key))
        else:
            sequence.append(("evict", rng.randint(1, 3)))
    _drive(name, sequence)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=25)
@given(requests=st.lists(st.integers(0, 40), max_size=400), capacity=st.integers(1, 24))
def test_flat_simulations_evict_the_same_blocks(name: str, requests: list[int], capacity: int) -> None:
    """Every policy, Belady (offline, a heap policy) included, in the flat cache model."""
    if get_policy_class(name).needs_capacity and capacity < 2:
        capacity = 2
    runs = []
    for pure in (False, True):
        victims: list[Hashable] = []
        with native.pure_python() if pure else contextlib.nullcontext():
            cache = FlatCache(name, capacity, future=requests, on_evict=_recorder(victims))
        for key in requests:
            cache.request(key)
        runs.append((victims, cache.result()))
    assert runs[0] == runs[1]


def _recorder(victims: list[Hashable]) -> Callable[[Hashable, float], None]:
    return lambda key, seconds: victims.append(key)


# ---- select_victims --------------------------------------------------------------------------


@pytest.mark.parametrize("order", sorted(ORDERS))
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(candidates=candidate_lists(), required=st.integers(-1, 200))
def test_select_victims_agrees_with_python_and_with_a_plain_sort(
    order: str, candidates: list[EvictionCandidate], required: int
) -> None:
    """Every named order, given to `select_victims`: the compiled core's copy of its key, the
    pure-Python path and a plain stable sort by its key choose the same victims."""
    compiled, pure = twins("lru")
    chosen = ORDERS[order]
    got = compiled.select_victims(candidates, required, chosen)
    assert got == pure.select_victims(candidates, required, chosen)
    if any(isinstance(c.estimated_lifetime, float) and math.isnan(c.estimated_lifetime) for c in candidates):
        return  # no plain sort with NaN keys
    assert got == reference_select(candidates, required, chosen.key)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(candidates=candidate_lists(), required=st.integers(-1, 200))
def test_a_policy_without_an_order_given_takes_its_own(
    name: str, candidates: list[EvictionCandidate], required: int
) -> None:
    compiled, pure = twins(name)
    own = get_order(type(compiled).preemption_order)
    got = compiled.select_victims(candidates, required)
    assert got == pure.select_victims(candidates, required)
    assert got == compiled.select_victims(candidates, required, own)


@pytest.mark.parametrize("order", sorted(ORDERS))
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(candidates=candidate_lists(plain=True), required=st.integers(1, 200))
def test_the_core_answers_for_ordinary_candidates(
    order: str, candidates: list[EvictionCandidate], required: int
) -> None:
    """On the values engines send (small ints, finite floats) the compiled key of every named
    order answers itself (it does not hand the call back to Python), and gives the plain sort's
    victims."""
    chosen = ORDERS[order]
    assert chosen.compiled is not None, f"{order} has no compiled candidate key"
    got = native.load(native.CORE).select_victims(candidates, required, *chosen.compiled)  # type: ignore[union-attr]
    assert got is not None
    assert got == reference_select(candidates, required, chosen.key)


def test_a_non_list_or_foreign_candidate_goes_to_python() -> None:
    core = native.load(native.CORE)
    assert core is not None

    class Other:
        def __init__(self, i: int) -> None:
            self.sequence_id, self.block_ids, self.last_access_time = i, [i], float(-i)
            self.access_count, self.priority, self.is_pinned = 1, 0, False

    others: list[Any] = [Other(i) for i in range(4)]
    assert core.select_victims(others, 2, "lru", ()) is None
    assert LRUPolicy().select_victims(others, 2) == [3, 2]  # answered by Python
    assert LRUPolicy().select_victims(tuple(others), 2) == [3, 2]  # type: ignore[arg-type]
    assert core.select_victims([], 2.5, "lru", ()) is None  # not an int: Python's comparison


# ---- the score heap --------------------------------------------------------------------------


def test_the_score_heap_refuses_what_a_double_cannot_order_exactly() -> None:
    core = native.load(native.CORE)
    assert core is not None
    heap = core.ScoreHeap()
    assert heap.push((1.0, 2, "a"))
    assert not heap.push((1.0, "a"))  # another width
    assert not heap.push((math.nan, 3, "b"))
    assert not heap.push((2**53 + 1, 3, "b"))
    assert not heap.push(((1.0, 2.0), 3, "b"))  # a tuple score
    assert not heap.push([1.0, 3, "b"])  # not a tuple
    assert len(heap) == 1
    live, ticks = {"a": heap.items()[0]}, {"a": 2}
    assert heap.pop_live(live, ticks) == (1.0, 2, "a") and live == ticks == {}
    with pytest.raises(IndexError):
        heap.pop_live(live, ticks)


def test_a_heap_policy_goes_on_in_python_when_a_score_is_no_double() -> None:
    """A huge int score (an int lifetime past 2**53 with an int last access): the compiled
    heap hands its items over and the twins keep agreeing."""
    compiled, pure = twins("predictive")
    for policy in (compiled, pure):
        for key in range(6):
            policy.insert(key, EntryMeta(last_access=key, estimated_lifetime=10 - key))
        assert not isinstance(policy._heap, _ListHeap) or policy is pure
        policy.insert(99, EntryMeta(last_access=1, estimated_lifetime=2**60))
        policy.insert(98, EntryMeta(last_access=0, estimated_lifetime=1))
    assert isinstance(compiled._heap, _ListHeap)
    assert compiled.evict(10) == pure.evict(10) == [98, 0, 1, 2, 3, 4, 5, 99]  # ends tie at 10: by tick


@pytest.mark.parametrize("name", ALL)
def test_a_compiled_policy_pickles_and_deep_copies(name: str) -> None:
    """A copy (pickle, deepcopy) evicts as the original: the heap's items keep their identity
    with `_live`."""
    import copy
    import pickle

    policy = create_policy(name, **_params(name))
    keys = [i % 7 for i in range(30)] if name == "belady" else []
    if name == "belady":
        policy.set_future(keys)  # type: ignore[attr-defined]
        for key in keys:
            (policy.access if key in policy else policy.insert)(key)  # type: ignore[operator]
    else:
        for key in range(30):
            policy.insert(key, EntryMeta(cost=float(key % 5), last_access=float(key)))
        for key in range(0, 30, 3):
            policy.access(key, 40.0 + key)
    copies = [copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))]
    want = policy.evict(len(policy))
    for twin in copies:
        assert twin.evict(len(twin)) == want


HEAP_SPECS = [
    "gdsf",
    "slo",
    "slo:priority_base=3.0,eps=0.5,cost_weight=0.01,default_slack=10.0,protect_completion=0.5",
    "predictive",
    "predictive:confidence_threshold=0.99",
    "predictive:token_estimate_confidence=0.5,decode_time_per_token=0.1",
]


@pytest.mark.parametrize("spec", HEAP_SPECS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(st.tuples(metas, st.booleans()), max_size=60))
def test_a_bulk_load_scores_in_c_exactly_as_in_python(
    spec: str, entries: list[tuple[EntryMeta, bool]]
) -> None:
    """The compiled scoring of a hot swap into a heap policy gives the very items (values and
    types: `repr`) the Python `_score` gives, and scores ordinary metas itself."""
    keys = list(range(len(entries)))
    flags = [flag for _, flag in entries]
    built = []
    for pure in (False, True):
        metas_copy = [replace(meta) for meta, _ in entries]
        resolved = resolve_policy(spec)
        with native.pure_python() if pure else contextlib.nullcontext():
            built.append(resolved.cls.from_entry_columns(keys, metas_copy, flags, **resolved.kwargs))
    assert built[0]._compiled and not built[1]._compiled
    assert {k: repr(v) for k, v in built[0]._live.items()} == {k: repr(v) for k, v in built[1]._live.items()}
    assert repr(built[0].entries()) == repr(built[1].entries())


@pytest.mark.parametrize("spec", HEAP_SPECS)
def test_the_core_scores_ordinary_metas_itself(spec: str) -> None:
    from sage_eviction.heap import _compiled_scoring_of

    policy = create_policy(spec)
    scoring = _compiled_scoring_of(policy)  # type: ignore[arg-type]
    assert scoring is not None
    metas = [
        EntryMeta(size=16, cost=float(i), priority=i % 3, last_access=float(i), hits=i % 4, seq_len=i * 7,
                  max_len=512 if i % 2 else 0, estimated_lifetime=None if i % 3 else 2.5,
                  deadline=None if i % 5 else float(i + 30))
        for i in range(50)
    ]  # fmt: skip
    live: dict[Any, Any] = {}
    core = native.load(native.CORE)
    assert core is not None
    assert core.score_into(live, *scoring, list(range(50)), metas, [True] * 50, 1)
    resolved = resolve_policy(spec)
    with native.pure_python():
        pure = resolved.cls.from_entry_columns(list(range(50)), metas, [True] * 50, **resolved.kwargs)
    assert {k: repr(v) for k, v in live.items()} == {k: repr(v) for k, v in pure._live.items()}


# ---- the choice ------------------------------------------------------------------------------


def test_the_choice_is_made_per_object_and_said() -> None:
    assert native.implementation(native.CORE) == "compiled"
    with native.pure_python():
        assert native.implementation(native.CORE).startswith("pure-python")
        assert not create_policy("gdsf")._compiled
    assert create_policy("gdsf")._compiled


def test_without_the_extension_everything_runs_in_python() -> None:
    """A machine where the extension was not built (import of sage_eviction._core fails):
    sage_eviction imports, says why, and the policies work; torch is never imported."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'sage_eviction._core':\n"
        "            raise ImportError('not built')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from sage_eviction import native, create_policy, EvictionCandidate\n"
        "p = create_policy('gdsf')\n"
        "for k in range(5): p.insert(k)\n"
        "c = [EvictionCandidate(i, [i], float(-i), 1, 0, False) for i in range(3)]\n"
        "print(native.implementation(native.CORE), p._compiled, p.evict(2), p.select_victims(c, 2))\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(native.PURE_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "pure-python (sage_eviction._core not built) False [0, 1] [2, 1]",
        "False",
    ]


def test_sage_pure_python_forces_the_reference_in_a_new_process() -> None:
    code = (
        "from sage_eviction import native, create_policy\n"
        "p = create_policy('slo')\n"
        "print(native.implementation(native.CORE), p._compiled, type(p._heap).__name__)\n"
    )
    env = {**os.environ, native.PURE_ENV: "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["pure-python", f"({native.PURE_ENV}=1)", "False", "_ListHeap"]
