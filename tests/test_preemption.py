"""The preemption orders (`sage_eviction.preemption`): one table of named orders, owned by the
scheduler (the cache manager's `preemption_order`, the simulator's and the benchmark's
``--preemption-order``), a policy naming only its default.

- Every registered policy names an order that is in the table; each order's `up_to` keeps
  exactly the candidates whose key is <= the bound (hypothesis).
- An unknown name is a clear error; a class written for the old per-policy `candidate_key` is
  refused; a plugin's order registers and is used.
- The scheduler's order changes which sequence is preempted (the cache manager, the simulator
  in both its loops), and naming the policy's own order changes nothing.
- The CLI: a bad ``--preemption-order`` is one line and exit 2 (a real process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from radix_rows import assert_same_rows, run_row, without_timings

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.twins.sage_run import simulate_sage
from engine_adapter.sim.workloads import Workload
from sage_eviction import EvictionCandidate, PreemptionOrder, preemption
from sage_eviction.policies import POLICIES
from sage_eviction.policies.lru import LRUPolicy
from sage_eviction.preemption import ORDERS, get_order, register_order, resolve_order

# ---- the table -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_registered_policy_names_an_order_in_the_table(name: str) -> None:
    assert POLICIES[name].preemption_order in ORDERS


candidates = st.lists(
    st.builds(
        EvictionCandidate,
        sequence_id=st.integers(0, 50),
        block_ids=st.lists(st.integers(0, 9), max_size=4),
        last_access_time=st.sampled_from([0.0, 1.0, 2.5, 7.0]),
        access_count=st.integers(0, 5),
        priority=st.integers(-2, 2),
        is_pinned=st.booleans(),
        estimated_lifetime=st.one_of(st.none(), st.sampled_from([0.5, 3.0])),
        sequence_length=st.integers(0, 60),
        max_length=st.sampled_from([0, 40, 64]),
    ),
    min_size=1,
    max_size=30,
)


def test_the_benchmarks_help_names_exactly_the_built_in_orders() -> None:
    """``sage llm benchmark --preemption-order``'s help lists the orders by hand (the CLI stays
    light: it does not import the policy library to render its help); it must list the table."""
    from sage_cli.options import PreemptionOrderOpt

    listed = typing.get_args(PreemptionOrderOpt)[1].help.split("named order: ")[1].split(" (")[0]
    assert listed.split(", ") == list(ORDERS)  # a plugin test's order is unregistered after it


@pytest.mark.parametrize("name", sorted(ORDERS))
@settings(max_examples=30)
@given(cs=candidates, pick=st.integers(0, 29))
def test_up_to_keeps_exactly_the_keys_under_the_bound(
    name: str, cs: list[EvictionCandidate], pick: int
) -> None:
    order = ORDERS[name]
    assert order.up_to is not None
    bound = order.key(cs[pick % len(cs)])
    assert order.up_to(cs, bound) == [c for c in cs if order.key(c) <= bound]


def test_an_unknown_order_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown preemption order 'nope'; known: policy, fifo, .*lru"):
        get_order("nope")
    assert resolve_order("policy") is None
    assert resolve_order("lfu") is ORDERS["lfu"]


def test_a_class_written_for_the_old_candidate_key_is_refused() -> None:
    with pytest.raises(
        TypeError, match=r"Newest defines candidate_key, which sage no longer reads.*register_order"
    ):

        class Newest(LRUPolicy):
            name = "newest-test"

            @staticmethod
            def candidate_key(candidate: EvictionCandidate) -> Any:
                return -candidate.last_access_time


def test_a_plugin_registers_its_own_order_and_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "ORDERS", dict(ORDERS))  # the registration stays in this test
    longest = register_order(
        PreemptionOrder("longest-test", lambda c: -c.sequence_length, None, None, "longest first")
    )

    class Longest(LRUPolicy):
        name = "longest-test"
        preemption_order = "longest-test"

    cs = [EvictionCandidate(i, [i], float(i), 1, 0, False, sequence_length=10 * (i % 3)) for i in range(5)]
    # lengths 0, 10, 20, 0, 10: the longest first, ties in list order; lru would take 0, 1
    assert Longest().select_victims(cs, 2) == [2, 1]
    assert LRUPolicy().select_victims(cs, 2, longest) == [2, 1]
    assert LRUPolicy().select_victims(cs, 2) == [0, 1]
    with pytest.raises(ValueError, match="exists already"):
        register_order(PreemptionOrder("lru", lambda c: 0, None, None, "x"))
    with pytest.raises(ValueError, match="no compiled copy"):
        register_order(PreemptionOrder("mine", lambda c: 0, None, ("lru", ()), "x"))


# ---- the scheduler's order ------------------------------------------------------------------------


def test_the_managers_order_chooses_the_victim() -> None:
    """mru's own order takes the most recently touched sequence; lru's, set by the scheduler,
    the least recently touched one."""
    now = [0.0]
    m = CacheManager(BlockAllocator(16, 4), policy="mru", clock=lambda: now[0])
    for seq in range(3):
        m.allocate(CacheRequest(seq, [seq * 1000 + i for i in range(8)]))
        now[0] += 1.0
    m.touch_sequence(1)
    now[0] += 1.0
    m.touch_sequence(0)  # 2 was touched least recently, 0 most
    assert m.select_preemption_victims(1) == [0]
    m.preemption_order = get_order("lru")
    assert m.select_preemption_victims(1) == [2]
    m.preemption_order = get_order("mru")
    assert m.select_preemption_victims(1) == [0]


def _mooncake(requests: int) -> Workload:
    path, _ = shipped_trace("mooncake:conversation")
    return read_mooncake(path, limit=requests)


def test_the_simulators_order_changes_who_is_preempted() -> None:
    """The same mru row preempts otherwise under lru's order; naming mru's own order is the
    default row exactly; and the compiled loop agrees with the Python loop on both."""
    workload = _mooncake(120)
    _, own = run_row(workload, "mru", 240)
    _, named = run_row(workload, "mru", 240, preemption_order="mru")
    _, lru = run_row(workload, "mru", 240, preemption_order="lru")
    assert own["preemptions"] > 0
    assert without_timings(named) == without_timings(own)
    assert lru["preemptions"] != own["preemptions"]
    assert_same_rows(workload, "mru", 240, preemption_order="lru")


@pytest.mark.slow  # the sage twin steps in Python: about 1 s a run
def test_the_sage_twins_order_changes_who_is_preempted() -> None:
    """The sage twin (sage's engine's scheduler over its cache) takes the order as the engine's
    scheduler does: lru's order preempts otherwise than mru's own, which is the default row."""
    workload = _mooncake(120)
    own, named, lru = (
        simulate_sage(workload, "mru", 240, preemption_order=order).result.to_dict()
        for order in ("policy", "mru", "lru")
    )
    assert own["preemptions"] > 0
    assert without_timings(named) == without_timings(own)
    assert lru["preemptions"] != own["preemptions"]


def test_a_bad_order_is_refused_before_the_simulator_runs() -> None:
    with pytest.raises(ValueError, match="unknown preemption order 'nope'"):
        run_row(_mooncake(2), "lru", 240, preemption_order="nope")
    with pytest.raises(ValueError, match="needs the radix model"):
        run_row(_mooncake(2), "lru", 240, cache_model="flat", preemption_order="lru")


def test_a_bad_order_on_the_command_line_is_one_line_and_exit_2(tmp_path: Any) -> None:
    env = {**os.environ, "SAGE_HOME": str(tmp_path)}
    for args, message in (
        (
            ["--preemption-order", "nope"],
            "Error: --preemption-order: unknown preemption order 'nope'; known: policy",
        ),
        (
            ["--preemption-order", "lru", "--cache-model", "flat"],
            "needs --cache-model radix or sage, not --cache-model flat",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "sage_cli", "llm", "benchmark", "--requests", "2", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow  # the engine's CLI imports torch before it reads its options (~5 s)
def test_a_bad_engine_order_is_one_line_and_exit_2(tmp_path: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "engine", "start", "--preemption-order", "nope"],
        capture_output=True,
        text=True,
        env={**os.environ, "SAGE_HOME": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "Error: --preemption-order: unknown preemption order 'nope'; known: policy, "
        + ", ".join(sorted(ORDERS))
    )
