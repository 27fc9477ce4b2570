"""The score-heap kinds of the compiled radix loop (sage_eviction/_kind_score.pxi): gdsf
and the radix model's Belady, against their Python policies.

- Operation by operation: the same drawn sequence (inserts evictable or not, at drawn depths;
  hits; evictable flips; evictions; for Belady the requests served, forward and back as a
  preempted request is served again, and keys from outside the served request) on the
  pure-Python policy (`GDSFPolicy`, `RadixBelady` over `_ListHeap`) and on a `PolicyProbe` of
  the kind: every victim and `num_evictable` equal after each operation.
- Whole rows (tests/radix_rows.py): the compiled loop's row against the Python loop's over the
  real `CacheManager`, on drawn request lists (repeated keys, partial blocks), on drawn
  `synthetic` workloads at small capacities and running limits (preemptions), and on the
  shipped Mooncake conversation trace at 5 % of its distinct blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_rows import assert_same_rows

from engine_adapter.sim import radix_run
from engine_adapter.sim.cache_models import RadixBelady
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, lookup_keys, next_use_positions, unique_blocks
from sage_eviction import EntryMeta, native
from sage_eviction.base import EvictionPolicy
from sage_eviction.policies.gdsf import GDSFPolicy

# A missing build skips, which SAGE_REQUIRE_ALL=1 turns into a failure (conftest.py).
pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)

KEYS = 16  # keys drawn from 0 .. KEYS - 1: few enough to hit held keys often
Op = tuple[Any, ...]


def _ops(serves: int) -> st.SearchStrategy[list[Op]]:
    """Operation sequences long enough for a few evictions (GDSF's L rises), hits and flips of
    evictable keys (stale items left in the heap); `serves` requests to serve (0: none)."""
    key = st.integers(0, KEYS - 1)
    op = st.one_of(
        st.tuples(st.just("insert"), key, st.booleans(), st.integers(0, 40)),
        st.tuples(st.just("access"), key),
        st.tuples(st.just("set"), key, st.booleans()),
        st.tuples(st.just("evict")),
    )
    if serves:
        op = op | st.tuples(st.just("serve"), st.integers(0, serves - 1))
    return st.lists(op, min_size=40, max_size=300)


def _probe(policy: object, kind: tuple[int, int], block_size: int) -> Any:
    loop = radix_run.radix_loop()
    assert loop is not None
    return loop.PolicyProbe(policy, kind[0], kind[1], KEYS, block_size)


def _apply(reference: EvictionPolicy, probe: Any, op: Op, block_size: int) -> None:
    """One operation on both (one on a key it does not apply to is skipped by both)."""
    name, key = op[0], op[1] if len(op) > 1 else None
    held = key in reference
    if name == "insert" and not held:
        depth = op[3]
        meta = EntryMeta(size=block_size, cost=float((depth + 1) * block_size), depth=depth)
        reference.insert(key, meta, evictable=op[2])
        probe.insert(key, op[2], depth)
    elif name == "access" and held:
        reference.access(key, 0.0)
        probe.access(key)
    elif name == "set" and held:
        reference.set_evictable(key, op[2])
        probe.set_evictable(key, op[2])
    elif name == "evict":
        victims = reference.evict(1)
        assert probe.evict() == (victims[0] if victims else None)
    assert probe.num_evictable == reference.num_evictable
    assert len(probe) == len(reference)


QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GDSF_OPS = given(ops=_ops(0), block_size=st.sampled_from([1, 3, 16]))


def _gdsf_agrees(ops: list[Op], block_size: int) -> None:
    with native.pure_python():
        reference = GDSFPolicy()
    probe = _probe(None, radix_run.policy_kind(GDSFPolicy), block_size)
    for op in ops:
        _apply(reference, probe, op, block_size)


@QUICK
@GDSF_OPS
def test_gdsf_victim_for_victim(ops: list[Op], block_size: int) -> None:
    """A quick-loop sample (about a second); the slow run below draws 600 sequences."""
    _gdsf_agrees(ops, block_size)


@pytest.mark.slow
@LONG
@GDSF_OPS
def test_gdsf_victim_for_victim_long(ops: list[Op], block_size: int) -> None:
    _gdsf_agrees(ops, block_size)


@st.composite
def futures(draw: Callable[..., Any]) -> list[SimRequest]:
    """A lookup sequence as requests: keys repeat within a request and across; keys KEYS and
    above are looked up but never held, and a held key may never be looked up (next use: never)."""
    n = draw(st.integers(1, 8))
    keys = st.lists(st.integers(0, KEYS + 3), min_size=0, max_size=6)
    return [SimRequest(i, float(i), tuple(draw(keys)), 16, 1) for i in range(n)]


def _serve(reference: RadixBelady, probe: Any, requests: list[SimRequest], i: int, loop: Any) -> None:
    end = sum(len(r.block_hashes) for r in requests[: i + 1])
    keys = requests[i].block_hashes
    reference.serve(keys, end)
    probe.serve(np.asarray(keys, dtype=np.int64), end)


BELADY_OPS = given(requests=futures(), data=st.data(), wide=st.booleans())


def _belady_agrees(requests: list[SimRequest], data: st.DataObject, wide: bool) -> None:
    """Served requests in any order (a preempted one comes back with an earlier cursor), keys
    from the served request (its last position when repeated) and from outside it, the lookup
    keys as int32 or int64."""
    ops = data.draw(_ops(len(requests)))
    with native.pure_python():
        reference = RadixBelady(requests)
    keys = np.asarray(lookup_keys(requests), dtype=np.int64 if wide else np.int32)
    after = np.frombuffer(next_use_positions(requests), dtype=np.int64)
    probe = _probe(radix_run.RadixFuture(keys, after), radix_run.policy_kind(RadixBelady), 16)
    loop = radix_run.radix_loop()
    for op in ops:
        if op[0] == "serve":
            _serve(reference, probe, requests, op[1], loop)
        else:
            _apply(reference, probe, op, 16)


@QUICK
@BELADY_OPS
def test_belady_victim_for_victim(requests: list[SimRequest], data: st.DataObject, wide: bool) -> None:
    _belady_agrees(requests, data, wide)


@pytest.mark.slow
@LONG
@BELADY_OPS
def test_belady_victim_for_victim_long(requests: list[SimRequest], data: st.DataObject, wide: bool) -> None:
    _belady_agrees(requests, data, wide)


def test_belady_outside_the_served_request_after_the_cursor_went_back() -> None:
    """A key from outside the served request, scored at a late cursor (never again), then at an
    early one (a preempted request served again): its first lookup after the early cursor, not
    one after the late. Key 1 is looked up at 1, 3 and 5, key 2 at 2 and 4."""
    requests = [SimRequest(i, float(i), (key,), 16, 1) for i, key in enumerate([5, 1, 2, 1, 2, 1, 7])]
    with native.pure_python():
        reference = RadixBelady(requests)
    after = np.frombuffer(next_use_positions(requests), dtype=np.int64)
    keys = np.asarray(lookup_keys(requests), dtype=np.int64)
    probe = _probe(radix_run.RadixFuture(keys, after), radix_run.policy_kind(RadixBelady), 16)
    loop = radix_run.radix_loop()
    _serve(reference, probe, requests, 6, loop)  # the cursor at the end: key 1 is never looked up again
    _apply(reference, probe, ("insert", 1, True, 0), 16)
    _apply(reference, probe, ("evict",), 16)
    _serve(reference, probe, requests, 0, loop)  # back to 1: key 1 next at 1, key 2 at 2
    _apply(reference, probe, ("insert", 1, True, 0), 16)
    _apply(reference, probe, ("insert", 2, True, 0), 16)
    assert reference.evict(1) == [2] and probe.evict() == 2


def test_a_long_sequence_rebuilds_the_heap() -> None:
    """Hits on a few evictable keys push far more items than there are live ones: the heap is
    rebuilt from its live items several times, and the order is still the policy's."""
    with native.pure_python():
        reference = GDSFPolicy()
    probe = _probe(None, radix_run.policy_kind(GDSFPolicy), 16)
    rng = np.random.default_rng(7)
    for step in range(3000):
        key = int(rng.integers(0, KEYS))
        kind = ("access", "access", "insert", "set", "evict")[step % 5]
        _apply(reference, probe, (kind, key, bool(rng.integers(0, 4)), int(rng.integers(0, 9))), 16)
    while reference.num_evictable:
        _apply(reference, probe, ("evict",), 16)


def test_a_rebuild_keeps_every_live_item() -> None:
    """Hits push stale items until the heap is rebuilt from its live ones, the smallest of which
    (key 0, never hit, cost 1) sits at the top then; every key is evicted in the policy's order."""
    with native.pure_python():
        reference = GDSFPolicy()
    probe = _probe(None, radix_run.policy_kind(GDSFPolicy), 16)
    for key in range(KEYS):
        _apply(reference, probe, ("insert", key, True, key), 16)
    for hit in range(300):
        _apply(reference, probe, ("access", 1 + hit % (KEYS - 1)), 16)
    for _ in range(KEYS):
        _apply(reference, probe, ("evict",), 16)
    assert len(reference) == len(probe) == 0


def test_the_future_must_fit() -> None:
    """A future whose arrays disagree is refused when the kind is built."""
    keys, after = np.arange(4, dtype=np.int64), np.full(3, 3, dtype=np.int64)
    with pytest.raises(ValueError, match="one next use per lookup"):
        _probe(radix_run.RadixFuture(keys, after), radix_run.policy_kind(RadixBelady), 16)
    with pytest.raises(TypeError, match="int64 next uses"):
        _probe(radix_run.RadixFuture(keys, after.astype(np.int32)), radix_run.policy_kind(RadixBelady), 16)


# ---- whole rows ------------------------------------------------------------------------------


@st.composite
def request_lists(draw: Callable[..., Any]) -> Workload:
    """Small workloads: arrival ties, repeated keys, partial last blocks, output lengths 0 and 1."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(1, 20))
    arrivals = sorted(
        draw(st.lists(st.sampled_from([0.0, 0.05, 0.5, 1.0]) | st.floats(0.0, 2.0), min_size=n, max_size=n))
    )
    requests = []
    for i, arrival in enumerate(arrivals):
        keys = draw(st.lists(st.integers(-3, 14), max_size=7))
        input_len = max(0, len(keys) * block_size + draw(st.integers(-block_size + 1, block_size)))
        output = draw(st.sampled_from([0, 1, 2]) | st.integers(1, 60))
        requests.append(SimRequest(i, arrival, tuple(keys), input_len, output))
    return Workload(requests, block_size=block_size, source="synthetic")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=request_lists(),
    policy=st.sampled_from(["gdsf", "belady"]),
    spare=st.integers(0, 8),
    max_running=st.sampled_from([1, 2, 3, 8]),
)
def test_rows_of_drawn_requests(workload: Workload, policy: str, spare: int, max_running: int) -> None:
    """At the smallest pool the workload runs in, and a few blocks more."""
    assert_same_rows(workload, policy, max(1, min_capacity(workload)) + spare, max_running=max_running)


def _synthetic_rows(
    seed: int, requests: int, rate: float, fraction: int, max_running: int, policy: str
) -> dict[str, Any]:
    workload = synthetic(requests=requests, rate=rate, seed=seed, input_tokens=96.0, output_tokens=48.0)
    capacity = max(1, min_capacity(workload), unique_blocks(workload) // fraction)
    return assert_same_rows(workload, policy, capacity, max_running=max_running)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    requests=st.integers(5, 40),
    rate=st.sampled_from([5.0, 50.0, 500.0]),
    fraction=st.sampled_from([3, 8, 20]),
    max_running=st.sampled_from([2, 4, 16]),
    policy=st.sampled_from(["gdsf", "belady"]),
)
def test_rows_of_synthetic_workloads(**drawn: Any) -> None:
    _synthetic_rows(**drawn)


@pytest.mark.parametrize("policy", ["gdsf", "belady"])
def test_synthetic_rows_with_preemptions(policy: str) -> None:
    """Small pools under a burst: sequences are preempted (and served again: Belady's cursor
    goes back, and their released blocks take next uses from outside the served request)."""
    rows = [_synthetic_rows(seed, 40, 500.0, 20, 16, policy) for seed in (1, 2, 3)]
    assert any(row["preemptions"] > 0 for row in rows)
