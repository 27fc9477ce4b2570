"""The cache core's KV tiers (issue 30): demotion, promotion, the disk tier, write-through,
failed moves, prefetch, the host policy's hot swap, stats, events and the tree property.

Each test drives a real `CacheManager` through `tier_oracle.SlotEngine`, which runs the moves
the way the engine does and checks that every cached block holds its own K/V."""

from __future__ import annotations

import itertools

import pytest
from tier_oracle import SlotEngine

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import CacheInvariantError
from engine_adapter.cache.events import TIER_KEYS, EvictionEventLog
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tier_moves import Tier, TierMove
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.cache.tree import tree_snapshot

BS = 2


def make(num_blocks: int = 4, **tier_args: object) -> tuple[CacheManager, SlotEngine]:
    ticks = itertools.count()
    config = TierConfig(**tier_args)  # type: ignore[arg-type]
    m = CacheManager(
        BlockAllocator(num_blocks, BS),
        tiers=config,
        clock=lambda: float(next(ticks)),
        event_log=EvictionEventLog(),
    )
    return m, SlotEngine(m)


def prompt(tag: int, blocks: int = 2) -> list[int]:
    """`blocks` full blocks of tokens unique to `tag`, plus a last token (recomputed)."""
    return [tag * 100 + i for i in range(blocks * BS)] + [0]


def serve(e: SlotEngine, sid: int, tokens: list[int]) -> int:
    """Admit, prefill and finish one request; returns its cached blocks."""
    alloc = e.allocate(CacheRequest(sid, tokens))
    e.free(sid, tokens)
    e.m.check_invariants()
    e.check()
    return alloc.num_cached_blocks


def test_without_tiers_take_moves_is_empty_and_evictions_drop() -> None:
    m, e = make(host_blocks=0)
    assert m.tiers is None
    for sid in range(4):
        serve(e, sid, prompt(sid))
    assert m.take_moves() == [] and m.stats().tiers == ()
    assert serve(e, 9, prompt(0)) == 0  # evicted long ago: gone


def test_evicted_blocks_are_demoted_and_promoted_back_on_a_hit() -> None:
    m, e = make(host_blocks=8)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))  # 3 blocks needed, 1 free: prompt 1's leaf goes to host
    assert serve(e, 3, prompt(1)) == 2  # one block on device, one loaded back from host
    host = m.stats().tiers[0]
    assert host.tier == "host" and host.hits >= 1 and host.promotions >= 1 and host.demotions >= 2
    assert host.blocks_moved_in == host.demotions and host.blocks_moved_out == host.promotions
    assert m.stats().hit_rate > 0


def test_allocation_counts_blocks_loaded_from_each_tier() -> None:
    m, e = make(num_blocks=3, host_blocks=1, disk_blocks=8)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))
    serve(e, 3, prompt(3))  # prompt 1 is now below the device, partly on disk
    alloc = e.allocate(CacheRequest(4, prompt(1)))
    assert alloc.num_cached_blocks == 2
    assert alloc.num_host_blocks + alloc.num_disk_blocks == 2 and alloc.num_disk_blocks >= 1
    e.free(4, prompt(1))
    m.check_invariants()
    e.check()
    disk = m.stats().tiers[1]
    assert disk.tier == "disk" and disk.hits == alloc.num_disk_blocks and disk.demotions >= 1


def test_host_without_disk_drops_leaf_first_and_a_drop_is_a_miss() -> None:
    m, e = make(num_blocks=3, host_blocks=2)
    for sid in range(1, 5):
        serve(e, sid, prompt(sid))
    host = m.stats().tiers[0]
    assert host.drops >= 1 and host.used_blocks <= 2
    assert serve(e, 9, prompt(1)) == 0  # the oldest conversation was dropped from host
    assert m.stats().re_prefill_blocks >= 1  # a dropped block that came back is a re-prefill


def test_write_through_copies_on_commit_and_demotes_without_a_copy() -> None:
    m, e = make(num_blocks=4, host_blocks=8, write_policy="write_through")
    e.allocate(CacheRequest(1, prompt(1)))
    assert m.take_moves() == []
    m.free_sequence(1, prompt(1))
    copies = m.take_moves()
    assert [(mv.src_tier, mv.dst_tier) for mv in copies] == [(Tier.DEVICE, Tier.HOST)] * 2
    for mv in copies:
        e.content[(mv.dst_tier, mv.dst)] = e.content[(mv.src_tier, mv.src)]
    assert m.tier_of(copies[0].key) == (Tier.DEVICE, Tier.HOST)
    serve(e, 2, prompt(2))  # evicts prompt 1's leaf: no copy needed, it is on host already
    assert all(
        mv.src_tier is not Tier.DEVICE or mv.key not in {c.key for c in copies} for mv in m.take_moves()
    )
    assert serve(e, 3, prompt(1)) == 2
    assert m.tier_of(copies[1].key) == (Tier.DEVICE, Tier.HOST)  # promotion keeps the host copy


def test_failed_promotion_is_a_miss_from_the_first_lost_block() -> None:
    m, e = make(num_blocks=3, host_blocks=1, disk_blocks=8)
    for sid in (1, 2, 3):
        serve(e, sid, prompt(sid))
    e.fail = lambda move: move.src_tier is Tier.DISK  # every disk file is corrupt
    alloc = e.allocate(CacheRequest(4, prompt(1)))  # the oracle recomputes from what moves_failed says
    assert alloc.num_disk_blocks >= 1 and e.moves_failed >= 1
    m.check_invariants()
    e.check()
    e.free(4, prompt(1))
    m.check_invariants()
    e.check()


def test_moves_failed_drops_a_copy_below_and_its_descendants() -> None:
    m, e = make(num_blocks=3, host_blocks=8)
    serve(e, 1, prompt(1, blocks=2))
    serve(e, 2, prompt(2, blocks=2))  # prompt 1 demoted to host, both blocks
    tiers = m.tiers
    assert tiers is not None
    below = [k for k, entry in tiers.host.entries.items() if entry.parent_key is None]
    assert below
    root = below[0]
    m.moves_failed([TierMove(Tier.DEVICE, 0, Tier.HOST, tiers.host.entries[root].slot, root)])
    assert tiers.entry(root) is None and not tiers.children_of(root)
    m.check_invariants()
    assert serve(e, 3, prompt(1)) == 0


def test_prefetch_promotes_ahead_and_admission_takes_over_its_lock() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=2)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))
    serve(e, 3, prompt(3))  # prompt 1 is on host now
    queued = CacheRequest(7, prompt(1))
    assert m.prefetch(queued) == 2 and m.prefetch(queued) == 0  # once per request
    e.run_moves()
    m.check_invariants()
    e.check()
    alloc = e.allocate(queued)
    assert alloc.num_cached_blocks == 2 and alloc.num_host_blocks == 0  # already on the device
    m.check_invariants()
    stats = m.stats()
    assert (stats.prefetched_blocks, stats.prefetch_hits) == (2, 2)
    assert m.cancel_prefetch(7) == 0  # admission ended the prefetch


def test_cancel_prefetch_releases_the_blocks() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=1)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))
    serve(e, 3, prompt(3))
    assert m.prefetch(CacheRequest(7, prompt(1))) == 1  # the budget caps it
    e.run_moves()
    assert m.num_available_blocks < 4  # the prefetched block is locked for the queued request
    assert m.cancel_prefetch(7) == 1 and m.cancel_prefetch(7) == 0
    assert m.num_available_blocks == 4  # nothing runs: every block is reclaimable again
    m.check_invariants()
    e.check()


def test_swap_host_policy_keeps_every_entry() -> None:
    m, e = make(num_blocks=3, host_blocks=8)
    for sid in range(1, 4):
        serve(e, sid, prompt(sid))
    used = m.stats().tiers[0].used_blocks
    result = m.swap_host_policy("arc")
    assert result.new_name == "arc" and result.entries == used
    assert m.stats().tiers[0].policy == "arc" and m.stats().tiers[0].policy_swaps == 1
    m.check_invariants()
    for sid in range(4, 8):
        serve(e, sid, prompt(sid))
    with pytest.raises(ValueError, match="no disk tier"):
        m.swap_tier_policy(Tier.DISK, "lru")


def test_tier_events_name_the_tier_and_the_choosing_policy() -> None:
    m, e = make(num_blocks=3, host_blocks=1)
    for sid in range(1, 4):
        serve(e, sid, prompt(sid))
    serve(e, 9, prompt(3))
    assert m.events is not None
    events = [ev for ev in m.events.tail() if ev["event"] in ("demote", "promote", "drop")]
    kinds = {ev["event"] for ev in events}
    assert {"demote", "drop"} <= kinds
    for ev in events:
        assert tuple(ev) == TIER_KEYS
    demote = next(ev for ev in events if ev["event"] == "demote")
    assert demote["tier"] == "device" and demote["to_tier"] == "host" and demote["policy"] == "lru"
    drop = next(ev for ev in events if ev["event"] == "drop")
    assert drop["tier"] == "host" and drop["to_tier"] is None


def test_bad_tier_configs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="write_policy"):
        make(host_blocks=4, write_policy="write_around")
    with pytest.raises(ValueError, match="host_blocks"):
        make(host_blocks=0, disk_blocks=4)
    with pytest.raises(ValueError, match="prefetch"):
        make(host_blocks=4, prefetch_blocks=-1)


def test_the_tree_marks_each_nodes_tier() -> None:
    m, e = make(num_blocks=3, host_blocks=2, disk_blocks=4, write_policy="write_through")
    for sid in range(1, 5):
        serve(e, sid, prompt(sid))
    assert m.events is not None
    tree = tree_snapshot(m.radix, block_size=BS, evicted=m.events.tail(), tiers=m.tiers)
    tiers = m.stats().tiers
    assert tree["tiers"] == {
        "device": len(m.radix),
        "host": tiers[0].used_blocks,
        "disk": tiers[1].used_blocks,
    }
    nodes = [node for node in tree["roots"] if not node.get("ghost") and node["tier"] == "device"]
    assert nodes and sum(node["host_copies"] for node in nodes) >= 1  # write-through copies

    def walk(node: dict[str, object]) -> list[dict[str, object]]:
        found = [node]
        for key in ("below", "children"):
            for child in node.get(key, []):  # type: ignore[attr-defined]
                found += walk(child)
        return found

    shown = [n for root in tree["roots"] for n in walk(root) if n.get("tier") in ("host", "disk")]
    resident = {k for level in m.tiers.levels for k, entry in level.entries.items() if not entry.on_device}  # type: ignore[union-attr]
    assert sum(n["blocks"] for n in shown) + tree["hidden_below"] == len(resident) > 0  # type: ignore[misc]
    # the host holds write-through copies of device blocks (marked on their device nodes); the
    # blocks it demoted to disk are the ones resident only below
    assert tree["below_nodes"] == len(shown) and {n["tier"] for n in shown} == {"disk"}
    ghosts = [n for root in tree["roots"] for n in walk(root) if n.get("ghost")]
    assert all(g["tier"] is None for g in ghosts)  # a ghost is a dropped block now


def test_explain_says_which_tiers_policy_chose() -> None:
    m, e = make(num_blocks=3, host_blocks=1)
    m.explain = True
    for sid in range(1, 4):
        serve(e, sid, prompt(sid))
    assert m.events is not None
    evicts = [ev for ev in m.events.tail() if ev["event"] == "evict"]
    assert evicts and all(ev["explain"]["tier"] == "device" for ev in evicts)
    assert {ev["explain"]["then"] for ev in evicts} <= {"demote", "drop"}
    drops = [ev for ev in m.events.tail() if ev["event"] == "drop" and ev["reason"] == "evict"]
    assert drops and all(ev["explain"]["tier"] == "host" and ev["policy"] == "lru" for ev in drops)
    assert all("rank" in ev["explain"]["values"] or ev["explain"]["values"] for ev in drops)


def test_loading_back_into_full_tiers_drops_at_most_one_host_block() -> None:
    """Both tiers full: each promotion frees its host slot before the next demotion needs one."""
    m, e = make(num_blocks=4, host_blocks=4)
    for sid in range(1, 5):
        serve(e, sid, prompt(sid))
    assert m.num_free_blocks == 1 and m.stats().tiers[0].used_blocks == 4  # host full
    drops = m.stats().tiers[0].drops
    # 3 blocks: 2 loaded back from host, 1 to compute; evicting the 2 missing first would drop 2
    assert serve(e, 9, prompt(2)) == 2
    assert m.stats().tiers[0].drops - drops <= 1


def test_a_block_cached_again_on_the_device_keeps_its_copy_below_as_a_copy() -> None:
    m, e = make(num_blocks=3, host_blocks=8)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))  # prompt 1 is on host now
    tiers = m.tiers
    assert tiers is not None
    below = set(tiers.host.entries)
    e.allocate(CacheRequest(3, prompt(1), match_prefix=False))  # computed again, not loaded
    e.free(3, prompt(1))
    m.check_invariants()
    again = [key for key in below if key in m.radix]
    assert again and all(m.tier_of(key) == (Tier.DEVICE, Tier.HOST) for key in again)


def test_the_tier_invariants_catch_a_broken_store() -> None:
    m, e = make(num_blocks=3, host_blocks=8)
    serve(e, 1, prompt(1))
    serve(e, 2, prompt(2))
    tiers = m.tiers
    assert tiers is not None
    entry = next(iter(tiers.host.entries.values()))
    entry.parent_key, saved = ("nowhere",), entry.parent_key
    with pytest.raises(CacheInvariantError, match="prefix-closed"):
        m.check_invariants()
    entry.parent_key = saved
    entry.on_device = True
    with pytest.raises(CacheInvariantError, match="the device tree disagrees"):
        m.check_invariants()
    entry.on_device = False
    tiers.host.slots.free([entry.slot])
    with pytest.raises(CacheInvariantError, match="host slots"):
        m.check_invariants()


def test_a_failed_load_shared_by_two_sequences_gives_the_second_fresh_blocks() -> None:
    m, e = make(num_blocks=8, host_blocks=8)
    for sid in range(1, 5):
        serve(e, sid, prompt(sid))  # prompt 1 ends up on host
    m.allocate(CacheRequest(10, prompt(1)))
    m.allocate(CacheRequest(11, prompt(1)))  # hits the blocks just loaded for sequence 10
    moves = m.take_moves()
    loads = [mv for mv in moves if mv.dst_tier is Tier.DEVICE]
    assert loads
    kept = m.moves_failed(loads)  # the host copies were unreadable
    assert set(kept) == {10, 11} and kept[10] == kept[11] == 2 - len(loads)
    m.check_invariants()
    first, second = m.block_table(10), m.block_table(11)
    cut = kept[10]
    assert first[:cut] == second[:cut]  # the blocks before the gap stay shared
    assert not set(first[cut:]) & set(second[cut:])  # each recomputes the rest in its own blocks
    assert all(mv.key not in m.radix and m.tier_of(mv.key) == () for mv in loads)  # a miss now


def test_the_tree_bounds_the_nodes_below_the_device() -> None:
    m, e = make(num_blocks=3, host_blocks=2, disk_blocks=4)
    for sid in range(1, 6):
        serve(e, sid, prompt(sid))
    full = tree_snapshot(m.radix, block_size=BS, tiers=m.tiers)
    assert full["below_nodes"] == 3 and full["hidden_below"] == 0
    cut = tree_snapshot(m.radix, block_size=BS, tiers=m.tiers, max_nodes=2)
    assert cut["shown_nodes"] + cut["below_nodes"] == 2
    assert cut["hidden_below"] == 6 - 2 * cut["below_nodes"]  # each below node here is 2 blocks


def test_a_failed_load_whose_block_left_the_tree_drops_the_copy_below() -> None:
    """A load into a device block that left the tree in the same step (a loose prefetch evicted
    again) may have had its garbage demoted back below: the key's copy there is dropped, so a
    later lookup misses instead of reading it (tier_failures.handle_failed_moves)."""
    m, e = make(num_blocks=3, host_blocks=8)
    serve(e, 1, prompt(1, blocks=2))
    serve(e, 2, prompt(2, blocks=2))  # prompt 1 demoted to host
    tiers = m.tiers
    assert tiers is not None
    key = next(k for k, entry in tiers.host.entries.items() if entry.parent_key is None)
    assert key not in m.radix and m.tier_of(key) == (Tier.HOST,)
    # the load's device block holds another key now (or none): the move's block left the tree
    m.moves_failed([TierMove(Tier.HOST, tiers.host.entries[key].slot, Tier.DEVICE, 0, key)])
    assert m.tier_of(key) == ()
    m.check_invariants()
    assert serve(e, 3, prompt(1)) == 0  # a miss, never the copy of a failed load
