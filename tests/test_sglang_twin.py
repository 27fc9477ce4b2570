"""The SGLang twin without SGLang: `SGLangRadixTree`'s golden trees and eviction orders (worked
out by hand from SGLang 0.5.23's radix_cache.py), its invariants under random operations, the
``sglang`` cache model in the simulator, and ``--cache-model sglang`` through the CLI.
(tests_integration/sglang/test_twin.py holds it against SGLang's own class.)"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from cli_process import benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.twins.sglang_model import SGLangModel, parse_sglang_policy
from engine_adapter.sim.twins.sglang_radix import RadixNode, SGLangRadixTree
from engine_adapter.sim.workloads import SimRequest, Workload

# ---------------------------------------------------------------------- the tree


def test_sglangs_own_example_tree_with_its_hit_counts() -> None:
    """radix_cache.py's __main__: five inserts; the second [1,2,3] and the later paths through
    [1,2] count hits on the nodes they pass."""
    tree = SGLangRadixTree()
    for tokens in ([1, 2, 3], [1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 5, 6, 7], [8, 9, 10, 11, 12]):
        tree.insert(tokens)
    assert tree.snapshot() == {
        (1, 2): (0, 4, 0),
        (1, 2, 3): (0, 2, 0),
        (1, 2, 4, 5): (0, 2, 0),
        (1, 2, 4, 5, 6, 7): (0, 1, 0),
        (8, 9, 10, 11, 12): (0, 1, 0),
    }
    assert tree.total_size() == tree.evictable_size == 12
    assert tree.match_prefix([1, 2, 3, 13, 14]).length == 3
    assert tree.match_prefix([1, 2, 4, 9]).length == 3  # splits [4, 5] at [4]
    assert (1, 2, 4) in tree.snapshot() and tree.total_size() == 12


def test_page_granularity_cuts_keys_and_matches_to_whole_pages() -> None:
    tree = SGLangRadixTree(page_size=2)
    assert tree.insert([1, 2, 3, 4, 5]) == 0  # the partial page [5] is not cached
    assert tree.snapshot() == {(1, 2, 3, 4): (0, 1, 0)}
    assert tree.match_prefix([1, 2, 3, 9]).length == 2  # [3, 9] differs inside the page
    assert set(tree.snapshot()) == {(1, 2), (1, 2, 3, 4)}
    assert tree.match_prefix([1]).length == 0  # less than a page: no clock read, no match
    assert tree.insert([1, 2, 3, 9, 7]) == 2
    assert set(tree.snapshot()) == {(1, 2), (1, 2, 3, 4), (1, 2, 3, 9)}


def test_inserted_len_counts_no_second_hit() -> None:
    tree = SGLangRadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 3, 4], inserted_len=3)  # the same request, its output appended
    assert tree.snapshot() == {(1, 2, 3): (0, 1, 0), (1, 2, 3, 4): (0, 1, 0)}


def _victims(policy: str, config: dict[str, Any] | None = None) -> list[tuple[Hashable, ...]]:
    """Three one-page chains A, B, C inserted in order, B inserted again (a hit), A matched
    (accessed last); then the eviction order of all three."""
    tree = SGLangRadixTree(1, policy, config)
    for tokens in ([1, 1], [2, 2], [3, 3], [2, 2]):
        tree.insert(tokens, priority=tokens[0] % 3)
    tree.match_prefix([1, 1])
    return [node.path() for node in tree.evict(6)]


@pytest.mark.parametrize(
    ("policy", "config", "order"),
    [
        ("lru", None, [(3, 3), (2, 2), (1, 1)]),  # access: C, then B's second insert, then A's match
        ("mru", None, [(1, 1), (2, 2), (3, 3)]),
        ("fifo", None, [(1, 1), (2, 2), (3, 3)]),  # creation
        ("filo", None, [(3, 3), (2, 2), (1, 1)]),
        ("lfu", None, [(3, 3), (1, 1), (2, 2)]),  # B has 2 hits; C and A by access time
        ("slru", {"protected_threshold": 2}, [(3, 3), (1, 1), (2, 2)]),
        ("slru", {"protected_threshold": 1}, [(3, 3), (2, 2), (1, 1)]),  # all protected: LRU
        ("priority", None, [(3, 3), (1, 1), (2, 2)]),  # priorities 0, 1, 2
    ],
)
def test_each_strategy_evicts_in_sglangs_order(
    policy: str, config: dict[str, Any] | None, order: list
) -> None:
    assert _victims(policy, config) == order


def test_a_locked_path_is_never_evicted_and_its_parent_follows_its_last_child() -> None:
    tree = SGLangRadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 4])
    tree.insert([5, 6])
    locked = tree.match_prefix([1, 2, 3]).node
    assert tree.inc_lock_ref(locked) == -3 and tree.protected_size == 3
    assert [n.path() for n in tree.evict(100)] == [(1, 2, 4), (5, 6)]
    assert tree.snapshot() == {(1, 2): (1, 2, 0), (1, 2, 3): (1, 1, 0)}  # matches count no hit
    assert tree.dec_lock_ref(locked) == 3
    assert [n.path() for n in tree.evict(1)] == [(1, 2, 3)]  # the leaf first, then its parent
    assert [n.path() for n in tree.evict(1)] == [(1, 2)] and tree.total_size() == 0


@pytest.mark.parametrize(
    ("flavor", "order"),
    [
        ("unified", [(1, 2, 3), (1, 2), (5,)]),  # the split's parent keeps [1, 2, 3]'s creation time
        ("radix_cache", [(1, 2, 3), (5,), (1, 2)]),  # RadixCache's split parent is a new node
    ],
)
def test_the_two_sglang_trees_date_a_split_differently(flavor: str, order: list) -> None:
    tree = SGLangRadixTree(1, "fifo", flavor=flavor)
    tree.insert([1, 2, 3])
    tree.insert([5])
    assert tree.match_prefix([1, 2, 9]).length == 2
    assert [node.path() for node in tree.evict(4)] == order


@pytest.mark.parametrize("flavor", ["unified", "radix_cache"])
def test_a_match_that_splits_a_leaf_refreshes_its_rest(flavor: str) -> None:
    """Both trees give the split-off [3] a time after [5]'s (the unified one a new reading,
    RadixCache the match's), so LRU takes [5] first."""
    tree = SGLangRadixTree(1, "lru", flavor=flavor)
    tree.insert([1, 2, 3])
    tree.insert([5])
    tree.match_prefix([1, 2, 9])
    assert [node.path() for node in tree.evict(1)] == [(5,)]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown SGLang eviction policy 'tlru'"):
        SGLangRadixTree(1, "tlru")
    with pytest.raises(ValueError, match="protected_threshold only"):
        SGLangRadixTree(1, "slru", {"threshold": 2})
    with pytest.raises(ValueError, match="takes no config"):
        SGLangRadixTree(1, "lru", {"x": 1})
    with pytest.raises(ValueError, match="unknown tree 'hicache'"):
        SGLangRadixTree(1, "lru", flavor="hicache")
    with pytest.raises(ValueError, match="page_size=0"):
        SGLangRadixTree(0)
    with pytest.raises(ValueError, match="want name=integer"):
        parse_sglang_policy("slru:protected_threshold=high")
    assert parse_sglang_policy("slru:protected_threshold=3") == ("slru", {"protected_threshold": 3})


def _check_invariants(tree: SGLangRadixTree, locked: Sequence[RadixNode]) -> None:
    sizes = {False: 0, True: 0}
    leaves = set()
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        assert node.key and len(node.key) % tree.page_size == 0
        for first, child in node.children.items():
            assert child.parent is node and tree._child_key(child.key) == first
        sizes[node.lock_ref > 0] += len(node.key)
        if node.lock_ref == 0 and not node.children:
            leaves.add(node)
        stack.extend(node.children.values())
    assert (sizes[False], sizes[True]) == (tree.evictable_size, tree.protected_size)
    assert leaves == set(tree._leaves)
    for node in locked:
        assert node.lock_ref > 0


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "match", "lock", "unlock", "evict"]),
        st.lists(st.integers(0, 2), max_size=12),
    ),
    max_size=50,
)


@settings(max_examples=100, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 2, 3]), policy=st.sampled_from(["lru", "lfu", "fifo", "mru"]))
def test_the_tree_keeps_its_invariants(ops: list[tuple[str, list[int]]], page_size: int, policy: str) -> None:
    """Sizes add up, children are keyed by their first page, the candidates are exactly the
    unlocked childless nodes, a locked node survives every eviction, and an inserted key then
    matches whole (cut to pages)."""
    tree = SGLangRadixTree(page_size, policy)
    locked: list[RadixNode] = []
    for op, tokens in ops:
        if op == "insert":
            tree.insert(tokens)
            assert tree.match_prefix(tokens).length == len(tokens) // page_size * page_size
        elif op == "match":
            assert tree.match_prefix(tokens).length % page_size == 0
        elif op == "lock":
            node = tree.match_prefix(tokens).node
            if node is not tree.root:
                tree.inc_lock_ref(node)
                locked.append(node)
        elif op == "unlock" and locked:
            tree.dec_lock_ref(locked.pop(len(tokens) % len(locked)))
        elif op == "evict":
            before = tree.evictable_size
            freed = sum(len(n.key) for n in tree.evict(len(tokens) + 1))
            assert freed >= min(len(tokens) + 1, before) or tree.evictable_size == 0
        _check_invariants(tree, locked)


# ---------------------------------------------------------------------- the cache model


def _workload(requests: Sequence[tuple[list[Hashable], int]], block_size: int) -> Workload:
    return Workload(
        requests=[
            SimRequest(i, i * 1e6, tuple(keys), len(keys) * block_size, out)
            for i, (keys, out) in enumerate(requests)
        ],
        block_size=block_size,
        source="test",
    )


def test_sglang_keeps_the_last_token_to_compute_where_sage_hits_the_whole_prompt() -> None:
    """One at a time, room for all: a repeated prompt hits all its blocks in sage's radix model,
    all but the last in SGLang's (its match stops at input_len - 1 tokens, cut to pages)."""
    workload = _workload([(["a", "b", "c"], 2), (["a", "b", "d"], 2), (["a", "b", "c"], 2)], block_size=4)
    radix = simulate(workload, "lru", 30, cache_model="radix")
    sglang = simulate(workload, "lru", 30, cache_model="sglang")
    assert (radix.block_hits, sglang.block_hits) == (5, 4)
    assert sglang.block_lookups == radix.block_lookups == 9


def _running(model: SGLangModel, sid: int, keys: list[str], output: int) -> SimSequence:
    seq = SimSequence(SimRequest(sid, 0.0, tuple(keys), len(keys) * 2, output + 1), sid, 2, None, 0)
    assert model.allocate(seq) is not None
    assert model.reserve(seq, seq.tokens + output)
    return seq


def test_retraction_takes_the_fewest_output_tokens_then_the_longest_prompt() -> None:
    model = SGLangModel("lru", 64, 2)
    _running(model, 0, ["a", "b"], output=6)
    _running(model, 1, ["c", "d", "e"], output=2)
    _running(model, 2, ["f"], output=2)
    _running(model, 3, ["g", "h", "i"], output=2)
    assert model.select_victims([]) == [3]  # 2 output tokens, 6-token prompt, latest in the batch
    assert model.select_victims([3]) == [1]
    assert model.select_victims([3, 1]) == [2]
    assert model.select_victims([3, 1, 2, 0]) == []


def test_a_request_that_cannot_fit_is_not_admitted_and_changes_no_pool() -> None:
    model = SGLangModel("lru", 3, 2)
    first = _running(model, 0, ["a", "b"], output=2)  # 2 tree pages and 1 own page: all 3
    pool = (model.tree.snapshot(), model._free_pages())
    big = SimSequence(SimRequest(1, 0.0, ("c", "d"), 4, 2), 1, 2, None, 0)
    assert model.allocate(big) is None  # needs 2 pages, none free and nothing evictable
    assert (model.tree.snapshot(), model._free_pages()) == pool
    model.free(first)
    assert model.allocate(big) == 0 and model.evictions == 2  # 1 free; the node [a, b] evicted whole


@pytest.mark.parametrize("seed", [0, 1])
def test_the_sglang_rows_stay_under_their_unbounded_row(seed: int) -> None:
    workload = synthetic(requests=200, seed=seed, block_size=16)
    unbounded = simulate(workload, "unbounded", cache_model="sglang")
    assert unbounded.evictions == 0 and unbounded.preemptions == 0
    for policy in ("lru", "lfu", "fifo"):
        row = simulate(workload, policy, 400, cache_model="sglang")
        assert row.requests == 200 and row.evictions > 0
        assert row.block_hits <= unbounded.block_hits and row.block_lookups == unbounded.block_lookups


def test_radix_only_options_are_refused_for_sglang() -> None:
    workload = _workload([(["a"], 2)], block_size=4)
    with pytest.raises(ValueError, match="sage's radix model's"):
        simulate(workload, "lru", 8, cache_model="sglang", protect_queued=0.1)
    with pytest.raises(ValueError, match="radix cache model"):
        simulate(workload, "lru", 8, cache_model="sglang", adaptive_batch=True)


# ---------------------------------------------------------------------- the CLI


def _sage(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return benchmark("--mode", "sim", *args, home=tmp)


@pytest.mark.slow
def test_the_cli_runs_the_sglang_model(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = ("--cache-model", "sglang", "--requests", "150", "--capacity-ratio", "0.1,0.3")
    proc = _sage(
        *args, "--eviction-policies", "lru,slru:protected_threshold=3", "--output", str(out), tmp=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["cache_model"] == "sglang"
    rows = result["results"]
    slru = "slru:protected_threshold=3"  # a row is labelled by its whole spec (issue 48, item 3)
    assert [row["policy"] for row in rows] == ["lru", slru, "lru", slru, "unbounded"]  # no Belady
    assert {row["cache_model"] for row in rows} == {"sglang"}
    assert all(row["block_hits"] <= rows[-1]["block_hits"] for row in rows)
    for bad in ("arc", "slru:threshold=3"):
        refused = _sage(*args, "--eviction-policies", bad, tmp=tmp_path)
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "--cache-model sglang" in refused.stderr and "Traceback" not in refused.stderr
