"""The radix row's compiled loop (`engine_adapter.sim._radix_run`) against the Python event loop.

`Simulator.run()` of a plain radix row whose policy the loop runs goes through one compiled call
(`engine_adapter.sim.radix_run`); the reference is the Python event loop over the real
`CacheManager` (`Simulator.advance`), forced by replacing `radix_run.radix_loop`
(tests/radix_rows.py). Held equal: the row field for field (timings aside: hits, evictions,
re-prefills, preemptions, regrets, ghost hits, every age and reuse-distance histogram with its
float sum), `Simulator.ttft_s` bit for bit and the progress calls; on hypothesis-drawn workloads
(arrival ties and bursts, repeated keys, partial last blocks, outputs of 0 and 1 tokens, tenants
or sessions, lists and `RequestTable`s, small pools and running limits where decode growth
preempts) and on the shipped Mooncake conversation trace. `PolicyProbe` holds the tick kind
(lru, fifo, mru, filo) to the Python policies operation by operation. The Python loop keeps the
rows the compiled one does not run (tiers, compress-on-evict, fleets, other policies,
`compiled=False`, `SAGE_PURE_PYTHON`); queue protection and the adaptive batch run compiled
(tests/test_radix_run_protection.py, tests/test_radix_run_adaptive.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from radix_probe_ops import HOT, Op, conversations, pinned_conversations, sequences, through_rebuilds
from radix_rows import assert_same_outcomes, assert_same_rows, outcome, run_row, without_timings
from sim_strategies import COSTS, workloads

from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim import radix_run
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks
from sage_eviction import get_policy_class, native
from sage_eviction.registry import POLICIES
from sage_eviction.types import EntryMeta

pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)

TICK_POLICIES = ("lru", "fifo", "mru", "filo")


def test_the_compiled_loop_is_built() -> None:
    assert radix_run.radix_loop() is native.load(radix_run.RADIX_LOOP)


# ---- whole rows ---------------------------------------------------------------------------------


def _drawn_workload(drawn: tuple[list[SimRequest], int], table: bool) -> Workload:
    requests, block_size = drawn
    held = RequestTable.of(requests) if table else requests
    return Workload(held, block_size=block_size, source="synthetic")


ROWS = given(
    drawn=workloads(),
    policy=st.sampled_from((*TICK_POLICIES, "unbounded")),
    spare=st.sampled_from([0, 0, 1, 2, 5]) | st.integers(0, 40),
    max_running=st.sampled_from([1, 2, 3, 8, 256]),
    max_prefill_tokens=st.sampled_from([1, 8, 16, 32, 16384]),
    cost=st.sampled_from(COSTS),
    table=st.booleans(),
    every=st.integers(1, 4),
)


def _outcome(workload: Workload, policy: str, capacity: int, python: bool, **options: Any) -> dict[str, Any]:
    """One run's `outcome`, and its progress calls."""
    calls: list[int] = []
    sim = Simulator(workload, policy, capacity, progress=calls.append, **options)
    return {**outcome(sim, python), "progress": calls}


def _rows_agree(
    drawn: tuple[list[SimRequest], int],
    policy: str,
    spare: int,
    max_running: int,
    max_prefill_tokens: int,
    cost: Any,
    table: bool,
    every: int,
) -> None:
    """The compiled row is the Python loop's, and so are the progress calls."""
    workload = _drawn_workload(drawn, table)
    capacity = max(1, min_capacity(workload)) + spare  # from the smallest pool the model runs
    options: dict[str, Any] = dict(
        max_running=max_running, max_prefill_tokens=max_prefill_tokens, cost_model=cost, progress_every=every
    )
    compiled = _outcome(workload, policy, capacity, False, **options)
    reference = _outcome(workload, policy, capacity, True, **options)
    assert_same_outcomes(compiled, reference)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ROWS
def test_the_compiled_loop_gives_the_python_loops_row(**drawn: Any) -> None:
    """A quick-loop sample; the slow run below draws many more."""
    _rows_agree(**drawn)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@ROWS
def test_the_compiled_loop_gives_the_python_loops_row_long(**drawn: Any) -> None:
    _rows_agree(**drawn)


@pytest.mark.parametrize("policy", TICK_POLICIES)
def test_rows_that_preempt(policy: str) -> None:
    """Long outputs on a pool of 1.5 x the largest request: decode growth falls short, the
    policy's candidate order picks the sequences preempted, which re-prefill from the head of
    the queue (their own blocks cached: no lookup, but re-prefill tokens and the accounting)."""
    workload = synthetic(
        requests=160, rate=40.0, input_tokens=128.0, input_sigma=0.3, output_tokens=200.0,
        output_sigma=0.3, max_input_tokens=512, seed=3, tenants=3,
    )  # fmt: skip
    row = assert_same_rows(workload, policy, 87)
    assert row["preemptions"] > 0 and row["evictions"] > 0 and row["regrets"] > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=conversations(),
    policy=st.sampled_from(sorted(radix_run.compiled_policies())),
    max_running=st.sampled_from([1, 2, 3, 8]),
    prefill=st.sampled_from([16, 64, 16384]),
)
def test_conversation_rows_of_every_kind(
    drawn: tuple[Workload, int], policy: str, max_running: int, prefill: int
) -> None:
    """Multi-turn conversations with shared system prompts at small pools: locked chains,
    cascades of evictions and preemptions, for every compiled policy."""
    workload, capacity = drawn
    row = assert_same_rows(workload, policy, capacity, max_running=max_running, max_prefill_tokens=prefill)
    event(f"preemptions: {'some' if row['preemptions'] else 'none'}")


@pytest.mark.parametrize("policy", sorted(radix_run.compiled_policies()))
def test_a_conversation_row_that_preempts(policy: str) -> None:
    """Pinned so that a run that stops preempting is noticed (the drawn rows above reach it too)."""
    row = assert_same_rows(pinned_conversations(), policy, 40, max_running=2)
    assert row["preemptions"] > 0 and row["evictions"] > 100


def test_a_table_and_a_list_give_one_row() -> None:
    """The same requests as a `RequestTable` (its own columns) and as a list of `SimRequest`s."""
    workload = synthetic(requests=80, rate=30.0, seed=5, tenants=2)
    listed = Workload(list(workload.requests), block_size=workload.block_size, source="synthetic")
    capacity = max(min_capacity(workload), unique_blocks(workload) // 6)
    table_row = assert_same_rows(workload, "lru", capacity)
    list_row = assert_same_rows(listed, "lru", capacity)
    assert without_timings(table_row) == without_timings(list_row)


MOONCAKE_HITS = {
    "lru": 56_890, "fifo": 56_901, "mru": 43_412, "filo": 46_608, "sieve": 52_808, "lfu": 52_711,
    "s3fifo": 56_175, "arc": 58_107, "gdsf": 50_101, "belady": 95_421,
}  # fmt: skip
"""The shipped Mooncake conversation trace at 5 % of its distinct blocks (9,139): each compiled
policy's block hits, golden (both loops give them)."""


def _mooncake(requests: int | None = None) -> Workload:
    path, _ = shipped_trace("mooncake:conversation")
    return read_mooncake(path, limit=requests)


def test_every_compiled_policy_has_a_golden_row() -> None:
    assert sorted(radix_run.compiled_policies()) == sorted(MOONCAKE_HITS)


@pytest.mark.parametrize("policy", sorted(MOONCAKE_HITS))
def test_a_mooncake_sample(policy: str) -> None:
    """The trace's first 600 requests at 5 %, each compiled policy (the whole trace below)."""
    workload = _mooncake(600)
    capacity = max(min_capacity(workload), unique_blocks(workload) // 20)
    row = assert_same_rows(workload, policy, capacity, max_running=32)
    assert row["evictions"] > 0 and 0 < row["block_hits"] < row["block_lookups"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(MOONCAKE_HITS))
def test_the_mooncake_rows(policy: str) -> None:
    """The whole trace at 5 % of its distinct blocks (the issue's benchmark row)."""
    workload = _mooncake()
    row = assert_same_rows(workload, policy, int(0.05 * unique_blocks(workload)))
    assert (row["block_lookups"], row["block_hits"]) == (288_500, MOONCAKE_HITS[policy])
    assert row["evictions"] > 100_000


# ---- which rows run compiled -------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"tiers": TierConfig(host_blocks=64)},
        {"compress_on_evict": "knorm:0.5"},
        {"compiled": False},
        {"cache_model": "sglang"},
    ],
    ids=["tiers", "compress", "pure-cache", "sglang"],
)
def test_the_python_loop_runs_the_rows_the_compiled_one_does_not(options: dict[str, Any]) -> None:
    workload = synthetic(requests=40, rate=20.0, seed=4)
    capacity = max(min_capacity(workload), unique_blocks(workload) // 4)
    sim, _ = run_row(workload, "lru", capacity, **options)
    assert sim.event_loop == "python"


def test_policies_without_a_kind_and_pure_python_run_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = synthetic(requests=40, rate=20.0, seed=4)
    capacity = max(min_capacity(workload), unique_blocks(workload) // 4)

    class PluginLRU(get_policy_class("lru")):  # type: ignore[misc]
        """A plugin with LRU's behaviour: a class the compiled loop has no kind for."""

        name = "plugin-lru"

    monkeypatch.setitem(POLICIES, "plugin-lru", PluginLRU)
    plugin, plugin_row = run_row(workload, "plugin-lru", capacity)
    builtin, builtin_row = run_row(workload, "lru", capacity)
    assert (plugin.event_loop, builtin.event_loop) == ("python", "compiled")
    assert (plugin.policy_calls, builtin.policy_calls) == ("python", "c-state")
    relabelled = {
        k: v for k, v in without_timings(plugin_row).items() if k not in ("policy", "age_histograms")
    }
    assert relabelled == {
        k: v for k, v in without_timings(builtin_row).items() if k not in ("policy", "age_histograms")
    }
    with native.pure_python():
        pure, pure_row = run_row(workload, "lru", capacity)
    assert (pure.event_loop, pure.policy_calls) == ("python", "python")
    assert without_timings(pure_row) == without_timings(builtin_row)


def test_string_keys_run_the_python_loop() -> None:
    requests = [SimRequest(i, i * 0.1, (f"k{i % 3}", "x"), 32, 2) for i in range(8)]
    workload = Workload(requests, block_size=16, source="synthetic")
    sim, _ = run_row(workload, "lru", 8)
    assert sim.event_loop == "python"


# ---- the tick kind, operation by operation -----------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "access", "flip", "evict"]), st.integers(0, 24), st.booleans()
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(TICK_POLICIES), ops=OPS)
def test_the_tick_kind_evicts_as_the_python_policy(policy: str, ops: list[tuple[str, int, bool]]) -> None:
    """Random inserts (evictable or not), hits, evictable flips and evictions on the Python
    policy and on the loop's tick kind: the same victims in the same order."""
    loop = radix_run.radix_loop()
    assert loop is not None
    cls = get_policy_class(policy)
    kind, variant = radix_run.policy_kind(cls)
    python = cls()
    probe = loop.PolicyProbe(cls(), kind, variant, 32)
    held: set[int] = set()
    for op, key, flag in ops:
        if op == "insert" and key not in held and len(held) < 32:
            python.insert(key, EntryMeta(), evictable=flag)
            probe.insert(key, flag)
            held.add(key)
        elif op == "access" and key in held:
            python.access(key, 0.0)
            probe.access(key)
        elif op == "flip" and key in held:
            python.set_evictable(key, flag)
            probe.set_evictable(key, flag)
        elif op == "evict":
            victims = python.evict(1)
            assert probe.evict() == (victims[0] if victims else None)
            held.difference_update(victims)
        assert probe.num_evictable == python.num_evictable
        assert len(probe) == len(python)


@settings(max_examples=30, deadline=None)
@given(
    policy=st.sampled_from(TICK_POLICIES),
    drawn=sequences(max_capacity=30, max_length=1000, ops=HOT, min_length=300),
)
def test_the_tick_kind_through_heap_rebuilds(policy: str, drawn: tuple[list[Op], int]) -> None:
    """Hundreds of hits and flips on a full pool, no eviction: the heap is rebuilt from its live
    entries (no row reaches that), then drained in the policy's order."""
    through_rebuilds(get_policy_class(policy)(), *drawn)


def test_a_probe_refuses_a_held_key_and_an_unknown_one() -> None:
    loop = radix_run.radix_loop()
    assert loop is not None
    kind, variant = radix_run.policy_kind(get_policy_class("lru"))
    probe = loop.PolicyProbe(get_policy_class("lru")(), kind, variant, 4)
    probe.insert(1)
    with pytest.raises(KeyError):
        probe.insert(1)
    with pytest.raises(KeyError):
        probe.access(2)
    assert (probe.evict(), probe.evict()) == (1, None)


def test_drawn_strategies_reach_preemption() -> None:
    """The drawn rows' small pools and limits do preempt (else the path after a failed growth
    would go untested there): a fixed small case of the same shape."""
    requests = [SimRequest(i, 0.0, (3 * i, 3 * i + 1), 8, 40) for i in range(6)]
    workload = Workload(requests, block_size=4, source="synthetic")
    row = assert_same_rows(workload, "lru", min_capacity(workload) + 1)
    assert row["preemptions"] > 0


def test_a_preemption_takes_one_sequence_when_its_one_block_suffices() -> None:
    """One-block prompts that all need their second block in the same step, in a pool that
    holds fewer: each preemption frees the one block of one sequence (`select_victims` stops
    once the blocks freed reach the one needed), so the row counts one preemption per short
    block, not two."""
    requests = [SimRequest(i, 0.0, (i,), 4, 30) for i in range(6)]
    workload = Workload(requests, block_size=4, source="synthetic")
    row = assert_same_rows(workload, "lru", 9)
    assert row["preemptions"] >= 3
