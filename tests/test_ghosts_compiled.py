"""The compiled ghost set for int64 keys (engine_adapter/cache/_ghosts.pyx) against ghosts.py.

`IntGhostSet`, `IntReuseClock` and `IntReuseTimes` must give what `GhostSet`, `ReuseClock` and
`ReuseTimes` give, step by step: hypothesis drives both with the same operations (small
capacities and horizons, so that the clock's compaction and the reuse times' halving happen every
few lookups; keys at the int64 ends, INT64_MIN being the tables' free mark), and whole simulator
rows (regrets, ghost hits, age histograms included) must be the same with either set. Under
SAGE_REQUIRE_ALL=1 a missing build fails (conftest turns the skip into a failure).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_trace import MOONCAKE

from engine_adapter.cache import accounting
from engine_adapter.cache.ghosts import GHOSTS_CORE, GhostSet, ReuseClock, ReuseTimes, new_ghost_set
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload, unique_blocks
from sage_eviction import native

TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# a few small keys (repeats and ghost hits are common) and the int64 ends
KEYS = st.one_of(st.integers(-3, 24), st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MAX, 2**40]))


@pytest.fixture(scope="module")
def compiled() -> Any:
    module = native.load(GHOSTS_CORE)
    if module is None:
        pytest.skip("the compiled ghost set is not built (python setup.py build_ext --inplace)")
    return module


def _prompt(keys: list[int], distinct: bool) -> list[int]:
    return list(dict.fromkeys(keys)) if distinct else keys


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("lookup"), st.lists(KEYS, max_size=14), st.booleans(), st.integers(0, 14)),
        st.tuples(
            st.just("evict"),
            st.lists(st.tuples(KEYS, st.sampled_from([None, "a", "b"])), min_size=1, max_size=9),
            st.integers(0, 9),
            st.sampled_from(["lru", "arc"]),
            st.booleans(),  # add_many (the accounting's call) or add_records
        ),
        st.tuples(st.just("peek"), KEYS),
        st.tuples(st.just("clear")),
        st.tuples(st.just("long"), st.integers(60, 140)),  # longer than a small clock
    ),
    max_size=60,
)


def _step(ghosts: Any, op: tuple[Any, ...], clock: list[float], ids: list[int]) -> Any:
    """One operation on a ghost set; what it gives (compared between the twins)."""
    kind = op[0]
    if kind == "lookup":
        keys = _prompt(op[1], op[2])
        return ghosts.lookup(keys, min(op[3], len(keys)))
    if kind == "long":  # a lookup of distinct fresh keys, all hits: past the clock's positions
        keys = list(range(1000, 1000 + op[1]))
        return ghosts.lookup(keys, len(keys))
    if kind == "evict":
        clock[0] += 0.25
        call = ghosts.eviction(clock[0], ghosts.stamp(), op[2], op[3])
        records = []
        for key, tenant in op[1]:
            ids[0] += 1
            records.append((key, (ids[0], tenant, call)))
        if op[4]:
            keys, ids, tenants = (
                [k for k, _ in records],
                [r[0] for _, r in records],
                [r[1] for _, r in records],
            )
            ghosts.add_many(keys, ids, tenants, call)
        else:
            ghosts.add_records(records)
        return ghosts.stamp()
    if kind == "peek":
        return ghosts.peek(op[1]), op[1] in ghosts
    ghosts.clear()
    return None


@settings(deadline=None)
@given(capacity=st.integers(1, 7), horizon=st.integers(1, 12), ops=OPS)
def test_ghost_sets_agree_step_by_step(compiled: Any, capacity: int, horizon: int, ops: list[Any]) -> None:
    reference, fast = GhostSet(capacity, horizon), compiled.IntGhostSet(capacity, horizon)
    state_r: tuple[list[float], list[int]] = ([0.0], [0])
    state_f: tuple[list[float], list[int]] = ([0.0], [0])
    for i, op in enumerate(ops):
        assert _step(fast, op, *state_f) == _step(reference, op, *state_r), (i, op)
        assert len(fast) == len(reference)
        assert fast.stamp() == reference.stamp()
        assert fast.calls_held == len({id(record[2]) for record in reference._ghosts.values()})
    assert fast.capacity == reference.capacity and fast.times.horizon == reference.times.horizon


@settings(deadline=None, max_examples=100)  # compactions with old stamps need a few examples
@given(
    horizon=st.integers(1, 10),
    ops=st.lists(st.tuples(st.lists(KEYS, max_size=12), st.integers(0, 90)), max_size=40),
)
def test_reuse_clocks_agree_through_compactions(compiled: Any, horizon: int, ops: list[Any]) -> None:
    """Counts after each access and the remap of old stamps at each compaction (keys given twice
    in one `access_many` included: the reference counts them twice, so must the twin)."""
    reference, fast = ReuseClock(horizon), compiled.IntReuseClock(horizon)
    stamps: list[int] = []
    for keys, probe in ops:
        if not reference.room(len(keys)):
            assert not fast.room(len(keys))
            remap_r, remap_f = reference.compact(), fast.compact()
            assert [remap_f(s) for s in stamps] == [remap_r(s) for s in stamps]
            stamps = [remap_r(s) for s in stamps]
        stamps.append(reference.stamp())
        assert fast.stamp() == reference.stamp()
        reference.access_many(keys)
        fast.access_many(keys)
        assert fast.full == reference.full
        for stamp in [*stamps, probe, -1]:
            assert fast.distinct_since(stamp) == reference.distinct_since(stamp), stamp


WIDE_KEYS = st.integers(0, 700)


@settings(deadline=None)
@given(
    capacity=st.integers(100, 400),
    horizon=st.integers(130, 300),
    ops=st.lists(
        st.tuples(st.lists(WIDE_KEYS, max_size=150), st.integers(0, 150), st.lists(WIDE_KEYS, max_size=60)),
        max_size=30,
    ),
)
def test_ghost_sets_agree_across_runs_of_positions(
    compiled: Any, capacity: int, horizon: int, ops: list[Any]
) -> None:
    """Clocks of 8 * horizon + 64 > 1024 positions: counts that sum whole runs of marks, and
    compactions whose kept keys span several runs."""
    reference, fast = GhostSet(capacity, horizon), compiled.IntGhostSet(capacity, horizon)
    for step, (keys, n_hit, evicted) in enumerate(ops):
        keys = list(dict.fromkeys(keys))
        assert fast.lookup(keys, min(n_hit, len(keys))) == reference.lookup(keys, min(n_hit, len(keys)))
        for ghosts in (reference, fast):
            call = ghosts.eviction(float(step), ghosts.stamp(), n_hit, "lru")
            ghosts.add_many(evicted, list(range(len(evicted))), [None] * len(evicted), call)
        assert len(fast) == len(reference) and fast.stamp() == reference.stamp()


@settings(deadline=None)
@given(
    horizon=st.integers(130, 300),
    span=st.integers(10, 700),
    ops=st.lists(st.tuples(st.lists(WIDE_KEYS, max_size=150), st.integers(0, 3000)), max_size=30),
)
def test_reuse_clocks_agree_across_runs_of_positions(
    compiled: Any, horizon: int, span: int, ops: list[Any]
) -> None:
    """Counts that sum whole runs of 1024 marks, from every stamp taken (remapped as needed);
    `span` keys at most, so that counts over several runs can stay below the horizon."""
    reference, fast = ReuseClock(horizon), compiled.IntReuseClock(horizon)
    stamps: list[int] = []
    for keys, probe in ops:
        keys = list(dict.fromkeys(key % span for key in keys))
        if not reference.room(len(keys)):
            remap = reference.compact()
            fast.compact()
            stamps = [remap(s) for s in stamps]
        stamps.append(reference.stamp())
        reference.access_many(keys)
        fast.access_many(keys)
        for stamp in [*stamps, probe]:
            assert fast.distinct_since(stamp) == reference.distinct_since(stamp), stamp


@settings(deadline=None)
@given(
    horizon=st.integers(1, 8),
    ops=st.lists(st.tuples(st.lists(KEYS, max_size=10), st.none() | st.integers(-3, 12)), max_size=40),
)
def test_reuse_times_agree_through_halvings(compiled: Any, horizon: int, ops: list[Any]) -> None:
    reference, fast = ReuseTimes(horizon), compiled.IntReuseTimes(horizon)
    for keys, n_timed in ops:
        assert fast.access_many(keys, n_timed) == reference.access_many(keys, n_timed)
        if keys:
            assert fast.access(keys[0]) == reference.access(keys[0])


@pytest.mark.parametrize("horizon", [1, 2, 3, 7])
def test_remap_of_every_stamp_at_a_compaction(compiled: Any, horizon: int) -> None:
    """Every stamp from before a compaction maps as the reference's remap maps it (keys cycling
    over more than `horizon`, so that some are forgotten and some positions are not a key's last)."""
    reference, fast = ReuseClock(horizon), compiled.IntReuseClock(horizon)
    i = 0
    while reference.room(1):
        reference.access(i % (horizon + 2))
        fast.access(i % (horizon + 2))
        i += 1
    assert not fast.room(1)
    remap_r, remap_f = reference.compact(), fast.compact()
    assert [remap_f(s) for s in range(-2, i + 2)] == [remap_r(s) for s in range(-2, i + 2)]
    probes = range(-1, 12)
    assert [fast.distinct_since(s) for s in probes] == [reference.distinct_since(s) for s in probes]


def test_counts_over_several_runs_of_positions(compiled: Any) -> None:
    """Keys whose last access sits in a run of marks between a stamp's run and now's: the count
    sums that run whole (a few keys over 2000 positions, so counts stay below the horizon)."""
    reference, fast = ReuseClock(300), compiled.IntReuseClock(300)
    busy = list(range(50, 60))
    prompts = [list(range(50)), *[busy] * 98, list(range(100, 120)), *[busy] * 105]
    for keys in prompts:
        reference.access_many(keys)
        fast.access_many(keys)
    assert reference.stamp() > 2048  # three runs of marks
    stamps = range(0, reference.stamp() + 1, 7)
    assert [fast.distinct_since(s) for s in stamps] == [reference.distinct_since(s) for s in stamps]
    assert reference.distinct_since(0) == 80


def test_a_lookup_that_exactly_fills_the_clock(compiled: Any) -> None:
    """The clock compacts only when a lookup would not fit: one that fills it to the last
    position does not, and the ghost's stamp (0 here, -1 after a compaction) says which."""
    for ghosts in (GhostSet(4, 1), compiled.IntGhostSet(4, 1)):
        ghosts.add_many([100], [1], [None], ghosts.eviction(0.0, ghosts.stamp(), 1, "lru"))
        ghosts.lookup(list(range(71)), 71)  # 71 of the clock's 8 * 1 + 64 positions
        _, found = ghosts.lookup([100], 0)
        assert [(i, ghost.stamp, regret) for i, ghost, regret in found] == [(0, 0, False)]


def test_the_compiled_set_refuses_what_it_cannot_hold(compiled: Any) -> None:
    ghosts = compiled.IntGhostSet(4, 4)
    with pytest.raises(ValueError, match="at least 1"):
        compiled.IntGhostSet(0, 4)
    with pytest.raises(OverflowError):
        ghosts.lookup([2**63], 0)
    with pytest.raises(TypeError):
        ghosts.lookup(["a"], 0)
    assert ghosts.peek("a") is None and "a" not in ghosts and 2**64 not in ghosts


def test_the_factory_picks_the_compiled_set_only_when_asked(compiled: Any) -> None:
    assert isinstance(new_ghost_set(4, 8, int_keys=True), compiled.IntGhostSet)
    assert isinstance(new_ghost_set(4, 8), GhostSet)
    with native.pure_python():
        assert isinstance(new_ghost_set(4, 8, int_keys=True), GhostSet)


# ---- whole rows ---------------------------------------------------------------------------------


def _row(workload: Workload, policy: str, fraction: float, python_ghosts: bool, **options: Any) -> Any:
    capacity = max(1, int(unique_blocks(workload.requests) * fraction))
    simulator = Simulator(workload, policy, capacity, cache_model="radix", **options)
    with pytest.MonkeyPatch.context() as patch:
        if python_ghosts:  # everything else compiled as usual: only the ghost set differs
            patch.setattr(accounting, "new_ghost_set", lambda n, horizon, _: GhostSet(n, horizon))
        state = simulator.start_run()
        ghosts = state.cache.manager.accounting.ghosts
        assert isinstance(ghosts, GhostSet) == python_ghosts
        result = simulator.run()
    return {k: v for k, v in result.to_dict().items() if k not in TIMINGS}


@pytest.fixture(scope="module")
def mooncake_slice() -> Workload:
    workload = read_mooncake(MOONCAKE)
    return Workload(workload.requests[:600], workload.block_size, "mooncake")


def _rows_agree(workload: Workload, policy: str, fraction: float, **options: Any) -> dict[str, Any]:
    reference = _row(workload, policy, fraction, True, **options)
    assert reference == _row(workload, policy, fraction, False, **options)
    assert reference["age_histograms"], "no ages counted: nothing compared"
    return reference


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "arc", "gdsf", "belady"])
def test_rows_agree_on_mooncake(compiled: Any, mooncake_slice: Workload, policy: str) -> None:
    row = _rows_agree(mooncake_slice, policy, 0.05)
    assert row["ghost_hits"] > 0, "the row never hit a ghost: nothing compared"


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "arc", "gdsf", "belady"])
def test_rows_agree_on_synthetic(compiled: Any, policy: str) -> None:
    row = _rows_agree(synthetic(requests=300, seed=5), policy, 0.05)
    assert row["ghost_hits"] > 0, "the row never hit a ghost: nothing compared"


def test_rows_agree_with_kv_tiers(compiled: Any, mooncake_slice: Workload) -> None:
    """Evicted blocks go to the tiers (no ghost hits there): the ages and the rest of the row."""
    unique = unique_blocks(mooncake_slice.requests)
    tiers = TierConfig(host_blocks=int(unique * 0.2), disk_blocks=int(unique * 0.05))
    _rows_agree(mooncake_slice, "lru", 0.05, tiers=tiers)
