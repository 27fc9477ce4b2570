"""The sglang model's queue orders, its retraction to the back of the queue and sage policies
plugged into its tree, without SGLang: orders worked out by hand from SGLang 0.5.23's
schedule_policy.py, and ``--schedule-policy`` through the library and the CLI.
(tests_integration/sglang/test_twin_queue.py holds them against SGLang's own classes.)"""

from __future__ import annotations

import json
import subprocess
from collections import deque
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest
from cli_process import benchmark

from engine_adapter.sim.api import Trace
from engine_adapter.sim.api import simulate as simulate_sweep
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.simulator import Simulator, simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.twins.sglang_model import check_sglang_policy
from engine_adapter.sim.twins.sglang_queue import SCHEDULE_POLICIES, QueueOrder
from engine_adapter.sim.twins.sglang_radix import SGLangRadixTree
from engine_adapter.sim.workloads import SimRequest, Workload
from sage_cli.benchmark.options import SCHEDULE_POLICIES as CLI_SCHEDULE_POLICIES
from sage_eviction.errors import PolicyConfigError


def _queue(prompts: Sequence[Sequence[Hashable]]) -> deque[SimSequence]:
    return deque(
        SimSequence(SimRequest(i, 0.0, tuple(p), len(p), 4), i, 1, None, 0) for i, p in enumerate(prompts)
    )


def _order(
    policy: str, cached: Sequence[Sequence[Hashable]], waiting: Sequence[Sequence[Hashable]]
) -> list[int]:
    tree = SGLangRadixTree(1, "lru")
    for prompt in cached:
        tree.insert(prompt)
    queue = _queue(waiting)
    QueueOrder(tree, policy, 1).order(queue)
    return [seq.sid for seq in queue]


def test_lpm_admits_the_longest_cached_prefix_first_and_keeps_ties_in_order() -> None:
    cached = [list("abcdef"), list("xy")]
    waiting = [list("q"), list("abz"), list("xyz"), list("abcdefg"), list("abcdef")]
    # matched tokens: 0, 2, 2, 6, 6 capped at input_len - 1 = 5
    assert _order("lpm", cached, waiting) == [3, 4, 1, 2, 0]


def test_lpm_holds_back_a_prompt_sharing_32_tokens_with_an_earlier_waiting_one() -> None:
    stem = ["s"] * 32
    waiting = [[*stem, "a"], [*stem, "b"], ["c"], ["d", "e"]]
    assert _order("lpm", [["d"]], waiting) == [3, 0, 2, 1]  # 1 shares 32 tokens with 0: last
    assert _order("lpm", [["d"]], [[*stem[:31], "a"], [*stem[:31], "b"], ["c"], ["d", "e"]]) == [3, 0, 1, 2]


def test_lpm_keeps_arrival_order_past_128_waiting() -> None:
    waiting = [["z", str(i)] for i in range(129)] + [["a", "b"]]
    assert _order("lpm", [["a", "b"]], waiting) == list(range(130))
    assert _order("lpm", [["a", "b"]], waiting[-128:])[0] == 127  # 128 waiting: sorted


def test_dfs_weight_walks_the_heaviest_subtree_first_and_a_nodes_own_requests_after() -> None:
    cached = [list("ab"), list("abc"), list("x")]
    # last nodes: 0 -> "x", 1 -> "c" (under "ab"), 2 -> "ab", 3 -> "c", 4 -> root (no match)
    waiting = [list("xq"), list("abcq"), list("abq"), list("abc"), list("q")]
    assert _order("dfs-weight", cached, waiting) == [1, 3, 2, 0, 4]


def test_fcfs_refreshes_the_waiting_prefixes_under_lru_only() -> None:
    for strategy, refreshed in (("lru", True), ("lfu", False)):
        tree = SGLangRadixTree(1, strategy)
        tree.insert(list("ab"))
        tree.insert(list("cd"))  # "ab" is the older
        QueueOrder(tree, "fcfs", 1).order(_queue([list("abq")]))
        first = tree.evict(1)[0].path()
        assert first == (tuple("cd") if refreshed else tuple("ab")), strategy


def test_unknown_orders_are_refused_and_the_cli_lists_the_models_orders() -> None:
    with pytest.raises(ValueError, match="unknown schedule policy 'hrrn'"):
        QueueOrder(SGLangRadixTree(), "hrrn", 1)
    assert CLI_SCHEDULE_POLICIES == SCHEDULE_POLICIES


def test_a_sage_policy_chooses_the_trees_victims() -> None:
    tree = SGLangRadixTree(1, "sage-fifo")
    for prompt in (list("ab"), list("cd"), list("ae")):  # "ae" splits "ab": a, b, e
        tree.insert(prompt)
    tree.match_prefix(list("ab"))  # FIFO: a hit changes nothing
    assert [n.path() for n in tree.evict(10)] == [tuple("ab"), tuple("cd"), tuple("ae"), ("a",)]
    lru = SGLangRadixTree(1, "sage-lru")
    for prompt in (list("ab"), list("cd")):
        lru.insert(prompt)
    lru.match_prefix(list("ab"))
    assert lru.evict(1)[0].path() == tuple("cd")


def test_sage_policies_that_cannot_run_in_sglang_are_refused() -> None:
    with pytest.raises(PolicyConfigError, match="belady"):
        check_sglang_policy("sage-belady")
    with pytest.raises(PolicyConfigError, match="unknown eviction policy 'nope'"):
        check_sglang_policy("sage-nope")
    with pytest.raises(ValueError, match="unified tree"):
        SGLangRadixTree(1, "sage-lru", flavor="radix_cache")
    check_sglang_policy("sage-s3fifo")  # its capacity: the pool's pages in the model


def test_a_retracted_request_goes_to_the_back_of_sglangs_queue() -> None:
    """One runs, two wait: SGLang appends the retracted one, sage's engine puts it first."""
    workload = Workload(
        [SimRequest(i, 0.0, (f"k{i}",), 16, 8) for i in range(3)], block_size=16, source="test"
    )
    for model, expected in (("sglang", [1, 2, 0]), ("radix", [0, 1, 2])):
        sim = Simulator(workload, "lru", 8, cache_model=model, max_running=1)
        st = sim.start_run()
        sim._arrive(st)
        batch = sim._admit(st)
        (running,) = batch.admitted
        sim._run_steps(st, batch)
        sim._preempt(st, running)
        assert [s.sid for s in st.waiting] == expected, model


def test_the_queue_order_changes_the_sglang_rows_and_only_them() -> None:
    workload = synthetic(requests=300, seed=3, block_size=16)
    rows = {
        p: simulate(workload, "lru", 500, cache_model="sglang", schedule_policy=p) for p in SCHEDULE_POLICIES
    }
    assert len({(r.block_hits, r.evictions) for r in rows.values()}) > 1
    assert {r.block_lookups for r in rows.values()} == {rows["fcfs"].block_lookups}
    with pytest.raises(ValueError, match="needs the sglang model"):
        simulate(workload, "lru", 500, cache_model="radix", schedule_policy="lpm")


def test_the_library_runs_sglang_with_a_sage_policy_and_an_order() -> None:
    trace = Trace.synthetic(requests=120, seed=1, block_size=16)
    results = simulate_sweep(
        trace, policies=["lru", "sage-s3fifo"], capacities=[400], cache_model="sglang", schedule_policy="lpm"
    )
    assert [row["policy"] for row in results.rows] == ["lru", "sage-s3fifo", "unbounded"]
    assert results.settings["schedule_policy"] == "lpm"


def _sage(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return benchmark("--mode", "sim", "--requests", "80", *args, home=tmp)


@pytest.mark.slow
def test_the_cli_takes_sglangs_queue_order_and_refuses_it_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = ["--cache-model", "sglang", "--schedule-policy", "dfs-weight", "--eviction-policies", "sage-lfu"]
    ok = _sage(*args, "--page-size", "32", "--output", str(out), tmp=tmp_path)  # SGLang's name
    assert ok.returncode == 0, ok.stderr
    settings = json.loads(out.read_text())["settings"]
    assert (settings["schedule_policy"], settings["block_size"]) == ("dfs-weight", 32)
    for bad in (("--schedule-policy", "lpm"), ("--cache-model", "sglang", "--schedule-policy", "hrrn")):
        refused = _sage(*bad, "--eviction-policies", "lru", tmp=tmp_path)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert "--schedule-policy" in refused.stderr
