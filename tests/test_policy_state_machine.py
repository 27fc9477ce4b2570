"""Random operation sequences against every registered online policy (hypothesis stateful).

One state machine per policy drives insert / access / set_evictable / remove / evict over a
small key space, so that evicted keys come back (ghost lists); its insert is a cache's miss:
sometimes `prepare_insert(key)` first (an optional hook; ARC and S3-FIFO adapt in it), and
one eviction first when the cache is full. After every step it checks the generic
invariants (size, evictable count, membership and flags against a shadow dict); where
`REFERENCE_MODELS` has a model of the policy, every victim must be exactly the model's, and
a replica drained to the end must give the model's whole order (and, for order-preserving
policies, the order of a policy rebuilt by `from_entries`). The number of examples per policy
comes from the hypothesis profile (`ci`: 100, see conftest.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import pytest
from conftest import ONLINE_POLICIES, build_policy, policy_capacity
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from reference_models import REFERENCE_MODELS

from sage_eviction import (
    DuplicateKeyError,
    EntryMeta,
    EvictionPolicy,
    UnknownKeyError,
    get_policy_class,
    policy_params,
)

CACHE_BLOCKS = 8  # the machine's cache size; also the capacity of policies that need one
KEYS = st.integers(0, 3 * CACHE_BLOCKS - 1)
STEPS = 40

# Values drawn from small sets, so that ties between scores are common.
_metas = st.fixed_dictionaries(
    {
        "size": st.integers(1, 4),
        "cost": st.sampled_from([0.5, 1.0, 2.0, 4.0]),
        "priority": st.integers(0, 2),
        "tenant": st.sampled_from([None, "a", "b"]),
        "hits": st.sampled_from([0, 0, 0, 1, 3]),
        "estimated_lifetime": st.one_of(st.none(), st.sampled_from([0.5, 2.0, 5.0, 20.0])),
        "seq_len": st.integers(0, 40),
        "max_len": st.sampled_from([0, 10, 20, 40]),
        "slack": st.one_of(st.none(), st.sampled_from([-3.0, 0.0, 1.0, 10.0, 100.0])),
    }
)


def _default_params(name: str) -> dict[str, Any]:
    """The policy's constructor defaults, less capacity, for its reference model."""
    return {p: spec.default for p, spec in policy_params(get_policy_class(name)).items() if p != "capacity"}


def machine_for(name: str) -> type[RuleBasedStateMachine]:
    """A state machine class that checks policy `name`."""
    capacity = policy_capacity(name, CACHE_BLOCKS)
    model_cls = REFERENCE_MODELS.get(name)

    def new_pair() -> tuple[EvictionPolicy, Any]:
        model = model_cls(capacity, **_default_params(name)) if model_cls else None
        return build_policy(name, CACHE_BLOCKS), model

    def model_evict(model: Any, n: int) -> list[Hashable]:
        victims: list[Hashable] = []
        while len(victims) < n and (victim := model.evict_one()) is not None:
            victims.append(victim)
        return victims

    def model_call(model: Any, op: str, key: Hashable, *args: Any) -> None:
        """`op` on the model; `prepare_insert` is optional there as in the policy (a no-op)."""
        if model is not None and (op != "prepare_insert" or hasattr(model, op)):
            getattr(model, op)(key, *args)

    class PolicyMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.policy, self.model = new_pair()
            self.held: dict[Hashable, bool] = {}  # key -> evictable
            self.now = 1000.0
            self.log: list[tuple[Any, ...]] = []  # what was done to both, to build replicas

        def _tick(self) -> float:
            self.now += 0.25
            return self.now

        def _replica(self) -> tuple[EvictionPolicy, Any]:
            """A new policy and model put through the same calls: a copy of the state that does
            not rely on `copy.deepcopy` understanding their internals."""
            policy, model = new_pair()
            for op, key, *args in self.log:
                if op == "insert":
                    policy.insert(key, replace(args[0]), evictable=args[1])
                    if model is not None:
                        model.insert(key, replace(args[0]), args[1])
                elif op == "evict":
                    policy.evict(key)
                    if model is not None:
                        model_evict(model, key)
                else:
                    getattr(policy, op)(key, *args)
                    model_call(model, op, key, *args)
            return policy, model

        def _evict(self, n: int) -> list[Hashable]:
            victims = self.policy.evict(n)
            self.log.append(("evict", n))
            assert len(victims) <= n
            assert len(set(victims)) == len(victims)
            evictable_before = sum(self.held.values())
            for key in victims:
                assert self.held.pop(key) is True, f"{name} evicted {key!r}, which was not evictable"
            assert len(victims) == min(n, evictable_before)
            if self.model is not None:
                expected = model_evict(self.model, n)
                assert victims == expected, f"{name} evicted {victims}, the reference model {expected}"
            return victims

        @rule(key=KEYS, raw=_metas, evictable=st.booleans(), announce=st.booleans())
        def insert(self, key: int, raw: dict[str, Any], evictable: bool, announce: bool) -> None:
            """A miss: when the cache is full, evict one block first, as the cache does; with
            `announce`, tell a policy that has the optional `prepare_insert` hook (ARC, S3-FIFO)
            which key is coming before that, as `sage_eviction.flat` does."""
            now = self._tick()
            raw = dict(raw)
            slack = raw.pop("slack")
            meta = EntryMeta(
                **raw, created_at=now, last_access=now, deadline=None if slack is None else now + slack
            )
            if key in self.held:
                with pytest.raises(DuplicateKeyError):
                    self.policy.insert(key, meta, evictable=evictable)
                return
            if announce:
                self.log.append(("prepare_insert", key))
                self.policy.prepare_insert(key)
                model_call(self.model, "prepare_insert", key)
            if len(self.held) >= CACHE_BLOCKS and not self._evict(1):
                return  # full of blocks in use: the request would wait
            self.log.append(("insert", key, replace(meta), evictable))
            self.policy.insert(key, meta, evictable=evictable)
            if self.model is not None:
                self.model.insert(key, meta, evictable)
            self.held[key] = evictable

        def _call(self, op: str, key: int, *args: Any) -> None:
            """`op` on both, or on the policy alone with UnknownKeyError for a key not held."""
            if key not in self.held:
                with pytest.raises(UnknownKeyError):
                    getattr(self.policy, op)(key, *args)
                return
            self.log.append((op, key, *args))
            getattr(self.policy, op)(key, *args)
            model_call(self.model, op, key, *args)

        @rule(key=KEYS)
        def access(self, key: int) -> None:
            self._call("access", key, self._tick())

        @rule(key=KEYS, evictable=st.booleans())
        def set_evictable(self, key: int, evictable: bool) -> None:
            self._call("set_evictable", key, evictable)
            if key in self.held:
                self.held[key] = evictable

        @rule(key=KEYS)
        def remove(self, key: int) -> None:
            self._call("remove", key)
            self.held.pop(key, None)

        @rule(n=st.integers(0, 3))
        def evict(self, n: int) -> None:
            self._evict(n)

        @rule()
        def full_order_matches(self) -> None:
            """Drain a replica of the policy and of the model: the whole order must agree, and
            a policy rebuilt from `entries()` must drain the same when it is order-preserving."""
            policy, model = self._replica()
            assert policy.entries() == self.policy.entries(), "the replica differs"
            order = policy.evict(len(self.held) + 1)
            assert sorted(order, key=repr) == sorted((k for k, ev in self.held.items() if ev), key=repr)
            if model is not None:
                expected = model_evict(model, len(self.held) + 1)
                assert order == expected, f"{name} would evict {order}, the reference model {expected}"
            if get_policy_class(name).order_preserving:
                params = {} if capacity is None else {"capacity": capacity}
                rebuilt = type(self.policy).from_entries(self.policy.entries(), **params)
                assert rebuilt.evict(len(self.held) + 1) == order, "from_entries changed the order"

        @invariant()
        def sizes_and_flags_agree(self) -> None:
            policy = self.policy
            assert len(policy) == len(self.held)
            assert policy.num_evictable == sum(self.held.values())
            for key in range(3 * CACHE_BLOCKS):
                held = key in self.held
                assert (key in policy) is held
                assert policy.is_evictable(key) is (held and self.held[key])

    PolicyMachine.__name__ = PolicyMachine.__qualname__ = f"{name.title()}Machine"
    return PolicyMachine


@pytest.mark.slow
@pytest.mark.parametrize("name", ONLINE_POLICIES)
def test_policy_state_machine(name: str) -> None:
    run_state_machine_as_test(machine_for(name), settings=settings(stateful_step_count=STEPS))


def test_models_exist_for_the_policies_with_a_definition_simple_enough() -> None:
    """The reference models cover at least the policies ordered by a simple key."""
    simple = {"lru", "mru", "fifo", "filo", "lfu", "priority", "gdsf", "predictive", "slo"}
    missing = sorted((simple & set(ONLINE_POLICIES)) - set(REFERENCE_MODELS))
    assert not missing
