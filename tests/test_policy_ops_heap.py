"""The score-heap policies' C operations (sage_eviction/_core_ops_heap.pxi) on the paths the generic
sequences of tests/test_policy_ops.py do not reach, and `share_ops`.

The generic test drives gdsf, slo, predictive and belady with random calls; but a Belady without
its future only raises, the compiled heap never falls back to the `_ListHeap` there, and 80 calls
never reach the heap's rebuild threshold. Here: Belady's calls follow a hypothesis-drawn future
(strict and lenient: skips, divergence, the end of the future), every heap policy runs on a
`_ListHeap` (the fallback heap.py switches to) and through a natural fallback, the rebuild, and
the simulator's `RadixBelady` (engine_adapter/sim/cache_models.py) driven as its radix model
drives it, through the table `share_ops` gives it. Each compares a policy driven through its C
table with its twin driven through the Python methods, outcome and state after every step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Hashable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policy_ops import META, OPERATIONS, _apply, _core, build, policy_state

from engine_adapter.sim.cache_models import RadixBelady
from engine_adapter.sim.workloads import SimRequest
from sage_eviction import EntryMeta, get_policy_class
from sage_eviction.heap import _ListHeap

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

HEAP_POLICIES = ("gdsf", "slo", "predictive", "belady")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _twins(name: str, *, list_heap: bool = False) -> tuple[Any, Any, Any]:
    """A policy with its C caller and its Python twin; on `_ListHeap`s when `list_heap`."""
    compiled, reference = build(name), build(name)
    if list_heap:
        compiled._heap, reference._heap = _ListHeap(), _ListHeap()
    return compiled, _core().PolicyOpsCaller(compiled), reference


def _step(compiled: Any, caller: Any, reference: Any, op: tuple[Any, ...]) -> None:
    assert _apply(compiled, caller, op) == _apply(reference, reference, op), op
    assert policy_state(compiled) == policy_state(reference), op


# ---- Belady along its future -------------------------------------------------------------------

KEYS = st.integers(0, 4)
NEXT = st.tuples(st.just("next"), META, st.booleans())  # the next lookup: a miss or a hit
BELADY_STEPS = st.lists(
    st.one_of(
        *[NEXT] * 4,  # as likely as the others together: most calls follow the future
        st.tuples(st.just("ahead"), st.integers(1, 4), META, st.booleans()),  # skip (or diverge)
        st.tuples(st.just("set_evictable"), KEYS, st.booleans()),
        st.tuples(st.just("evict"), st.integers(1, 3)),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("access"), KEYS, st.floats(0, 1e6)),  # any key: unknown, or off the future
    ),
    max_size=80,
)


def _lookup(policy: Any, future: list[int], ahead: int, meta: EntryMeta, evictable: bool) -> tuple[Any, ...]:
    """The call for the lookup `ahead` positions on (a key not in the future past its end)."""
    pos = policy.position + ahead
    key = future[pos] if pos < len(future) else 99
    if key in policy:
        return ("access", key, float(pos))
    return ("insert", key, meta, evictable)


def _drive_belady(future: list[int], strict: bool, steps: list[tuple[Any, ...]], list_heap: bool) -> None:
    compiled, caller, reference = _twins("belady", list_heap=list_heap)
    for policy in (compiled, reference):
        policy.set_future(future, strict=strict)
    for step in steps:
        if step[0] == "next":
            step = _lookup(reference, future, 0, step[1], step[2])
        elif step[0] == "ahead":
            step = _lookup(reference, future, step[1], step[2], step[3])
        _step(compiled, caller, reference, step)
    assert compiled.entries() == reference.entries()


@SETTINGS
@given(future=st.lists(KEYS, min_size=1, max_size=50), strict=st.booleans(), steps=BELADY_STEPS)
def test_belady_along_its_future(future: list[int], strict: bool, steps: list[tuple[Any, ...]]) -> None:
    _drive_belady(future, strict, steps, list_heap=False)


@SETTINGS
@given(future=st.lists(KEYS, min_size=1, max_size=50), strict=st.booleans(), steps=BELADY_STEPS)
def test_belady_on_the_fallback_heap(future: list[int], strict: bool, steps: list[tuple[Any, ...]]) -> None:
    _drive_belady(future, strict, steps, list_heap=True)


def test_belady_without_a_future_and_past_its_end() -> None:
    compiled, caller, reference = _twins("belady")
    _step(compiled, caller, reference, ("insert", 1, EntryMeta(), True))  # no future yet
    for policy in (compiled, reference):
        policy.set_future([1, 1])
    for op in [("insert", 1, EntryMeta(), True), ("access", 1, 2.0), ("access", 1, 3.0)]:
        _step(compiled, caller, reference, op)
    assert compiled.position == 2


def test_a_lenient_skip_gives_held_entries_their_following_use() -> None:
    # 1's next use (position 2) is skipped by the call for 3: `_refresh` moves it to position 4
    compiled, caller, reference = _twins("belady")
    for policy in (compiled, reference):
        policy.set_future([1, 2, 1, 3, 1], strict=False)
    for op in [("insert", 1, EntryMeta(), True), ("insert", 3, EntryMeta(), True), ("access", 1, 1.0)]:
        _step(compiled, caller, reference, op)
    assert compiled.next_use(1) is None and compiled.position == 5


# ---- the other heap policies on the fallback heap ----------------------------------------------


@pytest.mark.parametrize("name", ["gdsf", "slo", "predictive"])
@SETTINGS
@given(operations=OPERATIONS)
def test_heap_policies_on_the_fallback_heap(name: str, operations: list[tuple[Any, ...]]) -> None:
    compiled, caller, reference = _twins(name, list_heap=True)
    for op in operations:
        _step(compiled, caller, reference, op)
    assert compiled.peek(len(compiled)) == reference.peek(len(reference))


def test_the_compiled_heap_falls_back_as_in_python() -> None:
    # Fractions are not doubles: the first push hands the ScoreHeap's items to a _ListHeap
    compiled, caller, reference = _twins("gdsf")
    for policy in (compiled, reference):
        policy.inflation = Fraction(0)
    ops: list[tuple[Any, ...]] = [("insert", k, EntryMeta(cost=Fraction(k + 1, 3)), True) for k in range(6)]
    ops += [("access", 2, 1.0), ("evict", 2), ("set_evictable", 4, False), ("evict", 3)]
    for op in ops:
        _step(compiled, caller, reference, op)
    assert type(compiled._heap) is _ListHeap
    assert isinstance(compiled.inflation, Fraction) and compiled.inflation > 0


@pytest.mark.parametrize("name", HEAP_POLICIES)
def test_the_heap_is_rebuilt_when_stale_items_pile_up(name: str) -> None:
    compiled, caller, reference = _twins(name)
    if name == "belady":
        for policy in (compiled, reference):
            policy.set_future([0, 1] + [0] * 200)
    ops: list[tuple[Any, ...]] = [("insert", 0, EntryMeta(), True), ("insert", 1, EntryMeta(), True)]
    ops += [("access", 0, float(t)) for t in range(200)]  # each pushes an item, staling the last
    for op in ops:
        _step(compiled, caller, reference, op)
    assert len(compiled._heap) < 2 * 2 + 64 + 1  # rebuilt on the way (it would hold 202)
    _step(compiled, caller, reference, ("evict", 2))


# ---- RadixBelady, as the simulator drives it ----------------------------------------------------

REQUESTS = st.lists(
    st.tuples(st.lists(st.integers(0, 9), min_size=1, max_size=5), st.integers(0, 3)),
    min_size=1,
    max_size=25,
)


def _serve_request(policy: Any, through: Any, keys: tuple[int, ...], end: int, outside: int) -> list[Any]:
    """One request as the radix model serves it: `serve`, then each block a hit (locked) or a miss
    inserted locked after evicting to make room (capacity 6), then all released; `outside`: one
    more call for a key from outside the request (the fallback index)."""
    policy.serve(keys, end)  # no C twin: the simulator calls it on the policy
    outcomes: list[Any] = []
    calls = list(dict.fromkeys(keys)) + ([100 + outside] if outside else [])
    for key in calls:
        if key in policy:
            outcomes += [through.access(key, float(end)), through.set_evictable(key, False)]
            continue
        while len(policy) >= 6 and policy.num_evictable:
            outcomes.append(through.evict(1))
        outcomes.append(through.insert(key, EntryMeta(size=1, cost=float(key)), evictable=False))
    outcomes += [through.set_evictable(key, True) for key in calls]
    return outcomes


@SETTINGS
@given(requests=REQUESTS)
def test_radix_belady_through_its_table_is_its_python_methods(requests: list[tuple[list[int], int]]) -> None:
    sims = [SimRequest(i, float(i), tuple(keys), 16 * len(keys), 1) for i, (keys, _) in enumerate(requests)]
    compiled, reference = RadixBelady(sims), RadixBelady(sims)
    caller = _core().PolicyOpsCaller(compiled)
    end = 0
    for sim, (_, outside) in zip(sims, requests, strict=True):
        end += len(sim.block_hashes)
        got = _serve_request(compiled, caller, sim.block_hashes, end, outside)
        want = _serve_request(reference, reference, sim.block_hashes, end, outside)
        assert got == want
        assert policy_state(compiled) == policy_state(reference)
    assert compiled.entries() == reference.entries()


# ---- share_ops ----------------------------------------------------------------------------------


def test_radix_belady_has_the_table_and_its_subclasses_do_not() -> None:
    core = _core()

    class Indexed(RadixBelady):  # as tests/test_sim_trace_memory.py's: the exact class only
        pass

    requests = [SimRequest(0, 0.0, (1, 2), 32, 1)]
    assert core.has_compiled_ops(RadixBelady(requests))
    assert not core.has_compiled_ops(Indexed(requests))
    core.share_ops(RadixBelady, get_policy_class("belady"))  # again: nothing changes


def test_share_ops_refuses_what_the_c_code_would_bypass() -> None:
    core = _core()
    gdsf, belady = get_policy_class("gdsf"), get_policy_class("belady")

    class Hooked(gdsf):  # type: ignore[misc, valid-type]
        def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
            super()._on_insert(key, meta, evictable)

    class Victim(gdsf):  # type: ignore[misc, valid-type]
        def _on_victim(self, key: Hashable, item: tuple[Any, ...]) -> None:
            pass

    class Counting(RadixBelady):
        def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = True) -> None:
            self._incoming = self._next(key) + 1
            super().insert(key, meta, evictable=evictable)

    with pytest.raises(TypeError, match="overrides _on_insert, which the compiled operations of GDSFPolicy"):
        core.share_ops(Hooked, gdsf)
    with pytest.raises(TypeError, match="overrides _on_victim"):
        core.share_ops(Victim, gdsf)
    with pytest.raises(TypeError, match="its insert is not"):
        core.share_ops(Counting, belady)
    with pytest.raises(TypeError, match="not a subclass of GDSFPolicy"):
        core.share_ops(belady, gdsf)
    with pytest.raises(TypeError, match="no compiled operations to share"):
        core.share_ops(Hooked, get_policy_class("lru"))  # a table, but no list of what it mirrors
    assert not core.has_compiled_ops(Hooked())


REBOUND = """
from sage_eviction.policies.belady import BeladyPolicy as HeapPolicy
from engine_adapter.sim.cache_models import RadixBelady

class Rebound(RadixBelady):
    def insert(self, key, meta=None, *, evictable=True):
        self._incoming = self._next(key)
        HeapPolicy.insert(self, key, meta, evictable=evictable)
"""


def test_share_ops_refuses_the_form_over_another_heap_policy(tmp_path: Path) -> None:
    # the statements of the form, but its `HeapPolicy` is Belady's insert (which consumes the future)
    path = tmp_path / "rebound.py"
    path.write_text(REBOUND)
    spec = importlib.util.spec_from_file_location("rebound", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(TypeError, match=r"HeapPolicy in its insert is not sage_eviction\.heap\.HeapPolicy"):
        _core().share_ops(module.Rebound, get_policy_class("belady"))


def test_a_subclass_that_only_rescores_shares_the_table() -> None:
    gdsf = get_policy_class("gdsf")

    class Halved(gdsf):  # type: ignore[misc, valid-type]
        name = "halved-gdsf"

        def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
            h, tick = super()._score(key, meta)
            return (h / 2, tick)

    _core().share_ops(Halved, gdsf)
    compiled, reference = Halved(), Halved()
    caller = _core().PolicyOpsCaller(compiled)
    ops: list[tuple[Any, ...]] = [("insert", k, EntryMeta(cost=float(k % 3 + 1)), True) for k in range(8)]
    ops += [("access", 1, 1.0), ("evict", 3), ("insert", 0, EntryMeta(cost=9.0), True), ("evict", 2)]
    for op in ops:
        _step(compiled, caller, reference, op)
    assert compiled.inflation == reference.inflation > 0


def test_a_victim_hook_the_c_code_calls_through_python_is_called() -> None:
    slo = get_policy_class("slo")

    class Recording(slo):  # type: ignore[misc, valid-type]
        name = "recording-slo"

        def __init__(self) -> None:
            super().__init__()
            self.victims: list[tuple[Any, ...]] = []

        def _on_victim(self, key: Hashable, item: tuple[Any, ...]) -> None:
            self.victims.append(item)

    _core().share_ops(Recording, slo)
    compiled, reference = Recording(), Recording()
    caller = _core().PolicyOpsCaller(compiled)
    ops: list[tuple[Any, ...]] = [("insert", k, EntryMeta(priority=k % 3), True) for k in range(5)]
    for op in [*ops, ("evict", 2), ("access", 4, 5.0), ("evict", 3)]:
        _step(compiled, caller, reference, op)
    assert len(compiled.victims) == 5
