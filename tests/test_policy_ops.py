"""The built-in policies' C operations (sage_eviction/_core_ops*.pxi) against their Python methods.

The compiled radix core calls a built-in policy through its table of C functions (`PolicyOps`:
insert, access, set_evictable, evict one) instead of its Python methods. Both run over the same
state, so the proof is direct: two instances of the class, one driven through the C table
(`PolicyOpsCaller`), its twin through the Python methods, by the same hypothesis-drawn operation
sequences (valid and invalid: a duplicate insert, an unknown key), must return the same victims,
raise the same errors and hold the same state, attribute for attribute (dict and queue orders
included), after every operation. `remove` and `prepare_insert`, which have no C twin, run on
both through Python, interleaved with the rest.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
from conftest import CAPACITY, COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_eviction import EntryMeta, EvictionPolicy, create_policy, get_policy_class, native
from sage_eviction.errors import SageEvictionError

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

# The policies issue 34 asks for in C (at least), and those that come with them for free.
REQUIRED = ("lru", "fifo", "lfu", "sieve", "s3fifo", "arc", "slru", "mq", "gdsf", "priority", "belady")


def _core() -> Any:
    core = native.load(native.CORE)
    assert core is not None
    return core


def _compiled_names() -> list[str]:
    return list(_core().compiled_policies()) if compiled_core_built() else []


def build(name: str) -> EvictionPolicy:
    params = {"capacity": CAPACITY} if get_policy_class(name).needs_capacity else {}
    return create_policy(name, **params)


def state(value: Any, depth: int = 0, seen: dict[int, int] | None = None) -> Any:
    """A comparable picture of `value`: containers by content and order, objects by their
    attributes (slots and __dict__), anything compiled by its pickled state. An object met
    again (a linked node's neighbour, a queue held in two dicts) is pictured by the number of
    its first picture, so cycles end and both sides must share the same objects."""
    assert depth < 64, "state() recursed too deep"
    seen = {} if seen is None else seen
    if isinstance(value, (int, float, str, bytes, bool, type(None))):
        return value
    if isinstance(value, (OrderedDict, dict)):
        pairs = [(state(k, depth + 1, seen), state(v, depth + 1, seen)) for k, v in value.items()]
        return (type(value).__name__, pairs)
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, sorted(map(repr, value)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [state(v, depth + 1, seen) for v in value])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, state(dataclasses.asdict(value), depth + 1, seen))
    if id(value) in seen:
        return ("seen", seen[id(value)])
    seen[id(value)] = len(seen)
    fields: dict[str, Any] = {}
    for klass in type(value).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if hasattr(value, slot):
                fields[slot] = getattr(value, slot)
    fields.update(getattr(value, "__dict__", {}))
    if not fields and hasattr(value, "__reduce_ex__"):
        reduced = value.__reduce_ex__(2)
        return (type(value).__name__, state(reduced[2] if len(reduced) > 2 else reduced[1], depth + 1, seen))
    return (type(value).__name__, state(fields, depth + 1, seen))


def policy_state(policy: EvictionPolicy) -> Any:
    picture = dict(vars(policy))
    picture.pop("_select_latency", None)  # wall-clock samples of select_victims (none here)
    return state(picture)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except SageEvictionError as exc:
        return (type(exc).__name__, str(exc))


KEYS = st.integers(min_value=0, max_value=9)
META = st.builds(
    EntryMeta,
    size=st.sampled_from([1, 2, 4]),
    cost=st.sampled_from([1.0, 3.0, 16.0]),
    priority=st.integers(0, 3),
    tenant=st.sampled_from([None, "a", "b"]),
    depth=st.integers(0, 5),
)
# Many inserts and hits on few keys, and most calls on a key the policy holds (a sequence of
# misses on unknown keys would prove little): a key is drawn as ("held", i), the i-th key held
# (resolved when the call is made: both twins hold the same keys), or ("any", k), any key.
_KINDS = (
    ["insert"] * 4 + ["access"] * 5 + ["set_evictable"] * 4 + ["evict"] * 2 + ["remove", "prepare_insert"]
)
_TARGET = st.one_of(st.tuples(st.just("held"), st.integers(0, 63)), st.tuples(st.just("any"), KEYS))


@st.composite
def _operation(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(_KINDS))
    if kind == "insert":
        return (kind, ("any", draw(KEYS)), draw(META), draw(st.booleans()))
    if kind == "access":
        return (kind, draw(_TARGET), draw(st.floats(0, 1e6, allow_nan=False)))
    if kind == "set_evictable":
        return (kind, draw(_TARGET), draw(st.booleans()))
    if kind == "evict":
        return (kind, draw(st.integers(1, 3)))
    return (kind, draw(_TARGET))


OPERATIONS = st.lists(_operation(), min_size=4, max_size=80)


def _key(policy: EvictionPolicy, target: tuple[str, int] | int) -> int:
    """The key of a drawn target; a plain key (other tests' hand-written calls) is itself."""
    if not isinstance(target, tuple):
        return target
    where, value = target
    held = list(policy._meta)
    return held[value % len(held)] if where == "held" and held else value


def _apply(policy: EvictionPolicy, through: Any, op: tuple[Any, ...]) -> Any:
    kind = op[0]
    if kind == "evict":
        return _outcome(lambda: through.evict(op[1]))
    key = _key(policy, op[1])
    if kind == "insert":
        return _outcome(lambda: through.insert(key, dataclasses.replace(op[2]), evictable=op[3]))
    if kind == "access":
        return _outcome(lambda: through.access(key, op[2]))
    if kind == "set_evictable":
        return _outcome(lambda: through.set_evictable(key, op[2]))
    if kind == "remove":
        return _outcome(lambda: policy.remove(key))
    return _outcome(lambda: policy.prepare_insert(key))


def test_the_issues_policies_have_compiled_operations() -> None:
    assert set(REQUIRED) <= set(_compiled_names())


@pytest.mark.parametrize("name", _compiled_names() or ["lru"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_c_operations_are_the_python_methods(name: str, operations: list[tuple[Any, ...]]) -> None:
    compiled, reference = build(name), build(name)
    caller = _core().PolicyOpsCaller(compiled)
    for step, op in enumerate(operations):
        assert _apply(compiled, caller, op) == _apply(reference, reference, op), (step, op)
        assert policy_state(compiled) == policy_state(reference), (step, op)
    # what the rest of the class reads from that state
    assert compiled.entries() == reference.entries()
    assert compiled.peek(len(compiled)) == reference.peek(len(reference))


def test_a_subclass_or_a_pure_policy_keeps_the_python_path() -> None:
    core = _core()
    lru = get_policy_class("lru")

    class Mine(lru):  # type: ignore[misc, valid-type]
        name = "mine"

    assert core.has_compiled_ops(build("lru"))
    assert not core.has_compiled_ops(Mine())
    with native.pure_python():
        pure = build("lru")
    assert not core.has_compiled_ops(pure)
    with pytest.raises(TypeError, match="has no compiled operations"):
        core.PolicyOpsCaller(Mine())
