"""Loose prefetch (the engine's, issue 30): a queued request's host-resident prefix loaded back
ahead of time that locks nothing, stays within its limit and the budget, counts its hits per
tier only when the request finds the very blocks it loaded, and is forgotten when cancelled; and
the tiers' load times in the stats. A real `CacheManager` through `tier_oracle.SlotEngine`."""

from __future__ import annotations

from test_tiers import make, prompt, serve

from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tier_moves import Tier


def test_a_loose_prefetch_locks_nothing_and_its_blocks_are_hits_of_their_tier() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=4)
    for sid in (1, 2, 3):
        serve(e, sid, prompt(sid))
    queued = CacheRequest(7, prompt(1))
    assert m.prefetch(queued, hold=False, limit=1) == 1  # the caller's limit caps it
    assert m.prefetch(queued, hold=False) == 1  # a loose prefetch may add to itself
    assert m.prefetch(queued, hold=False) == 0  # nothing left below
    e.run_moves()
    e.check()
    m.check_invariants()
    assert m.num_available_blocks == 4  # nothing locked: the pool may take them back
    alloc = e.allocate(queued)
    assert alloc.num_cached_blocks == 2 and alloc.num_host_blocks == 0  # on the device already
    host = m.stats().tiers[0]
    assert (host.prefetched_blocks, host.prefetch_hits) == (2, 2)
    assert (m.stats().prefetched_blocks, m.stats().prefetch_hits) == (2, 2)
    assert m.cancel_prefetch(7) == 0  # admission ended it


def test_a_loose_prefetch_evicted_before_admission_is_no_hit() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=4)
    for sid in (1, 2, 3):
        serve(e, sid, prompt(sid))
    queued = CacheRequest(7, prompt(1))
    assert m.prefetch(queued, hold=False) == 2
    e.run_moves()
    serve(e, 4, prompt(4))  # the pool takes the prefetched blocks back: they are not locked
    serve(e, 5, prompt(5))
    e.check()
    alloc = e.allocate(queued)
    assert alloc.num_host_blocks == 2  # loaded again at admission, from host
    stats = m.stats()
    assert (stats.prefetched_blocks, stats.prefetch_hits) == (2, 0)
    m.check_invariants()


def test_cancel_forgets_a_loose_prefetch_and_frees_its_budget() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=2)
    for sid in (1, 2, 3):
        serve(e, sid, prompt(sid))
    assert m.prefetch(CacheRequest(7, prompt(1)), hold=False) == 2
    e.run_moves()
    assert m.prefetch(CacheRequest(8, prompt(2)), hold=False) == 0  # the budget is spent
    assert m.cancel_prefetch(7) == 2 and m.cancel_prefetch(7) == 0
    assert m.prefetch(CacheRequest(8, prompt(2)), hold=False) == 2  # and given back
    e.run_moves()
    e.check()
    m.check_invariants()


def test_tier_load_times_give_each_tier_its_quantiles() -> None:
    m, _ = make(num_blocks=4, host_blocks=8)
    assert m.stats().tiers[0].loads == 0 and m.stats().tiers[0].load_time_p99_ms == 0.0
    for ms in range(1, 101):
        m.record_tier_load(Tier.HOST, ms / 1e3)
    m.record_tier_load(Tier.DISK, 1.0)  # no disk tier here: ignored
    host = m.stats().tiers[0]
    assert host.loads == 100
    assert abs(host.load_time_p50_ms - 50.5) < 1e-6 and abs(host.load_time_p99_ms - 99.01) < 1e-6
    assert len(m.stats().tiers) == 1


def test_a_loose_prefetch_takes_only_the_room_running_sequences_leave() -> None:
    m, e = make(num_blocks=4, host_blocks=8, prefetch_blocks=4)
    for sid in (1, 2, 3):
        serve(e, sid, prompt(sid))
    e.allocate(CacheRequest(9, prompt(9, blocks=2)))  # runs: 3 of the 4 blocks locked
    e.run_moves()
    assert m.num_available_blocks == 1
    assert m.prefetch(CacheRequest(7, prompt(1)), hold=False) == 1  # of the 2 on host
    e.run_moves()
    e.check()
    m.check_invariants()
    assert m.num_available_blocks == 1  # and it left that block evictable
