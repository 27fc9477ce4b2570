"""S3-FIFO in the compiled radix loop (sage_eviction/_kind_s3fifo.pxi) against its
reference, `S3FIFOPolicy` (sage_eviction/policies/s3fifo.py).

Two levels. The kind alone: `PolicyProbe` and the Python policy get the same operations as the
radix cache makes them (inserts evictable or not, hits, evictable flips, evictions; keys over the
whole int64 range, INT64_MIN included, which the core's table keeps aside), with the policy's
parameters drawn too, and must give every victim and the evictable count alike: pinned entries
counted in their queue, hit, flipped back to their queue's head, ghosts filled and dropped. Short
drawn sequences (which shrink to a readable case), long ones from a drawn seed (which hypothesis
would draw slowly), and two worked cases with their victims written out.
Whole rows: `assert_same_rows` (tests/radix_rows.py) runs hypothesis-drawn synthetic workloads at
small capacities and running limits (where sequences are preempted) and the shipped Mooncake
conversation trace at 5 % of its distinct blocks, compiled and in the Python loop.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from radix_rows import assert_same_rows

from engine_adapter.sim import radix_run
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload
from sage_eviction.policies.s3fifo import S3FIFOPolicy

# A missing build skips, which SAGE_REQUIRE_ALL=1 turns into a failure (conftest.py).
pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)

KIND, VARIANT = radix_run.policy_kind(S3FIFOPolicy)
INT64 = st.one_of(  # the ends, which the core's table treats apart (INT64_MIN marks its free slots)
    st.sampled_from([-(2**63), 2**63 - 1, -1, 0]), st.integers(min_value=-(2**63), max_value=2**63 - 1)
)
PARAMS = st.fixed_dictionaries(
    {
        "small_ratio": st.sampled_from([0.05, 0.1, 0.25, 0.3, 0.5, 0.9]),
        "ghost_ratio": st.sampled_from([0.0, 0.3, 0.9, 2.0]),
        "move_threshold": st.integers(min_value=1, max_value=4),
    }
)
# (what, which key of the pool or of the held ones, a flag): insert (evictable or not), a hit,
# a hit while pinned, an evictable flip, an eviction
OP = st.tuples(
    st.sampled_from("iiiaahfe"),
    st.integers(min_value=0, max_value=3) | st.integers(min_value=0, max_value=10**6),  # some keys hit often
    st.booleans(),
)


class Pair:
    """The Python policy and the probe, driven alike: every victim and count compared."""

    def __init__(self, capacity: int, params: dict[str, Any]) -> None:
        self.capacity = capacity
        self.reference = S3FIFOPolicy(capacity, **params)
        self.probe = radix_run.radix_loop().PolicyProbe(  # type: ignore[union-attr]
            S3FIFOPolicy(capacity, **params), KIND, VARIANT, capacity
        )
        self.held: list[int] = []  # in insertion order: the ops pick by index
        self.victims: list[int | None] = []

    def evict(self) -> None:
        expected = self.reference.evict(1)
        victim = self.probe.evict()
        assert victim == (expected[0] if expected else None)
        self.victims.append(victim)
        if victim is not None:
            self.held.remove(victim)

    def insert(self, key: int, evictable: bool) -> None:
        if key in self.held:
            return
        if len(self.held) == self.capacity:  # room first, as the cache makes it
            self.evict()
            if len(self.held) == self.capacity:
                return  # nothing evictable
        self.reference.insert(key, evictable=evictable)
        self.probe.insert(key, evictable)
        self.held.append(key)

    def apply(self, op: str, index: int, flag: bool, pool: list[int]) -> None:
        if op == "i":
            self.insert(pool[index % len(pool)], flag)
        elif op == "e":
            self.evict()
        elif self.held:
            key = self.held[index % len(self.held)]
            if op == "a":
                self.reference.access(key, 0.0)
                self.probe.access(key)
            elif op == "h":  # a hit on a block in use: pinned while hit, as the radix cache does
                self.reference.set_evictable(key, False)
                self.probe.set_evictable(key, False)
                self.reference.access(key, 0.0)
                self.probe.access(key)
            else:
                self.reference.set_evictable(key, flag)
                self.probe.set_evictable(key, flag)
        assert self.probe.num_evictable == self.reference.num_evictable
        assert len(self.probe) == len(self.held)


def _drain(pair: Pair) -> None:
    """Everything made evictable and evicted: the rest of the order, then None from both."""
    for key in list(pair.held):
        pair.reference.set_evictable(key, True)
        pair.probe.set_evictable(key, True)
    while pair.held:
        pair.evict()
    pair.evict()
    assert pair.victims[-1] is None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(min_value=1, max_value=16),
    params=PARAMS,
    pool=st.lists(INT64, min_size=1, max_size=40, unique=True),
    ops=st.lists(OP, max_size=80),
)
def test_the_probe_evicts_as_the_python_policy(
    capacity: int, params: dict[str, Any], pool: list[int], ops: list[tuple[str, int, bool]]
) -> None:
    """Short drawn sequences (they shrink to a readable case): every victim and evictable count
    alike, then the drained order."""
    pair = Pair(capacity, params)
    for op, index, flag in ops:
        pair.apply(op, index, flag, pool)
    _drain(pair)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(min_value=1, max_value=24),
    params=PARAMS,
    seed=st.integers(min_value=0, max_value=2**32),
    length=st.integers(min_value=200, max_value=800),
    mix=st.sampled_from(["iiiaahfe", "iiaaaaae", "iiiiffhe", "iaaaaffe"]),
    base=st.sampled_from([0, -(2**63), 2**63 - 100]),
)
def test_long_sequences_evict_as_the_python_policy(
    capacity: int, params: dict[str, Any], seed: int, length: int, mix: str, base: int
) -> None:
    """Long sequences from a drawn seed and mix of operations (hypothesis draws long lists
    slowly): the queues fill, moves to M and M's second chances recur, the ghosts wrap."""
    rng = random.Random(seed)
    pool = [base + k for k in range(3 * capacity + 2)]
    pair = Pair(capacity, params)
    for _ in range(length):
        index = rng.randrange(4) if rng.random() < 0.3 else rng.randrange(10**6)
        pair.apply(rng.choice(mix), index, rng.random() < 0.7, pool)
    _drain(pair)


def test_pinned_entries_keep_their_queue_size_and_frequency() -> None:
    """A worked case: pinned blocks count in S and M and their hits count, and when they come
    back they stand at their queue's head. Golden victims, and the Python policy's the same."""
    pair = Pair(10, {"small_ratio": 0.3, "ghost_ratio": 0.5, "move_threshold": 2})
    for key in range(10):  # 0, 1, 2 fill S (3 blocks); 3..9 go to M (the warm-up rule)
        pair.insert(key, key not in (0, 4))  # 0 pinned in S, 4 pinned in M: both counted
    for key in (0, 0, 1, 1, 4, 4, 4):  # hits count on pinned blocks too
        pair.apply("a", pair.held.index(key), False, [])
    pair.evict()  # M holds 7, its share: S's tail 1 (2 hits) moves to M, then 2 goes to G
    pair.apply("f", pair.held.index(0), True, [])  # 0 back in S, its 2 hits kept
    pair.apply("f", pair.held.index(4), True, [])  # 4 back at M's head, its 3 hits kept
    pair.insert(2, True)  # a ghost hit: into M, which now holds 9
    for _ in range(6):  # M's tail twice (over its share); then S's 0 moves to M and M goes on
        pair.evict()
    assert pair.victims == [2, 3, 5, 6, 7, 8, 9]
    assert pair.reference.queue_sizes() == (0, 4, 0)


def test_hits_count_up_to_three() -> None:
    """Five hits and three leave the same frequency (3): the older of the two leaves first."""
    pair = Pair(4, {"small_ratio": 0.25, "ghost_ratio": 0.9, "move_threshold": 2})
    for key in range(4):  # 0 in S (1 block), 1, 2, 3 in M (the warm-up rule)
        pair.insert(key, True)
    for key in (1, 1, 1, 1, 1, 2, 2, 2):
        pair.apply("a", pair.held.index(key), False, [])
    _drain(pair)  # 0 from S; M: 1 and 2 go round three times, 3 first
    assert pair.victims == [0, 3, 1, 2, None]


def _tokens_workload(seed: int, requests: int, rate: float, tokens: int) -> Workload:
    """Short conversations of a few blocks each, whose turns share prefixes."""
    return synthetic(
        requests=requests,
        rate=rate,
        seed=seed,
        input_tokens=tokens,
        turn_tokens=tokens / 2,
        output_tokens=tokens,
        max_input_tokens=4 * tokens,
    )


def _spec(params: dict[str, Any]) -> str:
    return "s3fifo:" + ",".join(f"{k}={v!r}" for k, v in params.items())


def test_drawn_synthetic_rows_are_the_python_loops() -> None:
    """Rows of drawn workloads, small pools and running limits, drawn parameters: equal to the
    Python loop's; some of them preempt (hypothesis is steered towards preemptions)."""
    preempted: list[int] = []

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        seed=st.integers(min_value=0, max_value=2**16),
        requests=st.integers(min_value=1, max_value=40),
        rate=st.sampled_from([5.0, 50.0, 500.0]),
        tokens=st.sampled_from([16, 48, 96]),
        extra=st.integers(min_value=0, max_value=40),
        max_running=st.integers(min_value=1, max_value=6),
        params=PARAMS,
    )
    def check(
        seed: int,
        requests: int,
        rate: float,
        tokens: int,
        extra: int,
        max_running: int,
        params: dict[str, Any],
    ) -> None:
        workload = _tokens_workload(seed, requests, rate, tokens)
        capacity = min_capacity(workload) + extra
        row = assert_same_rows(workload, _spec(params), capacity, max_running=max_running)
        target(float(row["preemptions"]), label="preemptions")
        preempted.append(row["preemptions"])

    check()
    assert sum(p > 0 for p in preempted) >= 3, preempted
