"""Salts isolate on every tier (issue 51, item 4): a request with one `cache_salt` never hits a
prefix only another salt wrote, whether that prefix sits on the device, on host or on disk.

Random streams of requests over shared prompts and two salts (and none), on a small device
pool over a small host and disk tier, so that blocks move through every tier; each hit is
checked against the test's own record of which salt wrote which prefix."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import NoEvictableBlocksError
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig

BS = 2
PROMPTS = [[1, 2, 3, 4, 5, 6, 0], [1, 2, 3, 4, 9, 9, 0], [7, 8, 7, 8, 0], [1, 2, 0]]
SALTS = [None, "tenant-a", "tenant-b"]


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(st.tuples(st.sampled_from(range(len(PROMPTS))), st.sampled_from(SALTS)), max_size=40),
    disk=st.sampled_from([0, 3]),
)
def test_a_salt_never_hits_another_salts_prefix_from_any_tier(
    stream: list[tuple[int, str | None]], disk: int
) -> None:
    m = CacheManager(
        BlockAllocator(5, BS),
        tiers=TierConfig(host_blocks=3, disk_blocks=disk),
        record_events=False,
        clock=itertools.count().__next__,  # type: ignore[arg-type]
    )
    written: dict[str | None, set[tuple[int, ...]]] = {salt: set() for salt in SALTS}
    for sid, (index, salt) in enumerate(stream, start=1):
        prompt = PROMPTS[index]
        try:
            alloc = m.allocate(CacheRequest(sid, prompt, cache_salt=salt))
        except NoEvictableBlocksError:
            continue
        m.take_moves()
        hit = alloc.num_cached_blocks
        # every block it hit, this salt wrote before (the same prefix up to that block)
        for i in range(hit):
            assert tuple(prompt[: (i + 1) * BS]) in written[salt], (salt, prompt, hit)
        m.free_sequence(sid, prompt)
        m.take_moves()
        for i in range(len(prompt) // BS):
            written[salt].add(tuple(prompt[: (i + 1) * BS]))
        m.check_invariants()


def test_a_prefix_demoted_below_the_device_is_hit_by_its_salt_only() -> None:
    m = CacheManager(
        BlockAllocator(5, BS), tiers=TierConfig(host_blocks=3, disk_blocks=12), record_events=False
    )
    written = [1, 2, 3, 4, 5, 6, 0]
    m.allocate(CacheRequest(1, written, cache_salt="a"))
    m.free_sequence(1, written)
    for sid in range(2, 6):  # another tenant's traffic pushes it below the device
        filler = [10 * sid, 10 * sid + 1, 10 * sid + 2, 10 * sid + 3, 0]
        m.allocate(CacheRequest(sid, filler, cache_salt="c"))
        m.free_sequence(sid, filler)
        m.take_moves()
    other = m.allocate(CacheRequest(10, written, cache_salt="b"))
    assert other.num_cached_blocks == 0
    m.free_sequence(10, written)
    m.take_moves()
    own = m.allocate(CacheRequest(11, written, cache_salt="a"))
    assert own.num_cached_blocks == 3 and own.num_host_blocks + own.num_disk_blocks == 3
