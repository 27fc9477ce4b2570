"""Adaptive policies (arc, slru, s3fifo, sieve, belady) and the flat driver: the orderings each
paper defines, the documented handling of non-evictable entries, and agreement with the
list-based reference models of `reference_models_adaptive.py`."""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

import pytest
from reference_models_adaptive import REFERENCE_MODELS_ADAPTIVE

from sage_eviction import (
    DuplicateKeyError,
    EntryMeta,
    EvictionCandidate,
    EvictionPolicy,
    PolicyParamError,
    PolicyStateError,
    create_policy,
    get_policy_class,
)
from sage_eviction.flat import FlatCache, FlatResult, simulate_flat
from sage_eviction.policies import ARCPolicy, BeladyPolicy, S3FIFOPolicy, SIEVEPolicy, SLRUPolicy

GROUP_B = ["arc", "slru", "s3fifo", "sieve", "belady"]


def _drain(policy: EvictionPolicy) -> list[Hashable]:
    victims: list[Hashable] = []
    while batch := policy.evict(1):
        victims.extend(batch)
    return victims


def _requests(cache: FlatCache, keys: str) -> str:
    """Run one-letter keys through `cache`; returns 'h'/'m' per request."""
    return "".join("h" if cache.request(k) else "m" for k in keys)


# ---- registry ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("arc", ARCPolicy),
        ("slru", SLRUPolicy),
        ("s3fifo", S3FIFOPolicy),
        ("sieve", SIEVEPolicy),
        ("belady", BeladyPolicy),
    ],
)
def test_registered_with_honest_flags(name: str, cls: type[EvictionPolicy]) -> None:
    assert get_policy_class(name) is cls
    assert cls.name == name
    assert cls.strategy.value == name
    assert cls.paper
    assert cls.offline is (name == "belady")
    assert cls.needs_capacity is (name in ("arc", "s3fifo"))
    assert get_policy_class("s3-fifo") is S3FIFOPolicy
    assert get_policy_class("opt") is BeladyPolicy


def test_params_parse_and_validate() -> None:
    slru = create_policy("slru:protected_threshold=3")
    assert isinstance(slru, SLRUPolicy)
    assert (slru.protected_threshold, slru.protected_capacity) == (3, None)
    slru = create_policy("slru:protected_ratio=0.5", capacity=10)
    assert isinstance(slru, SLRUPolicy)
    assert slru.protected_capacity == 5
    s3 = create_policy("s3fifo:small_ratio=0.2,move_threshold=1", capacity=50)
    assert isinstance(s3, S3FIFOPolicy)
    assert (s3.small_ratio, s3.ghost_ratio, s3.move_threshold) == (0.2, 0.9, 1)
    for bad in ("slru:protected_threshold=0", "slru:protected_ratio=1.5", "s3fifo:small_ratio=1"):
        with pytest.raises(PolicyParamError):
            create_policy(bad, capacity=10)
    for needs in ("arc", "s3fifo"):
        with pytest.raises(PolicyParamError, match="capacity"):
            create_policy(needs)


# ---- ARC -----------------------------------------------------------------------------------


def test_arc_scan_does_not_flush_frequently_used_blocks() -> None:
    hot = "abcde"
    scan = [f"scan{i}" for i in range(200)]
    results = {}
    for name in ("arc", "lru"):
        cache = FlatCache(name, capacity=10)
        for _ in range(3):
            for key in hot:
                cache.request(key)
        for key in scan:
            assert not cache.request(key)
        results[name] = [cache.request(key) for key in hot]
    assert results["arc"] == [True] * 5  # T2 held them while the scan went through T1
    assert results["lru"] == [False] * 5


def test_arc_p_grows_on_a_b1_ghost_hit_and_shrinks_on_a_b2_ghost_hit() -> None:
    cache = FlatCache("arc", capacity=4)
    arc = cache.policy
    assert isinstance(arc, ARCPolicy)
    assert _requests(cache, "abcda") == "mmmmh"  # a moves to T2
    cache.request("e")  # REPLACE: |T1| = 3 > p = 0, so b (T1's LRU) becomes a B1 ghost
    assert (arc.list_of("b"), arc.p, arc.list_sizes()) == ("B1", 0.0, (3, 1, 1, 0))
    assert not cache.request("b")  # ghost hit in B1: p += max(|B2| / |B1|, 1) = 1
    assert (arc.list_of("b"), arc.p) == ("T2", 1.0)
    assert arc.list_of("c") == "B1"  # |T1| = 3 > p = 1: c demoted
    assert not cache.request("c")  # B1 again: p = 2, and |T1| = 2 <= p, so T2's LRU goes
    assert (arc.p, arc.list_of("a")) == (2.0, "B2")
    assert arc.list_sizes() == (2, 2, 0, 1)
    assert not cache.request("a")  # ghost hit in B2: p -= max(|B1| / |B2|, 1) = 1
    assert (arc.p, arc.list_of("a")) == (1.0, "T2")
    assert arc.list_of("d") == "B1"  # |T1| = 2 > p = 1


def test_arc_adaptation_steps_follow_the_ghost_list_ratio() -> None:
    rng = random.Random(5)
    cache = FlatCache("arc", capacity=50)
    arc = cache.policy
    assert isinstance(arc, ARCPolicy)
    grew = shrank = 0
    for _ in range(20_000):
        key = int(rng.paretovariate(0.8)) % 400
        where, p, (_, _, b1, b2) = arc.list_of(key), arc.p, arc.list_sizes()
        cache.request(key)
        if where == "B1":
            assert arc.p == min(p + max(b2 / b1, 1.0), 50.0)
            grew += 1
        elif where == "B2":
            assert arc.p == max(p - max(b1 / b2, 1.0), 0.0)
            shrank += 1
        n1, n2, b1, b2 = arc.list_sizes()
        assert n1 + n2 <= 50
        assert n1 + b1 <= 50
        assert n1 + n2 + b1 + b2 <= 100
        assert 0.0 <= arc.p <= 50.0
    assert grew > 50
    assert shrank > 50


def test_arc_pinned_entries_count_but_are_never_chosen_and_relink_at_mru() -> None:
    arc = ARCPolicy(capacity=4)
    arc.insert("a", evictable=False)
    for key in "bcd":
        arc.insert(key)
    arc.access("a", now=1.0)  # a hit moves the pinned a to T2 (in the accounting)
    assert arc.list_of("a") == "T2"
    assert arc.list_sizes() == (3, 1, 0, 0)
    assert arc.evict(1) == ["b"]
    arc.set_evictable("c", False)
    assert arc.evict(1) == ["d"]  # c is pinned: T1's LRU evictable entry is d
    arc.set_evictable("a", True)
    assert arc.evict(5) == ["a"]  # c still pinned; T1 has nothing evictable so T2 gives a
    arc.set_evictable("c", True)
    assert arc.evict(1) == ["c"]
    assert arc.list_sizes() == (0, 0, 3, 1)


def test_arc_evicts_when_it_holds_fewer_than_capacity() -> None:
    arc = ARCPolicy(capacity=100)
    for key in range(5):
        arc.insert(key)
    arc.access(0, now=1.0)
    arc.access(1, now=2.0)
    # |T1| = 3 > p = 0: T1's LRU entries go first, then T2's
    assert arc.evict(10) == [2, 3, 4, 0, 1]
    assert [arc.list_of(k) for k in range(5)] == ["B2", "B2", "B1", "B1", "B1"]
    arc.insert(2)  # a ghost hit without prepare_insert: p adapts at insert
    assert (arc.list_of(2), arc.p) == ("T2", 1.0)


def test_arc_prepare_insert_rejects_a_held_key() -> None:
    arc = ARCPolicy(capacity=4)
    arc.insert("a")
    with pytest.raises(DuplicateKeyError):
        arc.prepare_insert("a")


# ---- S3-FIFO -------------------------------------------------------------------------------


def _s3fifo_cache(capacity: int = 20) -> tuple[FlatCache, S3FIFOPolicy]:
    cache = FlatCache("s3fifo", capacity=capacity)
    assert isinstance(cache.policy, S3FIFOPolicy)
    return cache, cache.policy


def test_s3fifo_warm_up_fills_small_then_main() -> None:
    cache, s3 = _s3fifo_cache(20)  # small 2, main 18, ghost 18
    for key in range(20):
        cache.request(key)
    assert [s3.queue_of(k) for k in (0, 1, 2, 19)] == ["small", "small", "main", "main"]
    assert s3.queue_sizes() == (2, 18, 0)


def test_s3fifo_one_hit_wonders_leave_from_the_small_queue_and_ghosts_go_to_main() -> None:
    cache, s3 = _s3fifo_cache(20)
    for key in range(20):
        cache.request(key)
    for key in (100, 101, 102):
        cache.request(key)
    # each miss evicted the small queue's tail (freq 0) into the ghost queue
    assert [s3.queue_of(k) for k in (0, 1, 100)] == ["ghost", "ghost", "ghost"]
    assert all(s3.queue_of(k) == "main" for k in range(2, 20))
    assert not cache.request(0)  # a ghost hit is admitted to main
    assert s3.queue_of(0) == "main"
    assert s3.frequency(0) == 0


def test_s3fifo_small_entries_hit_twice_move_to_main() -> None:
    cache, s3 = _s3fifo_cache(20)
    for key in range(20):
        cache.request(key)
    cache.request(100)  # evicts 0; small = [1, 100]
    for _ in range(2):
        assert cache.request(1)
    assert s3.frequency(1) == 2
    cache.request(101)  # 1 has freq 2 >= move_threshold: to main (freq 0); 100 is evicted
    assert (s3.queue_of(1), s3.frequency(1), s3.queue_of(100)) == ("main", 0, "ghost")


def test_s3fifo_main_is_a_clock_with_a_frequency_capped_at_3() -> None:
    s3 = S3FIFOPolicy(capacity=20)
    for key in range(20):
        s3.insert(key)
    for _ in range(5):
        s3.access(2, now=1.0)
    s3.access(3, now=1.0)
    assert (s3.frequency(2), s3.frequency(3)) == (3, 1)
    s3.remove(0)
    s3.remove(1)  # small is empty now: evictions come from main
    assert s3.evict(1) == [4]  # 2 and 3 were reinserted at the head with freq - 1
    assert (s3.frequency(2), s3.frequency(3)) == (2, 0)
    assert s3.evict(16) == [*range(5, 20), 3]
    assert s3.evict(1) == [2]


def test_s3fifo_pinned_entries_count_and_keep_their_frequency() -> None:
    s3 = S3FIFOPolicy(capacity=20)
    for key in range(20):
        s3.insert(key, evictable=key != 0)
    s3.access(0, now=1.0)
    s3.access(0, now=2.0)
    assert s3.evict(1) == [1]  # 0 is pinned; the small queue's next entry goes
    s3.set_evictable(0, True)  # linked at the head of small, frequency 2 kept
    assert s3.evict(1) == [2]  # small held only 0 (freq 2): moved to main, main evicted
    assert (s3.queue_of(0), s3.frequency(0)) == ("main", 0)


def test_s3fifo_prepare_insert_keeps_the_ghost_from_being_pushed_out() -> None:
    s3 = S3FIFOPolicy(capacity=20, ghost_ratio=0.05)  # a ghost queue of one key
    for key in range(20):
        s3.insert(key)
    assert s3.evict(1) == [0]
    assert s3.queue_of(0) == "ghost"
    s3.prepare_insert(0)  # 0 leaves the ghost queue first
    assert s3.evict(1) == [1]  # 1 takes the only ghost slot
    s3.insert(0)
    assert s3.queue_of(0) == "main"
    assert s3.queue_of(1) == "ghost"


# ---- SIEVE ---------------------------------------------------------------------------------


def test_sieve_hand_and_visited_bits() -> None:
    sieve = SIEVEPolicy()
    for key in "abcde":
        sieve.insert(key)
    sieve.access("b", now=1.0)
    sieve.access("c", now=1.0)
    assert (sieve.queue(), sieve.hand) == (list("abcde"), None)
    assert sieve.evict(1) == ["a"]  # the tail is unvisited
    assert sieve.hand == "b"
    assert sieve.evict(1) == ["d"]  # b and c lose their bits as the hand passes them
    assert (sieve.visited("b"), sieve.visited("c"), sieve.hand) == (False, False, "e")
    sieve.insert("f")  # new entries enter at the head, behind the hand's path
    sieve.access("e", now=2.0)
    assert sieve.evict(1) == ["f"]  # e is visited (cleared), f is not
    assert sieve.hand is None  # f was the head: the next sweep starts at the tail
    assert sieve.evict(1) == ["b"]
    assert sieve.queue() == ["c", "e"]


def test_sieve_survivors_keep_their_place() -> None:
    sieve = SIEVEPolicy()
    for key in range(6):
        sieve.insert(key)
    for key in (0, 1):
        sieve.access(key, now=1.0)
    assert sieve.evict(1) == [2]
    sieve.insert(6)
    assert sieve.queue() == [0, 1, 3, 4, 5, 6]  # no reordering on hits or sweeps


def test_sieve_pinned_entries_leave_the_queue_and_come_back_at_the_head() -> None:
    sieve = SIEVEPolicy()
    for key in "abcd":
        sieve.insert(key)
    assert sieve.evict(1) == ["a"]
    assert sieve.hand == "b"
    sieve.set_evictable("b", False)  # the hand moves on to b's newer neighbour
    assert (sieve.queue(), sieve.hand) == (["c", "d"], "c")
    sieve.access("b", now=1.0)
    sieve.set_evictable("b", True)
    assert sieve.queue() == ["c", "d", "b"]
    assert sieve.visited("b")
    assert _drain(sieve) == ["c", "d", "b"]


# ---- SLRU ----------------------------------------------------------------------------------


def test_slru_promotes_at_the_threshold() -> None:
    slru = create_policy("slru:protected_threshold=3")
    assert isinstance(slru, SLRUPolicy)
    for key in "abc":
        slru.insert(key, EntryMeta())
    for hit in range(1, 4):
        slru.access("a", now=float(hit))
        assert slru.segment_of("a") == ("protected" if hit == 3 else "probationary")
    slru.access("b", now=5.0)  # one hit: moves to the probationary MRU end only
    assert _drain(slru) == ["c", "b", "a"]  # probationary LRU first, protected last


def test_slru_protected_overflow_demotes_to_the_probationary_mru_end() -> None:
    slru = SLRUPolicy(capacity=5, protected_threshold=1, protected_ratio=0.4)  # 2 protected
    for key in "abcde":
        slru.insert(key)
    for key in "abc":
        slru.access(key, now=1.0)
    assert [slru.segment_of(k) for k in "abc"] == ["probationary", "protected", "protected"]
    assert _drain(slru) == ["d", "e", "a", "b", "c"]


def test_slru_demoted_blocks_are_promoted_again_by_their_next_hit() -> None:
    slru = SLRUPolicy(capacity=4, protected_threshold=2, protected_ratio=0.25)  # 1 protected
    for key in "ab":
        slru.insert(key)
    for key in "abab":
        slru.access(key, now=1.0)
    assert (slru.segment_of("a"), slru.segment_of("b")) == ("probationary", "protected")
    slru.access("a", now=2.0)  # hits 3 >= 2: protected again, b demoted
    assert (slru.segment_of("a"), slru.segment_of("b")) == ("protected", "probationary")


def test_slru_without_capacity_has_an_unbounded_protected_segment() -> None:
    slru = SLRUPolicy(protected_threshold=1)
    for key in range(100):
        slru.insert(key)
        slru.access(key, now=float(key))
    assert all(slru.segment_of(k) == "protected" for k in range(100))


def test_slru_pinned_protected_blocks_fill_the_protected_segment() -> None:
    slru = SLRUPolicy(capacity=4, protected_threshold=1, protected_ratio=0.5)  # 2 protected
    for key in "abcd":
        slru.insert(key, evictable=key in "cd")
    slru.access("a", now=1.0)
    slru.access("b", now=1.0)  # pinned, promoted: the protected segment is full
    slru.access("c", now=1.0)  # promoted, then demoted at once: nothing else to demote
    assert slru.segment_of("c") == "probationary"
    assert _drain(slru) == ["d", "c"]


# ---- Belady --------------------------------------------------------------------------------


def test_belady_evicts_the_entry_used_farthest_in_the_future() -> None:
    future = list("abcdabcab")
    result = simulate_flat(future, "belady", capacity=3)
    # d misses with a, b, c held (next uses 4, 5, 6): c goes; then a b hit, c misses...
    assert (result.misses, result.hits) == (5, 4)
    belady = BeladyPolicy()
    belady.set_future(future)
    for key in "abc":
        belady.insert(key)
    assert [belady.next_use(k) for k in "abc"] == [4, 5, 6]
    assert belady.evict(1) == ["c"]
    belady.insert("d")
    assert belady.next_use("d") is None
    assert belady.evict(1) == ["d"]  # never used again: first out


def test_belady_evicts_entries_never_used_again_first_in_insertion_order() -> None:
    belady = BeladyPolicy()
    belady.set_future(list("abcda"))
    for key in "abcd":
        belady.insert(key)
    assert belady.evict(3) == ["b", "c", "d"]


def test_belady_raises_when_the_calls_diverge_from_the_future() -> None:
    belady = BeladyPolicy()
    with pytest.raises(PolicyStateError, match="set_future"):
        belady.insert("a")
    belady.set_future(["a", "b"])
    belady.insert("a")
    with pytest.raises(PolicyStateError, match="position 1: expected key 'b', got 'c'"):
        belady.insert("c")
    assert "c" not in belady
    belady.insert("b")
    with pytest.raises(PolicyStateError, match="past the end"):
        belady.access("a", now=1.0)


def test_belady_lenient_mode_skips_ahead_and_refreshes_next_uses() -> None:
    belady = BeladyPolicy()
    belady.set_future(list("abacba"), strict=False)
    belady.insert("a")  # position 0, next use 2
    belady.insert("b")  # position 1, next use 4
    belady.insert("c")  # skips position 2: a's next use becomes 5
    assert belady.position == 4
    assert (belady.next_use("a"), belady.next_use("b"), belady.next_use("c")) == (5, 4, None)
    assert belady.evict(3) == ["c", "a", "b"]
    with pytest.raises(PolicyStateError, match="does not occur"):
        belady.insert("c")


def test_belady_is_optimal_on_a_random_trace() -> None:
    rng = random.Random(11)
    keys = [int(rng.paretovariate(1.0)) % 300 for _ in range(5000)]
    best = simulate_flat(keys, "belady", capacity=40).misses
    for name in ("lru", "arc", "slru", "s3fifo", "sieve"):
        assert best <= simulate_flat(keys, name, capacity=40).misses


def test_belady_set_future_after_from_entries() -> None:
    old = BeladyPolicy()
    old.set_future(list("abc"))
    for key in "abc":
        old.insert(key)
    new = BeladyPolicy.from_entries(old.entries())
    new.set_future(list("bad"))
    assert (new.next_use("a"), new.next_use("b"), new.next_use("c")) == (1, 0, None)
    assert new.evict(3) == ["c", "a", "b"]


# ---- non-evictable entries, against the reference models ------------------------------------


def _evict_both(
    policy: EvictionPolicy, model: Any, evictable: dict[Hashable, bool], seed: int
) -> list[Hashable]:
    got = policy.evict(1)
    want = model.evict_one()
    assert got == ([] if want is None else [want]), f"seed {seed}"
    for key in got:
        assert evictable.pop(key) is True, f"seed {seed}: pinned {key} evicted"
    return got


@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS_ADAPTIVE))
@pytest.mark.parametrize("capacity", [3, 8, 20])
def test_policy_matches_its_reference_model(name: str, capacity: int) -> None:
    """Random inserts, hits, pins, unpins, removals and evictions (with and without
    prepare_insert): every victim equals the model's, and no victim is ever pinned."""
    for seed in range(15):
        rng = random.Random(seed)
        policy = create_policy(name, capacity=capacity)
        model = REFERENCE_MODELS_ADAPTIVE[name](capacity)
        prepare = getattr(policy, "prepare_insert", None)
        evictable: dict[Hashable, bool] = {}

        for step in range(1500):
            key, roll = rng.randrange(3 * capacity), rng.random()
            if key in evictable:
                if roll < 0.5:
                    policy.access(key, now=float(step))
                    model.access(key, float(step))
                elif roll < 0.7:
                    evictable[key] = rng.random() < 0.6
                    policy.set_evictable(key, evictable[key])
                    model.set_evictable(key, evictable[key])
                elif roll < 0.75:
                    policy.remove(key)
                    model.remove(key)
                    del evictable[key]
                else:
                    _evict_both(policy, model, evictable, seed)
                continue
            if prepare is not None and roll < 0.3:
                prepare(key)
                model_prepare = getattr(model, "prepare_insert", None)  # a no-op for policies without ghosts
                if model_prepare is not None:
                    model_prepare(key)
            while len(policy) >= capacity and _evict_both(policy, model, evictable, seed):
                pass
            evictable[key] = rng.random() < 0.8
            policy.insert(key, EntryMeta(), evictable=evictable[key])
            model.insert(key, EntryMeta(), evictable[key])


@pytest.mark.parametrize("name", ["arc", "slru", "s3fifo", "sieve"])
def test_eviction_order_hook_predicts_the_drain(name: str) -> None:
    for seed in range(10):
        rng = random.Random(seed)
        policy = create_policy(name, capacity=16)
        cache = FlatCache(policy, capacity=16)
        for _ in range(300):
            cache.request(rng.randrange(40))
        for key in rng.sample([k for k in range(40) if k in policy], 4):
            policy.set_evictable(key, False)
        predicted = policy._eviction_order()
        assert _drain(policy) == predicted, f"seed {seed}"


# ---- the module spec's interface -------------------------------------------------------------


@pytest.mark.parametrize("name", ["arc", "slru", "s3fifo", "sieve"])
def test_select_victims_prefers_sequences_seen_once(name: str) -> None:
    candidates = [
        EvictionCandidate(1, [1, 2], last_access_time=1.0, access_count=5, priority=1, is_pinned=False),
        EvictionCandidate(2, [3], last_access_time=9.0, access_count=1, priority=1, is_pinned=False),
        EvictionCandidate(3, [4], last_access_time=5.0, access_count=1, priority=1, is_pinned=True),
        EvictionCandidate(4, [5], last_access_time=2.0, access_count=3, priority=1, is_pinned=False),
    ]
    policy = create_policy(name, capacity=8)
    assert policy.select_victims(candidates, 1) == [2]
    assert policy.select_victims(candidates, 10) == [2, 1, 4]


# ---- the flat driver -----------------------------------------------------------------------


def test_flat_cache_counts_hits_misses_and_evictions() -> None:
    cache = FlatCache("lru", capacity=2)
    assert _requests(cache, "abacb") == "mmhmm"
    result = cache.result()
    assert result == FlatResult("lru", 2, 5, 1, 4, 2)
    assert (result.hit_ratio, result.miss_ratio) == (0.2, 0.8)
    assert len(cache) == 2
    assert "c" in cache
    assert simulate_flat("abacb", "lru", 2) == result


def test_flat_cache_takes_a_spec_with_params_or_an_instance() -> None:
    cache = FlatCache("slru:protected_threshold=1", capacity=3)
    assert isinstance(cache.policy, SLRUPolicy)
    assert cache.policy.protected_threshold == 1
    sieve = SIEVEPolicy()
    assert FlatCache(sieve, capacity=3).policy is sieve
    with pytest.raises(ValueError, match="capacity"):
        FlatCache("lru", capacity=0)
    with pytest.raises(ValueError, match="instance"):
        FlatCache(sieve, capacity=3, protected_threshold=2)


def test_flat_belady_gets_its_future_from_simulate_flat_or_by_hand() -> None:
    keys = list("abcabdabc")
    via_simulate = simulate_flat(keys, "belady", capacity=2)
    belady = BeladyPolicy()
    belady.set_future(keys)
    cache = FlatCache(belady, capacity=2)
    for key in keys:
        cache.request(key)
    assert cache.result() == via_simulate


@pytest.mark.parametrize("name", GROUP_B)
def test_flat_cache_never_holds_more_than_its_capacity(name: str) -> None:
    rng = random.Random(3)
    keys = [rng.randrange(100) for _ in range(2000)]
    policy = create_policy(name, capacity=30)
    if isinstance(policy, BeladyPolicy):
        policy.set_future(keys)
    cache = FlatCache(policy, capacity=30)
    for key in keys:
        cache.request(key)
        assert len(cache) <= 30
    assert cache.result() == simulate_flat(keys, name, 30)
