"""The compiled radix cache core against the pure-Python reference, side by side.

`engine_adapter.cache._core` (Cython, engine_adapter/cache/_core.pyx) mirrors the hot paths of
`RadixCache` (radix_cache.py). Here both run the same operations and must agree on everything
observable:

- `RadixCache` alone: random trees built by insert/lock/unlock/touch/refresh/evict/remove/pin
  (hypothesis): same return values and errors, same victims in the same order, same policy
  order and the `check()` invariants after every step, for several policies.
- `CacheManager`: hypothesis-generated request streams (allocate, decode growth, commit, lock by
  queue protection and unlock by admission or release, eviction, preemption, free, pins, hot
  swaps): same results and errors, same eviction events in the same order, the same snapshot
  (free list, tree, policy order, block tables, counters) and `check_invariants()` on both.
- The simulator: the same `SimResult` rows (wall-clock timings aside) on a Mooncake trace slice
  and a synthetic workload, for several policies and both cache models.

Skipped, with the reason, when the compiled core is not built (`python setup.py build_ext
--inplace`) or `SAGE_PURE_PYTHON` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from cache_snapshot import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from oracle_trace import MOONCAKE

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_meta import BlockMetaFields
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.errors import SageCacheError
from engine_adapter.cache.radix_cache import CORE_MODULE, CompiledRadixCache, RadixCache, new_radix_cache
from engine_adapter.cache.request import CacheRequest
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.simulator import SimResult, simulate
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload, unique_blocks
from sage_eviction import EntryMeta, EvictionPolicy, available_policies
from sage_eviction.errors import SageEvictionError
from sage_eviction.native import implementation, load

pytestmark = pytest.mark.skipif(
    CompiledRadixCache is None,
    reason=f"compiled radix core not in use, {implementation(CORE_MODULE)}: setup.py build_ext --inplace",
)

ONLINE = available_policies(include_offline=False)
RADIX_POLICIES = ["lru", "arc", "s3fifo", "gdsf", "slru", "sieve"]
TIMINGS = {"wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us"}


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What a call did, comparable across implementations: its value or its error."""
    try:
        return ("ok", call())
    except (SageCacheError, SageEvictionError, ValueError, TypeError, KeyError) as exc:
        return (type(exc).__name__, str(exc))


def _blocks(value: Any) -> Any:
    """Blocks as comparable tuples (the two implementations' node classes differ)."""
    if isinstance(value, tuple):
        return tuple(_blocks(v) for v in value)
    if isinstance(value, list):
        return [_blocks(v) for v in value]
    if hasattr(value, "ref_count") and hasattr(value, "num_children"):
        parent = value.parent
        return (
            value.key,
            value.block_id,
            None if parent is None else parent.key,
            value.depth,
            value.num_children,
            value.ref_count,
            value.pin_count,
            value.evictable,
            value.sequence_id,
            value.meta,  # the policy's record, field by field (a dataclass compares by value)
        )
    return value


# ---- the radix cache alone ---------------------------------------------------------------------


def _policy_order(radix: RadixCache) -> list[Any]:
    return [(e.key, e.evictable, e.meta.hits) for e in radix.policy.entries()]


def _twin_caches(policy: str, num_blocks: int) -> tuple[RadixCache, RadixCache]:
    from sage_eviction.registry import resolve_policy

    def build() -> EvictionPolicy:
        return resolve_policy(policy, num_blocks).build()

    pure = new_radix_cache(build(), num_blocks=num_blocks, max_pinned_ratio=0.5, compiled=False)
    fast = new_radix_cache(build(), num_blocks=num_blocks, max_pinned_ratio=0.5, compiled=True)
    assert type(pure) is RadixCache and type(fast) is CompiledRadixCache
    return pure, fast


_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "insert", "insert", "lock", "unlock", "touch", "evict", "remove", "pin", "unpin"]
        ),
        st.integers(0, 40),  # which block (by key) or how many
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(RADIX_POLICIES), ops=_OPS)
def test_radix_cache_twins_agree(policy: str, ops: list[tuple[str, int, bool]]) -> None:
    """Random trees under the cache's contract (locks and pins are root paths, released as
    taken); out-of-contract calls only where the cache must refuse them and change nothing."""
    pure, fast = _twin_caches(policy, 32)
    locks: list[Any] = []  # the last key of each locked root path
    pins: list[Any] = []
    clock = 0.0
    for step, (op, arg, flag) in enumerate(ops):
        clock += 1.0
        held = sorted((b.depth, b.key) for b in pure.blocks())

        def path_to(cache: RadixCache, key: Any) -> list[Any]:
            block = cache.get(key)
            path = []
            while block is not None:
                path.append(block)
                block = block.parent
            return path[::-1]

        chosen = held[arg % len(held)][1] if held else None
        if op == "unlock" and locks:
            chosen = locks.pop(arg % len(locks))
        elif op == "unpin" and pins:
            chosen = pins.pop(arg % len(pins))
        elif op in ("unlock", "unpin"):
            # out of contract: only where some block of the path has nothing to release (an error)
            attr = "ref_count" if op == "unlock" else "pin_count"
            if chosen is None or all(getattr(b, attr) for b in path_to(pure, chosen)):
                continue
        key = ("k", step)
        results = []
        for cache in (pure, fast):
            path = path_to(cache, chosen) if chosen is not None else []
            results.append(_blocks(_outcome(partial(_apply, cache, op, path, key, arg, flag, clock))))
            if op == "insert":
                last = cache.get(key)
                if last is not None:  # no child follows: what a caller does after a chain
                    cache.refresh(last)
        assert results[0] == results[1], (op, arg, flag)
        if results[0][0] == "ok":
            if op == "lock" or (op == "insert" and flag):
                locks.append(key if op == "insert" else chosen)
            elif op == "pin" and chosen is not None:
                pins.append(chosen)
        for cache in (pure, fast):
            cache.check()
        assert _blocks(sorted(pure.blocks(), key=lambda b: b.key)) == _blocks(
            sorted(fast.blocks(), key=lambda b: b.key)
        )
        assert (pure.num_pinned, pure.num_reclaimable, pure.num_evictable) == (
            fast.num_pinned,
            fast.num_reclaimable,
            fast.num_evictable,
        )
        assert _policy_order(pure) == _policy_order(fast)
    # and what is left drains in the same order
    assert _blocks(pure.evict(1000)[0]) == _blocks(fast.evict(1000)[0])


def _apply(cache: RadixCache, op: str, path: list[Any], key: Any, arg: int, flag: bool, clock: float) -> Any:
    """One operation of `test_radix_cache_twins_agree` on `cache`, on the root `path`."""
    if op == "insert":
        parent = path[-1] if path and arg % 3 else None
        if flag and parent is not None:
            cache.lock(path)  # a locked block's parent is locked by the same sequence
        meta = EntryMeta(size=4, cost=float(arg), last_access=clock, tenant="t" if flag else None)
        return cache.insert(parent, key, arg, meta, sequence_id=arg, locked=flag, leaf=arg % 2 == 0)
    if op in ("lock", "unlock", "pin", "unpin"):
        return getattr(cache, op)(path)
    if op == "touch":
        return cache.touch(path, clock)
    if op == "evict":
        return cache.evict(arg % 6)[0]
    return cache.remove(path[-1]) if path else None


def test_compiled_errors_are_the_reference_errors() -> None:
    pure, fast = _twin_caches("lru", 8)
    for cache in (pure, fast):
        a = cache.insert(None, 1, 0, EntryMeta())
        cache.insert(a, 2, 1, EntryMeta())
    assert _outcome(lambda: pure.insert(None, 1, 5, EntryMeta())) == _outcome(
        lambda: fast.insert(None, 1, 5, EntryMeta())
    )
    assert _outcome(lambda: pure.unlock(pure.match([1]))) == _outcome(lambda: fast.unlock(fast.match([1])))
    assert repr(pure.get(2)) == repr(fast.get(2))
    orphan_pure, orphan_fast = pure.get(1), fast.get(1)
    pure.evict(2)
    fast.evict(2)
    assert _outcome(lambda: pure.insert(orphan_pure, 3, 0, EntryMeta())) == _outcome(
        lambda: fast.insert(orphan_fast, 3, 0, EntryMeta())
    )
    with pytest.raises(ValueError, match="max_pinned_ratio"):
        new_radix_cache(pure.policy, num_blocks=8, max_pinned_ratio=2.0, compiled=True)


@given(
    fields=st.builds(
        BlockMetaFields,
        st.integers(1, 64),
        st.builds(
            CacheRequest,
            st.integers(0, 100),
            priority=st.integers(0, 2),
            tenant=st.sampled_from([None, "a", "tenant-b"]),
            estimated_lifetime=st.none() | st.floats(0, 100),
            max_tokens=st.integers(0, 10_000),
            deadline=st.none() | st.floats(0, 1e9),
            conversation=st.none() | st.text(max_size=4),
        ),
        st.floats(0, 1e9),
        st.integers(0, 10_000),
        st.integers(1, 100),
        st.none() | st.floats(0, 1e4),
    ),
    index=st.integers(0, 99),
)
def test_compiled_meta_is_the_reference_meta(fields: BlockMetaFields, index: int) -> None:
    import dataclasses
    import sys

    from engine_adapter.cache import _core  # type: ignore[attr-defined]

    tenant = "".join(["tenant-", str(index)])  # a fresh object: its reference count is ours to read
    fields = fields._replace(request=dataclasses.replace(fields.request, tenant=tenant))
    before = sys.getrefcount(tenant)
    meta = _core.block_meta(fields, index)
    assert type(meta) is EntryMeta and meta == fields.meta(index)
    assert sys.getrefcount(tenant) == before + 1  # the record holds one reference, as a setattr
    del meta
    assert sys.getrefcount(tenant) == before


# ---- the cache manager ----------------------------------------------------------------------------


def _events(m: CacheManager) -> list[dict[str, Any]]:
    assert m.events is not None
    # timings and the run's wall-clock stamp (two managers built across a second differ in it)
    return [{k: v for k, v in e.items() if k not in ("duration_us", "run")} for e in m.events.tail()]


class TwinManagers(RuleBasedStateMachine):
    """The same request stream through a pure-Python and a compiled `CacheManager`."""

    policy_name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.twins: tuple[CacheManager, CacheManager]
        self.tokens: dict[int, list[int]] = {}
        self.queued: dict[int, list[int]] = {}
        self.pinned: list[list[int]] = []
        self.next_id = 0
        self.prefixes: list[list[int]] = []

    @initialize(
        num_blocks=st.integers(12, 32),
        block_size=st.integers(2, 4),
        threshold=st.sampled_from([None, 0.6]),
        protect=st.sampled_from([0.0, 0.3]),
    )
    def setup(self, num_blocks: int, block_size: int, threshold: float | None, protect: float) -> None:
        def manager(compiled: bool) -> CacheManager:
            ticks = iter(range(1, 1 << 30))
            return CacheManager(
                BlockAllocator(num_blocks, block_size),
                policy=self.policy_name,
                eviction_threshold=threshold,
                clock=lambda: float(next(ticks)),
                isolate_tenants=True,
                protect_queued=protect,
                compiled=compiled,
            )

        self.twins = (manager(False), manager(True))
        assert type(self.twins[0].radix) is RadixCache and type(self.twins[1].radix) is CompiledRadixCache
        bs = block_size
        self.prefixes = [[], [1] * (2 * bs), [2] * (3 * bs) + [3] * bs, [4] * (bs + 1)]

    def both(self, call: Callable[[CacheManager], Any]) -> Any:
        pure, fast = (_blocks(_outcome(lambda m=m: call(m))) for m in self.twins)  # type: ignore[misc]
        assert pure == fast
        return pure

    @rule(
        prefix=st.integers(0, 3),
        suffix=st.lists(st.integers(0, 3), max_size=10),
        tenant=st.sampled_from([None, "a"]),
    )
    def allocate(self, prefix: int, suffix: list[int], tenant: str | None) -> None:
        prompt = self.prefixes[prefix] + suffix
        if not prompt:
            return
        seq = self.next_id
        self.next_id += 1
        done, _ = self.both(lambda m: m.allocate(CacheRequest(seq, prompt, tenant=tenant, priority=seq % 3)))
        if done == "ok":
            self.tokens[seq] = list(prompt)
            self.queued.pop(seq, None)

    @rule(prefix=st.integers(0, 3), suffix=st.lists(st.integers(0, 3), max_size=10))
    def enqueue(self, prefix: int, suffix: list[int]) -> None:
        prompt = self.prefixes[prefix] + suffix
        if not prompt:
            return
        rid = self.next_id
        self.next_id += 1
        self.both(lambda m: m.protect_queued_prefix(CacheRequest(rid, prompt)))
        self.queued[rid] = prompt

    @precondition(lambda self: self.queued)
    @rule(data=st.data(), admit=st.booleans())
    def dequeue(self, data: st.DataObject, admit: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.queued)))
        prompt = self.queued.pop(rid)
        if admit:
            done, _ = self.both(lambda m: m.allocate(CacheRequest(rid, prompt)))
            if done == "ok":
                self.tokens[rid] = list(prompt)
            else:
                self.both(lambda m: m.release_queued(rid))
        else:
            self.both(lambda m: m.release_queued(rid))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 6))
    def decode(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens[seq]
        for _ in range(n):
            done, got = self.both(lambda m: m.reserve_tokens(seq, len(toks) + 1))
            if done != "ok" or got is None:
                return
            toks.append(len(toks) % 4)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.both(lambda m: m.commit_blocks(seq, self.tokens[seq]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), cache=st.booleans(), preempt=st.booleans(), frac=st.floats(0.0, 1.0))
    def release(self, data: st.DataObject, cache: bool, preempt: bool, frac: float) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        if preempt:
            computed = int(len(toks) * frac)
            self.both(lambda m: m.preempt(seq, toks, num_computed_tokens=computed))
        else:
            self.both(lambda m: m.free_sequence(seq, toks, cache=cache))

    @precondition(lambda self: self.tokens)
    @rule(required=st.integers(1, 8))
    def choose_victims(self, required: int) -> None:
        self.both(lambda m: m.select_preemption_victims(required))

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        self.both(lambda m: m.evict(n))

    @rule()
    def background_eviction(self) -> None:
        self.both(lambda m: m.evict_to_threshold())

    @rule(prefix=st.integers(1, 3))
    def pin(self, prefix: int) -> None:
        done, handle = self.both(lambda m: m.pin(self.prefixes[prefix]))
        if done == "ok" and handle.num_blocks:
            self.pinned.append(self.prefixes[prefix])

    @precondition(lambda self: self.pinned)
    @rule()
    def unpin(self) -> None:
        prompt = self.pinned.pop()
        self.both(lambda m: m.unpin(prompt))

    @rule(name=st.sampled_from(ONLINE))
    def swap(self, name: str) -> None:
        self.both(lambda m: (m.swap_policy(name).entries, m.policy_name))

    @rule()
    def reset(self) -> None:
        self.both(lambda m: m.reset_prefix_cache())

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "twins"):
            return
        pure, fast = self.twins
        for m in self.twins:
            m.check_invariants()
        assert snapshot(pure) == snapshot(fast)
        assert _events(pure) == _events(fast)
        assert _blocks([b for b in pure.radix.blocks()]) == _blocks([b for b in fast.radix.blocks()])
        # the compiled cache calls the policy it holds now (after any swap) through its C table
        core = load("sage_eviction._core")
        assert core is not None
        calls = "compiled" if core.has_compiled_ops(fast.policy) else "python"  # (reuse: none)
        assert (pure.radix.policy_calls, fast.radix.policy_calls) == ("python", calls)


def _slow_but(*quick: str) -> Callable[[list[str]], list[Any]]:
    """Parameters, all but `quick` marked slow (the quick loop keeps one of each test)."""
    return lambda names: [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.mark.parametrize("policy", _slow_but("lru")(["lru", "arc", "s3fifo", "gdsf", "reuse"]))
def test_cache_manager_twins_agree(policy: str) -> None:
    machine = type(f"TwinManagers_{policy}", (TwinManagers,), {"policy_name": policy})
    machine.TestCase.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()


# ---- the simulator ---------------------------------------------------------------------------------


def _row(result: SimResult) -> dict[str, Any]:
    return {k: v for k, v in result.to_dict().items() if k not in TIMINGS}


def _rows_agree(workload: Workload, policy: str, fraction: float, model: str, **options: Any) -> None:
    capacity = max(1, int(unique_blocks(workload.requests) * fraction))
    if model == "radix":
        from engine_adapter.sim.simulator import min_capacity

        capacity = max(capacity, min_capacity(workload))
    pure = simulate(workload, policy, capacity, cache_model=model, compiled=False, **options)
    fast = simulate(workload, policy, capacity, cache_model=model, compiled=True, **options)
    assert _row(pure) == _row(fast)
    assert pure.block_lookups > 0


@pytest.fixture(scope="module")
def mooncake_slice() -> Workload:
    workload = read_mooncake(MOONCAKE)
    return Workload(workload.requests[:1500], workload.block_size, "mooncake")


@pytest.mark.parametrize("model", ["radix", pytest.param("flat", marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", _slow_but("lru")(["lru", "arc", "s3fifo", "gdsf", "belady", "unbounded"]))
def test_simulator_rows_agree_on_mooncake(mooncake_slice: Workload, policy: str, model: str) -> None:
    _rows_agree(mooncake_slice, policy, 0.05, model)


@pytest.mark.parametrize(
    "write_policy", ["write_back", pytest.param("write_through", marks=pytest.mark.slow)]
)
def test_simulator_rows_agree_with_kv_tiers(mooncake_slice: Workload, write_policy: str) -> None:
    """The KV tiers call the radix index through its public methods: same rows on both cores."""
    from engine_adapter.cache.tiers import TierConfig

    unique = unique_blocks(mooncake_slice.requests)
    tiers = TierConfig(
        host_blocks=int(unique * 0.2), disk_blocks=int(unique * 0.05), write_policy=write_policy
    )
    _rows_agree(mooncake_slice, "lru", 0.05, "radix", tiers=tiers)


@pytest.mark.parametrize("model", ["radix", pytest.param("flat", marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", _slow_but("lru", "belady")(["lru", "slru", "sieve", "reuse", "belady"]))
def test_simulator_rows_agree_on_synthetic(policy: str, model: str) -> None:
    workload = synthetic(requests=300, seed=5)
    _rows_agree(workload, policy, 0.1, model)


def test_simulator_rows_agree_with_preemption_and_protection() -> None:
    # a small pool: decode growth preempts, queued prefixes are protected, the batch adapts
    workload = synthetic(requests=200, seed=3, rate=40.0)
    _rows_agree(workload, "lru", 0.02, "radix", protect_queued=0.2, adaptive_batch=True, max_running=32)
