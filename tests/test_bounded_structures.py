"""Nothing in a policy or the re-prefill record grows with the keys or sequences it has seen.

Each test drives many unique keys (every one new, as unique prompts bring) through one structure
and checks its size stays under its stated bound (issue 49): the evicted-key window
(`EvictedWindow`, `ReprefillTracker`), and every container a policy holds, whatever the policy,
after many unique blocks and sequences. The property test holds the window to a reference model
(a set of the keys evicted within the last `window` evictions and not requested since).
"""

from __future__ import annotations

import inspect
import types
from collections import deque
from collections.abc import Sized

import pytest
from conftest import ONLINE_POLICIES
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_eviction import EntryMeta, create_policy, native
from sage_eviction.metrics import (
    MAX_TENANTS,
    OTHER_TENANTS,
    REPREFILL_WINDOW,
    EvictedWindow,
    HitCounter,
    ReprefillTracker,
    reprefill_window,
)


def test_the_window_holds_at_most_its_size_of_unique_keys() -> None:
    window = EvictedWindow(1000)
    for key in range(200_000):
        window.add(key)
    assert window.held == 1000 and len(window) == 1000
    assert 199_999 in window and 198_999 not in window  # the last 1000 evictions, no more


@pytest.mark.parametrize("path", ["python", "compiled"])
@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(1, 8),
    ops=st.lists(st.tuples(st.sampled_from(["evict", "request"]), st.integers(0, 12)), max_size=80),
)
def test_the_window_answers_as_the_keys_evicted_within_it(
    path: str, size: int, ops: list[tuple[str, int]]
) -> None:
    """A key is waiting when its latest eviction is among the last `size` and it was not
    requested since; the tracker counts exactly those requests, with its evicted keys in the
    compiled `KeySet`'s window or in `EvictedWindow` alike."""
    if path == "compiled" and native.core() is None:
        pytest.skip("the compiled core is not built")
    if path == "python":
        with native.pure_python():
            tracker = ReprefillTracker(size)
        assert type(tracker._evicted) is EvictedWindow
    else:
        tracker = ReprefillTracker(size)
        assert type(tracker._evicted) is not EvictedWindow
    recent: deque[int] = deque(maxlen=size)  # the keys of the last `size` evictions
    requested_since: dict[int, int] = {}  # key -> evictions counted when it was last requested
    expected = 0
    for op, key in ops:
        if op == "evict":
            tracker.on_evict(key)
            recent.append(key)
            requested_since.pop(key, None)
        else:
            # waiting: among the last `size` evicted keys, and not requested after its eviction
            back = key in recent and key not in requested_since
            expected += back
            assert tracker.on_request(key) is back
            if key in recent:
                requested_since[key] = tracker.evictions
        assert tracker.re_prefilled == expected
        assert tracker._evicted.held <= size and len(tracker._evicted) <= size


def test_the_rate_is_exact_where_the_window_covers_the_run() -> None:
    """Fewer evictions than the window: every evicted key is remembered, as an unbounded set."""
    tracker = ReprefillTracker(REPREFILL_WINDOW)
    tracker.on_evicts(list(range(REPREFILL_WINDOW)))
    assert tracker.on_requests(range(0, REPREFILL_WINDOW, 2)) == REPREFILL_WINDOW // 2
    assert tracker.rate == 0.5


def test_the_stated_window() -> None:
    assert reprefill_window(None) == REPREFILL_WINDOW
    assert reprefill_window(16) == REPREFILL_WINDOW
    assert reprefill_window(100_000) == 400_000
    with pytest.raises(ValueError, match="window=0"):
        EvictedWindow(0)


def test_per_tenant_tables_hold_at_most_the_stated_tenants() -> None:
    """Tenants are client-chosen: 3 x MAX_TENANTS of them, each seen once, leave MAX_TENANTS
    rows and one for the rest (whose counts it keeps: nothing is lost from the totals)."""
    from engine_adapter.cache.ages import AgeHistograms

    hits, ages = HitCounter(), AgeHistograms()
    for i in range(3 * MAX_TENANTS):
        hits.record(f"tenant-{i}", 1, 2)
        ages.observe("age_at_hit_seconds", "lru", f"tenant-{i}", 1.0)
    assert len(hits.per_tenant) == MAX_TENANTS + 1
    assert hits.per_tenant[OTHER_TENANTS] == [2 * MAX_TENANTS, 4 * MAX_TENANTS]
    assert sum(h for h, _ in hits.per_tenant.values()) == hits.hits == 3 * MAX_TENANTS
    histograms = ages.snapshot()
    assert len(histograms) == MAX_TENANTS + 1 and {h.tenant for h in histograms} >= {OTHER_TENANTS}


@pytest.mark.parametrize("path", ["python", "c_table"])
def test_a_policy_counts_at_most_the_stated_tenants(path: str) -> None:
    """The policy's per-tenant counts (`get_metrics`' fairness), through Python's `count_tenant`
    and through the compiled core's C table (`_count_tenant`) alike."""
    core = native.core()
    if path == "c_table" and core is None:
        pytest.skip("the compiled core is not built")
    policy = create_policy("lru")
    calls = core.PolicyOpsCaller(policy) if path == "c_table" else policy
    for key in range(2 * MAX_TENANTS):
        calls.insert(key, EntryMeta(tenant=f"tenant-{key}"))
        calls.access(key, float(key))
        calls.evict(1)
    assert len(policy._tenants) == MAX_TENANTS + 1
    assert policy._tenants[OTHER_TENANTS] == [MAX_TENANTS, 2 * MAX_TENANTS]


CAPACITY = 64


def _containers(obj: object) -> dict[str, int]:
    """The sizes of the containers an object holds in its attributes (dicts, sets, lists, ...)."""
    slots = {name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())}
    names = set(getattr(obj, "__dict__", {})) | slots
    sizes = {}
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, Sized) and not isinstance(value, (str, bytes)):
            sizes[name] = len(value)
    return sizes


@pytest.mark.parametrize("name", ONLINE_POLICIES)
def test_a_policy_holds_nothing_that_grows_with_the_keys_or_sequences_it_saw(name: str) -> None:
    """More unique blocks than the window pass through a policy of 64 entries (each inserted,
    accessed, evicted, never seen again), and as many unique sequences are touched
    (`update_access`): every container it holds stays within the window (the evicted keys) or a
    small multiple of its capacity (its entries, ghost lists)."""
    policy = create_policy(name, capacity=CAPACITY)
    window = reprefill_window(CAPACITY)
    for key in range(window + 2048):
        policy.insert(key, EntryMeta(tenant=f"t{key % 4}"))
        policy.access(key, now=float(key))
        policy.update_access(key)  # a new sequence each time, as an engine serving unique prompts
        if len(policy) > CAPACITY:
            policy.evict(len(policy) - CAPACITY)
    sizes = _containers(policy)
    assert policy._evicted is not None and len(policy._evicted) <= window
    bound = max(window, 8 * CAPACITY)
    assert all(size <= bound for size in sizes.values()), {k: v for k, v in sizes.items() if v > bound}


_FIELDS = (property, types.GetSetDescriptorType, types.MemberDescriptorType)


def _reachable_sizes(root: object, depth: int = 6) -> dict[str, int]:
    """The size of every container reachable from `root` through attributes (not through
    container items), by attribute path: every table a cache keeps, however deep."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def walk(obj: object, path: str, left: int) -> None:
        if id(obj) in seen or left == 0 or isinstance(obj, (str, bytes, int, float, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, Sized):
            sizes[path] = len(obj)
        names = set(getattr(obj, "__dict__", ()))  # and slots, properties, compiled attributes:
        names |= {
            n for n in dir(type(obj)) if isinstance(inspect.getattr_static(type(obj), n, None), _FIELDS)
        }
        for name in names:
            if not name.startswith("__"):
                walk(getattr(obj, name, None), f"{path}.{name}", left - 1)

    walk(root, "cache", depth)
    return sizes


@pytest.mark.slow  # 2,000 requests through a cache manager: about 5 s
def test_a_cache_manager_holds_nothing_that_grows_with_unique_requests() -> None:
    """Unique prompts of 3 blocks, each admitted, touched, committed and freed, with the event
    log, explanations and per-lookup accounting on (a pool of 64 blocks): no table the cache
    keeps grew between 1,000 and 2,000 requests (6,000 blocks evicted) beyond a few pool-fulls,
    but for the stated windows that were still filling (each has its own bound test)."""
    from engine_adapter.cache.block_allocator import BlockAllocator
    from engine_adapter.cache.cache_manager import CacheManager
    from engine_adapter.cache.request import CacheRequest

    clock = iter(range(10**9))
    manager = CacheManager(BlockAllocator(64, 4), clock=lambda: float(next(clock)), explain=True)

    def serve(first: int, n: int) -> None:
        for rid in range(first, first + n):
            prompt = [rid * 16 + i for i in range(12)]
            manager.allocate(CacheRequest(rid, prompt, tenant=f"t{rid % 3}"))
            for _ in range(3):
                manager.touch_sequence(rid)
            manager.free_sequence(rid, prompt)

    serve(0, 1000)
    middle = _reachable_sizes(manager)
    serve(1000, 1000)
    end = _reachable_sizes(manager)
    assert manager.stats().total_evictions >= 5_000
    too_big = {path: size for path, size in end.items() if size > 10_000}
    assert not too_big
    grew = {p: (middle.get(p), s) for p, s in end.items() if s > max(middle.get(p, 0), 8 * 64) + 64}
    # still filling: the re-prefill window (8,192), the event ring (10,000), the latency ring,
    # the request receipts (4,096: tests/test_request_receipts.py drives 4,196 ids through them)
    ends = (".events", ".events._ring", "latency._ring", "receipts", "receipts._rows")
    filling = {p for p in grew if "reprefill" in p or p.endswith(ends)}
    assert set(grew) <= filling, grew
