"""ARC in the compiled radix loop (the policies' C home, sage_eviction/_kind_arc.pxi) against `ARCPolicy`.

Two levels, both against the Python reference:
- the kind alone: `PolicyProbe` and `ARCPolicy` driven by the same hypothesis-drawn operation
  sequence (inserts evictable or not, hits, evictable flips, evictions; few keys, so evicted
  keys come back as ghost hits; c drawn apart from the pool, so the ghost lists also outgrow
  the directory's 2c, as the Python lists may when the policy holds more than c blocks): every
  victim and the evictable count equal after every operation;
- whole rows (tests/radix_rows.py): the compiled loop's row equals the Python loop's over the
  real `CacheManager`, timings aside, TTFTs bit for bit: hypothesis-drawn `synthetic` workloads
  in small pools with few running slots (so that decode growth preempts), a Mooncake sample,
  and (slow) the whole Mooncake conversation trace at 5 % of its distinct blocks.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_rows import assert_same_rows

from engine_adapter.sim import radix_run
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload
from sage_eviction.compiled_kinds import C_KINDS
from sage_eviction.policies.arc import ARCPolicy

# A missing build skips, which SAGE_REQUIRE_ALL=1 turns into a failure (conftest.py); under
# SAGE_PURE_PYTHON the loop is not loaded and there is nothing compiled to compare.
pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)

KIND, VARIANT = radix_run.policy_kind(ARCPolicy)

Op = tuple[str, int, bool]


def test_arc_runs_as_its_own_kind() -> None:
    """ARCPolicy (its exact class) maps to the arc kind; a subclass keeps the Python loop."""
    arc = next(k.code for k in C_KINDS if k.file == "arc")
    assert arc == KIND and VARIANT == 0
    assert radix_run.policy_kind(type("MyARC", (ARCPolicy,), {})) is None


# ---- the kind alone: PolicyProbe against ARCPolicy ---------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "access", "flip", "evict", "evict"]),
        st.integers(0, 10**6),
        st.booleans(),
    ),
    min_size=20,
    max_size=400,
)


class _Pair:
    """`ARCPolicy` and the arc kind's `PolicyProbe`, told the same operations, each victim held
    equal as it comes, with the evictable count and the size after every operation."""

    def __init__(self, c: int, pool: int, keys: int) -> None:
        self.python = ARCPolicy(capacity=c)
        loop = radix_run.radix_loop()
        assert loop is not None
        self.probe = loop.PolicyProbe(self.python, KIND, VARIANT, pool)
        self.pool, self.keys = pool, keys
        self.held: list[int] = []
        self.victims: list[int | None] = []
        self.p: list[float] = []  # the Python policy's p after each operation

    def insert(self, key: int, evictable: bool) -> None:
        self.python.insert(key, evictable=evictable)
        self.probe.insert(key, evictable)
        self.held.append(key)

    def evict(self) -> int | None:
        expected = self.python.evict(1)
        victim: int | None = self.probe.evict()
        assert victim == (expected[0] if expected else None)
        if victim is not None:
            self.held.remove(victim)
        self.victims.append(victim)
        return victim

    def apply(self, name: str, n: int, flag: bool) -> None:
        """One operation; `n` picks the key modulo the keys it may apply to."""
        held = self.held
        free = [k for k in range(self.keys) if k not in held]
        if name == "insert" and len(held) < self.pool and free:
            self.insert(free[n % len(free)], flag)
        elif name == "access" and held:
            self.python.access(held[n % len(held)], 0.0)
            self.probe.access(held[n % len(held)])
        elif name == "flip" and held:
            self.python.set_evictable(held[n % len(held)], flag)
            self.probe.set_evictable(held[n % len(held)], flag)
        elif name == "evict":
            self.evict()
        self.check()

    def check(self) -> None:
        assert self.probe.num_evictable == self.python.num_evictable
        assert len(self.probe) == len(self.python)
        self.p.append(self.python.p)

    def drain(self) -> None:
        """Everything evictable and evicted (the lists' whole order), then the keys inserted
        again and evicted (where the ghosts and p send them), victims held equal throughout."""
        for key in list(self.held):
            self.python.set_evictable(key, True)
            self.probe.set_evictable(key, True)
        while self.evict() is not None:
            self.check()
        for key in range(min(self.keys, self.pool)):
            self.insert(key, True)
            self.check()
        while self.evict() is not None:
            self.check()


def _run(ops: list[Op], c: int, pool: int, keys: int) -> _Pair:
    pair = _Pair(c, pool, keys)
    for op in ops:
        pair.apply(*op)
    pair.drain()
    return pair


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS,
    c=st.integers(1, 4) | st.integers(1, 24),
    pool=st.none() | st.integers(1, 24),
    keys=st.integers(1, 8) | st.integers(1, 60),
)
def test_the_probe_evicts_as_arcpolicy(ops: list[Op], c: int, pool: int | None, keys: int) -> None:
    """Few keys (ghost hits), c small (p at its bounds), the pool c (the radix loop's) or not."""
    _run(ops, c, c if pool is None else pool, keys)


@pytest.mark.parametrize(
    ("c", "pool", "keys", "clamped"),
    [(40, 48, 160, False), (2, 6, 8, True), (6, 6, 12, True), (5, 3, 9, True)],
)
def test_long_sequences_fill_the_ghosts_and_adapt_p(c: int, pool: int, keys: int, clamped: bool) -> None:
    """Fixed long runs: p moved both ways (and held at 0 and at c where `clamped`), T1 alone full,
    the ghost slots grown past their first 16 (c = 40: up to 80 ghosts), victims equal."""
    rng = random.Random(c * 1000 + pool)
    names = ["insert", "insert", "access", "flip", "evict"]
    ops = [(rng.choice(names), rng.randrange(10**6), rng.random() < 0.8) for _ in range(6000)]
    pair = _run(ops, c, pool, keys)
    assert sum(v is not None for v in pair.victims) > 500
    steps = list(itertools.pairwise(pair.p))
    assert any(b > a for a, b in steps) and any(b < a for a, b in steps)
    if clamped:
        assert {0.0, float(c)} <= set(pair.p)


def test_the_ghosts_outgrow_their_first_slots() -> None:
    """c = 1 with its one T1 block pinned and 40 blocks in T2: each eviction leaves a B2 ghost
    and none is trimmed (no new key comes in), so B2 holds 40 keys, past the 2c + 16 slots the
    kind starts with; then the drain's inserts hit them (p adapting down)."""
    pair = _Pair(1, 64, 41)
    pair.insert(40, False)
    for key in range(40):
        pair.insert(key, True)
        pair.apply("access", pair.held.index(key), False)
    for _ in range(40):
        pair.evict()
    assert pair.python.list_sizes() == (1, 0, 0, 40)
    assert pair.victims == list(range(40))
    pair.drain()


# ---- whole rows: the compiled loop against the Python loop ------------------------------------


@st.composite
def small_rows(draw: Callable[..., Any]) -> tuple[Workload, int, dict[str, Any]]:
    """A small synthetic workload with shared prefixes, in a pool a few blocks over what its
    largest request needs, with few running slots: evictions, ghost hits and preemptions."""
    workload = synthetic(
        requests=draw(st.integers(4, 40)),
        rate=draw(st.sampled_from([5.0, 20.0, 80.0])),
        input_tokens=draw(st.sampled_from([48.0, 128.0, 256.0])),
        turn_tokens=32.0,
        output_tokens=draw(st.sampled_from([8.0, 32.0, 96.0])),
        max_input_tokens=512,
        seed=draw(st.integers(0, 10**6)),
        sessions=draw(st.integers(1, 8)),
        turns=draw(st.sampled_from([1.0, 3.0, 6.0])),
        system_prompt_tokens=32,
    )
    capacity = min_capacity(workload) + draw(st.integers(0, 12))
    options = {
        "max_running": draw(st.sampled_from([1, 2, 3, 4, 8])),
        "max_prefill_tokens": draw(st.sampled_from([64, 256, 16384])),
    }
    return workload, capacity, options


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=small_rows())
def test_small_rows_agree(drawn: tuple[Workload, int, dict[str, Any]]) -> None:
    workload, capacity, options = drawn
    assert_same_rows(workload, "arc", capacity, **options)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_pools_preempt_and_agree(seed: int) -> None:
    """Rows of the drawn kind that do preempt (the hypothesis test draws such rows too; these
    make sure the preemption path is in every run), with evictions and ghost hits."""
    workload = synthetic(
        requests=40, rate=80.0, input_tokens=128.0, turn_tokens=32.0, output_tokens=96.0,
        max_input_tokens=512, seed=seed, sessions=4, turns=6.0, system_prompt_tokens=32,
    )  # fmt: skip
    row = assert_same_rows(workload, "arc", min_capacity(workload) + 4, max_running=4)
    assert row["preemptions"] > 0 and row["evictions"] > 0
