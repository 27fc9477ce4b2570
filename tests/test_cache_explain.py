"""Explained evictions in the cache manager, the tree snapshot and the pool breakdown (no engine).

- With `explain=True` every evict event carries a record: the victim's values are the policy's
  explanation at that moment, the candidates it was preferred to rank after it, and every
  skipped block is one that was not evictable (pinned, in use, or a shared prefix) and ranks
  before it, with the right reason. The victims are the same as with explanation off.
- With it off, the evict events carry no ``explain`` key (nothing else changes).
- `tree_snapshot` is bounded by `depth` and `max_nodes`, and conserves blocks: the blocks of the
  shown nodes plus every ``hidden`` count equal the cached blocks (hypothesis, random prefixes).
  Ghosts obey the same bounds and every evicted block not cached again is shown or counted in
  ``hidden_ghosts`` once (issue 28); a picture of 2,000 nodes side by side stays 3,840 px.
- `usage()` counts every used block once, by tenant and by priority class.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.explain import jsonable
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tree import MAX_GHOSTS, tree_snapshot


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


BS = 4


def make(policy: str = "lru", num_blocks: int = 16, explain: bool = True) -> CacheManager:
    return CacheManager(BlockAllocator(num_blocks, BS), policy=policy, clock=Clock(), explain=explain)


def tokens(seed: int, n: int) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def _fill(m: CacheManager) -> None:
    """Three finished prompts sharing a 2-block prefix, one pinned prefix, one running sequence."""
    shared = tokens(0, 2 * BS)
    for sid in (1, 2, 3):
        prompt = shared + tokens(sid, 2 * BS)
        m.allocate(CacheRequest(sid, prompt, tenant=f"t{sid % 2}", priority=sid % 3))
        m.free_sequence(sid, prompt)
    pinned = tokens(7, 2 * BS)
    m.allocate(CacheRequest(7, pinned))
    m.free_sequence(7, pinned)
    m.pin(pinned)
    m.allocate(CacheRequest(8, shared + tokens(8, BS)))  # running: holds the shared prefix


def _evict_events(m: CacheManager) -> list[dict[str, Any]]:
    assert m.events is not None
    return [e for e in m.events.tail() if e["event"] == "evict"]


@pytest.mark.parametrize("policy", ["lru", "lfu", "gdsf", "priority", "arc", "s3fifo"])
def test_each_victim_says_why(policy: str) -> None:
    m = make(policy)
    _fill(m)
    m.evict(6, reason="manual")
    events = _evict_events(m)
    assert events
    for event in events:
        why = event["explain"]
        json.dumps(why, allow_nan=False)  # strict JSON
        values = why["values"]
        assert values["policy"] == policy and values["evictable"] is True
        assert why["ranks_by"] == m.policy.explains_by
        rank = values.get("rank")
        for candidate in why["preferred_to"]:
            if rank is not None:
                assert candidate["values"]["rank"] > rank
            else:
                assert candidate["values"]["order"] > values["order"]
        for skipped in why["skipped"]:
            assert rank is not None and skipped["rank"] < rank
            assert any(word in skipped["why"] for word in ("pinned", "in use", "shared prefix"))
        counts = why["skipped_counts"]
        assert set(counts) == {"pinned", "referenced", "shared"}
        assert counts["pinned"] >= 2  # the pinned prefix's blocks are never evictable
        assert counts["referenced"] >= 2  # the running sequence's shared prefix
    m.check_invariants()


def test_skipped_blocks_name_their_reason_under_fifo() -> None:
    """FIFO: the shared prefix, inserted first, is held by the running sequence; the next block
    is the parent of the oldest leaf. Both would go before the victim and are skipped, each
    with its reason; the victim is that leaf."""
    m = make("fifo")
    _fill(m)
    m.evict(1)
    [event] = _evict_events(m)
    why = event["explain"]
    reasons = [s["why"] for s in why["skipped"]]
    assert reasons == [
        "in use by 1 running sequence",
        "in use by 1 running sequence",
        "a shared prefix of 1 cached block",
    ]
    assert why["skipped_before"] == 3
    assert why["values"]["rank"] == [4]  # the 4th block inserted: seq 1's last


def test_same_victims_with_explanation_off_and_no_explain_key() -> None:
    on, off = make(explain=True), make(explain=False)
    for m in (on, off):
        _fill(m)
        m.evict(5)
    assert [e["block"] for e in _evict_events(on)] == [e["block"] for e in _evict_events(off)]
    assert all("explain" not in e for e in _evict_events(off))
    assert all({"parent", "depth"} <= set(e) for e in _evict_events(off))


@given(
    policy=st.sampled_from(["lru", "mru", "lfu", "gdsf", "priority", "slo", "arc", "sieve", "mq"]),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=2, max_size=10),
    pin=st.integers(0, 9),
    running=st.integers(0, 9),
    n=st.integers(1, 12),
)
def test_explained_evictions_over_random_caches(
    policy: str, prompts: list[list[int]], pin: int, running: int, n: int
) -> None:
    """Random prefix trees, a pinned prompt and a running one: explanation on and off evict
    the same blocks, and every record's comparisons hold."""
    managers = [make(policy, num_blocks=48, explain=flag) for flag in (True, False)]
    for m in managers:
        for sid, shape in enumerate(prompts, start=1):
            ids = [t for kind in shape for t in tokens(kind * 10 + sid % 3, BS)]
            m.allocate(CacheRequest(sid, ids, priority=sid % 3))
            m.free_sequence(sid, ids)
        chosen = prompts[pin % len(prompts)]
        m.pin([t for kind in chosen for t in tokens(kind * 10 + (pin % len(prompts) + 1) % 3, BS)])
        shape = prompts[running % len(prompts)]
        ids = [t for kind in shape for t in tokens(kind * 10 + (running % len(prompts) + 1) % 3, BS)]
        m.allocate(CacheRequest(99, ids))
        m.evict(n)
        m.check_invariants()
    on, off = (_evict_events(m) for m in managers)
    assert [e["block"] for e in on] == [e["block"] for e in off]
    for event in on:
        why = event["explain"]
        assert "note" not in why["values"], why  # the explained next victim was the victim
        rank = why["values"].get("rank")
        for candidate in why["preferred_to"]:
            key = "rank" if rank is not None else "order"
            assert candidate["values"][key] > why["values"][key]
        assert all(rank is not None and s["rank"] < rank for s in why["skipped"])
        assert why["skipped_before"] <= sum(why["skipped_counts"].values())


def test_jsonable_makes_strict_json() -> None:
    value = {"rank": (float("inf"), -float("inf"), 1), "x": float("nan"), "k": object()}
    out = jsonable(value)
    assert out["rank"] == ["inf", "-inf", 1] and out["x"] == "nan" and isinstance(out["k"], str)
    json.dumps(out, allow_nan=False)


# ---- the tree -------------------------------------------------------------------------------------


def _blocks_in(nodes: list[dict[str, Any]]) -> tuple[int, int]:
    """(blocks shown, blocks hidden) below these nodes (ghosts excluded)."""
    shown = hidden = 0
    for node in nodes:
        if node.get("ghost"):
            continue
        shown += node["blocks"]
        hidden += node["hidden"]["blocks"]
        s, h = _blocks_in(node["children"])
        shown, hidden = shown + s, hidden + h
    return shown, hidden


@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1, max_size=12),
    depth=st.integers(1, 5),
    max_nodes=st.integers(1, 12),
)
def test_tree_is_bounded_and_conserves_blocks(prompts: list[list[int]], depth: int, max_nodes: int) -> None:
    """Prompts made of 3 kinds of block share prefixes in every way; whatever is cut is counted."""
    m = make(num_blocks=64, explain=False)
    for sid, shape in enumerate(prompts, start=1):
        ids = [t for kind in shape for t in tokens(kind, BS)]
        m.allocate(CacheRequest(sid, ids))
        m.free_sequence(sid, ids)
    tree = tree_snapshot(m.radix, block_size=BS, depth=depth, max_nodes=max_nodes)
    assert tree["shown_nodes"] <= max_nodes
    shown, hidden = _blocks_in(tree["roots"])
    assert shown + hidden + tree["hidden"]["blocks"] == len(m.radix) == tree["cached_blocks"]

    def deepest(nodes: list[dict[str, Any]]) -> int:
        return max((1 + deepest(n["children"]) for n in nodes if not n.get("ghost")), default=0)

    assert deepest(tree["roots"]) <= depth
    assert tree["truncated"] == (hidden + tree["hidden"]["blocks"] > 0)


def test_tree_nodes_and_ghosts() -> None:
    m = make(num_blocks=16, explain=False)
    _fill(m)
    m.evict(3)
    assert m.events is not None
    tree = tree_snapshot(m.radix, block_size=BS, depth=8, max_nodes=50, evicted=m.events.tail())
    assert tree["ghost_blocks"] >= 1

    def walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for n in nodes:
            out.append(n)
            out += walk(n["children"]) + walk(n.get("ghosts", []))
        return out

    nodes = walk(tree["roots"])
    ghosts = [n for n in nodes if n.get("ghost")]
    live = [n for n in nodes if not n.get("ghost")]
    assert len(ghosts) == tree["ghost_blocks"]
    assert any(n["pinned"] for n in live) and any(n["ref_count"] for n in live)
    for n in live:
        start, end = n["tokens"]
        assert end - start == n["blocks"] * BS
    with pytest.raises(ValueError, match="depth"):
        tree_snapshot(m.radix, block_size=BS, depth=0)
    with pytest.raises(ValueError, match="max_nodes"):
        tree_snapshot(m.radix, block_size=BS, max_nodes=10**6)


def test_usage_counts_every_used_block_once() -> None:
    m = make(num_blocks=32, explain=False)
    _fill(m)
    usage = m.usage()
    assert sum(usage["by_tenant"].values()) == usage["used_blocks"] == m.allocator.num_used
    assert sum(usage["by_class"].values()) == usage["used_blocks"]
    assert set(usage["by_class"]) <= {"low", "normal", "high"}
    assert {"t0", "t1", "-"} <= set(usage["by_tenant"])


# ---- ghosts within the tree's bounds (issue 28, item 12) ----------------------------------------


def _levels(nodes: list[dict[str, Any]], level: int = 1) -> list[tuple[int, dict[str, Any]]]:
    """(level, node) of every node and ghost shown, a ghost one level below what it hangs from."""
    out = []
    for node in nodes:
        out.append((level, node))
        out += _levels(node["children"], level + 1) + _levels(node.get("ghosts", []), level + 1)
    return out


def _hidden_ghosts(tree: dict[str, Any]) -> int:
    return tree["hidden_ghosts"] + sum(n.get("hidden_ghosts", 0) for _, n in _levels(tree["roots"]))


def test_a_chain_of_evicted_blocks_is_cut_at_the_depth() -> None:
    """A 20-block prompt evicted whole leaves a chain of 20 ghosts, each the parent of the next;
    before issue 28 the tree drew all 20 levels whatever --depth said."""
    m = make(num_blocks=32, explain=False)
    prompt = tokens(5, 20 * BS)
    m.allocate(CacheRequest(1, prompt))
    m.free_sequence(1, prompt)
    m.evict(20)
    assert m.events is not None
    tree = tree_snapshot(m.radix, block_size=BS, depth=3, max_nodes=50, evicted=m.events.tail())
    shown = _levels(tree["roots"])
    assert [level for level, _ in shown] == [1, 2, 3] and all(n.get("ghost") for _, n in shown)
    assert tree["ghost_blocks"] == 3 and _hidden_ghosts(tree) == 17
    assert shown[-1][1]["hidden_ghosts"] == 17  # counted below the deepest ghost shown
    full = tree_snapshot(m.radix, block_size=BS, depth=64, max_nodes=50, evicted=m.events.tail())
    assert full["ghost_blocks"] == 20 and _hidden_ghosts(full) == 0
    tight = tree_snapshot(m.radix, block_size=BS, depth=64, max_nodes=5, evicted=m.events.tail())
    assert tight["ghost_blocks"] == 5 and _hidden_ghosts(tight) == 15


@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=10),
    evict=st.integers(0, 40),
    depth=st.integers(1, 6),
    max_nodes=st.integers(1, 15),
)
def test_ghosts_and_nodes_stay_within_depth_and_max_nodes(
    prompts: list[list[int]], evict: int, depth: int, max_nodes: int
) -> None:
    m = make(num_blocks=64, explain=False)
    for sid, shape in enumerate(prompts, start=1):
        ids = [t for kind in shape for t in tokens(kind, BS)]
        m.allocate(CacheRequest(sid, ids))
        m.free_sequence(sid, ids)
    m.evict(min(evict, m.num_cached_blocks))
    assert m.events is not None
    events = m.events.tail()
    tree = tree_snapshot(m.radix, block_size=BS, depth=depth, max_nodes=max_nodes, evicted=events)
    shown = _levels(tree["roots"])
    assert all(level <= depth for level, _ in shown)
    ghosts = [n for _, n in shown if n.get("ghost")]
    assert len(ghosts) == tree["ghost_blocks"]
    assert tree["shown_nodes"] + tree["ghost_blocks"] <= max_nodes
    # Every evicted block not cached again (the latest 64) is shown or counted, once.
    evicted = {e["block"] for e in events if e["event"] == "evict"}
    cached = {format_block_key(b.key) for b in m.radix.blocks()}
    assert tree["ghost_blocks"] + _hidden_ghosts(tree) == min(len(evicted - cached), MAX_GHOSTS)


def test_the_picture_of_a_wide_tree_is_bounded(tmp_path: Any) -> None:
    """--png of 2,000 nodes side by side: Graphviz scales it into 3,840 pixels a side."""
    import struct

    from sage_cli.eviction.views import PNG_DPI, PNG_MAX_INCHES, tree_dot

    node = {"tokens": [0, 16], "blocks": 1, "hits": 0, "ref_count": 0, "children": [], "id": "ab" * 8}
    tree = {"cached_blocks": 2000, "policy": "lru", "roots": [dict(node) for _ in range(2000)]}
    png = tree_dot(tree).pipe(format="png")
    width, height = struct.unpack(">II", png[16:24])
    assert max(width, height) <= PNG_MAX_INCHES * PNG_DPI == 3840
