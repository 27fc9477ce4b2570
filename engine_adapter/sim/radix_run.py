"""The radix row's event loop in one compiled call (`engine_adapter.sim._radix_run`).

A radix row in the Python event loop spends its time in Python frames around the cache, not in
the cache's C parts: about 130 us a request over the `CacheManager`'s layers (admission, the
running sequences, the eviction step, the accounting) and the loop's own steps
(docs/performance.md). Where it can, the whole row runs in one compiled call instead: the
requests go in as arrays (`flat_run.flat_columns`), the radix tree and its policy's order are C
arrays, the ghost set is told each lookup and eviction through its C API, and the figures come
back into the `RunState` and the `RadixModel`'s `figures`, from which `Simulator.row` builds the
row as for the Python loop. Same row either way, timings aside (tests/test_radix_run.py holds
the two to it, TTFTs bit for bit).

It runs when (`compiled_run`, which otherwise says why not: the row's `event_loop`): the radix
cache model in a plain `run()` (no fleet `horizon`, KV tiers or compress-on-evict, not
`compiled=False`; queue protection and the adaptive batch run in it, issue 50 item 4), the
policy's class one the loop has a kind for (`policy_kind`, from `_POLICY_KINDS`), every key an
int64 (the ghost set is the compiled one), the extensions built and not `SAGE_PURE_PYTHON`. A row
that would raise (a request larger than the pool) runs in the Python loop, which raises.

The unbounded reference row's pool holds every block of its run, so it runs without an eviction
order (`NO_ORDER`: no policy state, and no key, depth, hit count or tenant per node, which only
an eviction reads); should it have to evict after all (a key under two prefixes: a tree node per
place, a pool block per key), the loop stops and the row runs again with its policy's order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.cache.ages import HISTOGRAM_KINDS, AgeHistograms
from engine_adapter.cache.ghosts import GHOSTS_CORE, GhostSet
from engine_adapter.sim.cache_models import RadixBelady, RadixFigures, RadixModel
from engine_adapter.sim.flat_run import FlatColumns, LoopSettings, cost_coefficients, flat_columns
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.run_state import RunRequests, RunState
from sage_eviction import EvictionPolicy, native
from sage_eviction.compiled_kinds import NO_ORDER as NO_ORDER_KIND
from sage_eviction.compiled_kinds import c_codes, compiled_in
from sage_eviction.metrics import LatencyRecorder
from sage_eviction.policies import POLICIES
from sage_eviction.preemption import get_order

__all__ = [
    "NO_ORDER",
    "RADIX_LOOP",
    "RadixFuture",
    "RadixOptions",
    "RadixSettings",
    "compiled_policies",
    "compiled_run",
    "policy_kind",
    "radix_loop",
]

RADIX_LOOP = "engine_adapter.sim._radix_run"

NO_ORDER = NO_ORDER_KIND
"""No eviction order: the unbounded reference row, which never evicts (`P_NONE` of
sage_eviction/_kinds.pxi)."""
_CODES: dict[str, tuple[int, int]] = {name: c_codes(name) for name in compiled_in("radix")}
"""The loop's C codes, (kind, variant), of each policy `compiled_in("radix")` lists: the policies'
C home's (`sage_eviction.compiled_kinds.C_CODES`; a policy registered there without codes fails
at import)."""


def _radix_class(name: str) -> type[EvictionPolicy]:
    """The class the loop runs for registry name `name` (belady's: the radix model's own)."""
    return RadixBelady if name == "belady" else POLICIES[name]


_POLICY_KINDS: dict[type[EvictionPolicy], tuple[int, int]] = {
    _radix_class(name): _CODES[name] for name in compiled_in("radix")
}
"""The policies the loop runs, by exact class: (kind, variant); from sage_eviction.compiled_kinds."""

_CANDIDATE_KEYS = {
    "lru": 0, "seen_once_first": 0, "s3fifo": 0, "lfu": 0, "fifo": 1, "mru": 2, "filo": 3, "gdsf": 4
}  # fmt: skip
"""The loop's copy of each named `PreemptionOrder` it has (its C_LRU ...): the order over running
sequences (the manager's, else its policy's; sage_eviction.preemption). The simulator never
touches a running sequence, so their access counts are all 0, where "seen once first", s3fifo's
and lfu's keys order as lru's."""

_KINDS = ("age_at_hit_seconds", "age_at_eviction_seconds", "reuse_distance_blocks", "regret_age_seconds")
"""The histograms in the loop's order (its H_HIT, H_EVICT, H_REUSE, H_REGRET)."""


class RadixLoopSettings(LoopSettings, Protocol):
    """What the radix loop reads of the `Simulator` beyond the flat loop's (and `adaptive`, the
    run's adaptive batch, which it replaces by the copy it ran)."""

    adaptive: AdaptiveBatch | None

    @property
    def tiers(self) -> object | None: ...
    @property
    def unbounded(self) -> bool: ...
    @property
    def capacity(self) -> int: ...


class RadixOptions(Protocol):
    """What the radix loop reads of the radix cache model's options
    (`cache_model_kinds.RadixCacheModel`)."""

    @property
    def adaptive_batch(self) -> bool: ...
    @property
    def protect_queued(self) -> float: ...
    @property
    def compress_on_evict(self) -> str | None: ...
    @property
    def compiled(self) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class RadixSettings:
    """One run's settings as the compiled loop reads them (`RadixLoop.__init__`)."""

    cost: tuple[float, float, float, float, float, float]
    block_size: int
    max_running: int
    max_prefill_tokens: int
    progress: Callable[[int], None] | None
    progress_every: int
    num_blocks: int  # the pool
    distinct_keys: int  # the run's distinct keys where known (the unbounded row: its capacity), else 0
    policy_kind: int
    policy_flags: int
    policy: object  # the row's policy (a kind reads its parameters); belady's: its `RadixFuture`
    candidates: int  # its candidate key
    policy_name: str
    ghosts: object  # a fresh compiled ghost set of the manager's size
    evicted_keys: object  # a fresh compiled KeySet of the tracker's window: its evicted keys
    window: int  # the accounting's regret window (missed blocks)
    horizon: int  # the ghost set's reuse-time horizon
    close_window: Callable[[float], None]
    new_eviction: Callable[[float, int, int, str], object]
    bounds: tuple[tuple[float, ...], ...]
    latency_window: int
    max_protected: int  # the queue protection's budget in blocks (`QueueProtection`; 0: off)
    adaptive: AdaptiveBatch | None  # the run's adaptive batch (a copy: the loop's own), or None


def compiled_policies() -> list[str]:
    """The registry names of the policies the loop runs (lru, fifo, ..., belady)."""
    return [cls.name for cls in _POLICY_KINDS]


def policy_kind(cls: type) -> tuple[int, int] | None:
    """The loop's (kind, variant) of a policy class (exactly that class), or None: not run there."""
    return _POLICY_KINDS.get(cls)


@dataclass(frozen=True, slots=True)
class RadixFuture:
    """What the loop's belady kind reads of a `RadixBelady` (its parameters are its future), as
    arrays: the lookup sequence's keys (`FlatColumns.keys`, int32 or int64), from which it finds
    a key's first lookup after the cursor when the key is not the served request's, and each
    lookup's next use (`next_use_positions`, int64)."""

    keys: np.ndarray
    next_use: np.ndarray


def _kind_policy(cache: RadixModel, columns: FlatColumns) -> object:
    """What the policy's kind reads: the policy, or Belady's future."""
    if cache.belady is None:
        return cache.manager.policy
    next_use = np.frombuffer(cache.belady.next_uses, dtype=np.int64)  # the policy's own: no copy
    return RadixFuture(keys=columns.keys, next_use=next_use)


def radix_loop() -> ModuleType | None:
    """The compiled loop, or None where it is not built or `SAGE_PURE_PYTHON` forces the Python
    loop (the tests replace this function to force it)."""
    return native.load(RADIX_LOOP)


def _python_only(sim: RadixLoopSettings, options: RadixOptions) -> str | None:
    """The feature of a radix row that the compiled loop leaves to the Python loop, or None."""
    features = (
        (options.compiled is False, "compiled=False"),  # the pure-Python cache asked for: no compiled loop
        (sim.horizon is not None, "a fleet replica"),
        (options.compress_on_evict is not None, "compress-on-evict"),
        (sim.tiers is not None, "KV tiers"),
    )
    return next((why for found, why in features if found), None)


def _settings(
    sim: RadixLoopSettings,
    cache: RadixModel,
    kind: tuple[int, int],
    candidates: int,
    policy: object,
    ghosts: object,
    keys: object,
    progress: _Progress,
) -> RadixSettings:
    manager = cache.manager
    accounting = manager.accounting
    return RadixSettings(
        cost=cost_coefficients(sim.cost),
        block_size=sim.block_size,
        max_running=sim.max_running,
        max_prefill_tokens=sim.max_prefill_tokens,
        progress=progress.callback(),
        progress_every=sim.progress_every,
        num_blocks=manager.num_blocks,
        distinct_keys=sim.capacity
        if sim.unbounded
        else 0,  # an unbounded row's capacity: every distinct block
        policy_kind=kind[0],
        policy_flags=kind[1],
        policy=policy,
        candidates=candidates,
        policy_name=manager.policy_name,
        ghosts=ghosts,
        evicted_keys=keys,
        window=accounting.window,
        horizon=accounting.ghosts.times.horizon,
        close_window=accounting.close_window,
        new_eviction=GhostSet.eviction,
        bounds=tuple(HISTOGRAM_KINDS[kind] for kind in _KINDS),
        latency_window=LatencyRecorder().window,  # the eviction step's recorder (`EvictionStep`)
        max_protected=manager.max_protected,
        adaptive=copy.deepcopy(sim.adaptive),  # a run handing its row back leaves the run's own as it was
    )


def _tenants(requests: RunRequests) -> tuple[np.ndarray, list[str]]:
    """Every request's tenant as an index into the list of tenants (-1: None)."""
    if isinstance(requests, RequestTable):
        codes, _ = requests.label_codes(True)
        return codes.astype(np.int32), requests.label_names(True)
    names: dict[str, int] = {}
    codes_list = [-1 if r.tenant is None else names.setdefault(r.tenant, len(names)) for r in requests]
    return np.asarray(codes_list, dtype=np.int32), list(names)


def compiled_run(sim: RadixLoopSettings, st: RunState, options: RadixOptions) -> str | None:
    """Run the whole of `st` in the compiled loop when it can (module docstring) and fill `st`
    and its cache's `figures` as `Simulator.advance(st, math.inf)` leaves them for
    `Simulator.row`: None when it did, else why the Python loop must run (nothing done)."""
    loop, ghosts_core, core = radix_loop(), native.load(GHOSTS_CORE), native.load(native.CORE)
    cache = st.cache
    if loop is None or ghosts_core is None or core is None:
        return native.unavailable(RADIX_LOOP, GHOSTS_CORE, native.CORE)
    feature = _python_only(sim, options)
    if feature is not None:
        return feature
    if not isinstance(cache, RadixModel):
        return "not a radix row"
    manager = cache.manager
    kind = policy_kind(type(manager.policy))
    preempt = manager.preemption_order or get_order(manager.policy.preemption_order)
    candidates = _CANDIDATE_KEYS.get(preempt.name)
    held = manager.accounting.ghosts
    if kind is None:
        return f"{manager.policy_name} has no kind in the compiled loop"
    if candidates is None:
        return f"preemption order {preempt.name!r} has no key in the compiled loop"
    if not isinstance(held, ghosts_core.IntGhostSet):
        return "keys that are not all int64"
    if manager.accounting.lookup_log is not None or manager.explain or manager.eviction_threshold is not None:
        return "a lookup log, explanations or an eviction threshold"
    columns = flat_columns(st.requests)
    policy = _kind_policy(cache, columns)
    codes, tenants = _tenants(st.requests)
    progress = _Progress(sim.progress)
    # the unbounded row's pool holds every block of its run at once, so it does not evict: its
    # tree keeps no eviction order (the policy's tick and heap entry, a node's key, depth, hits
    # and tenant: RadixLoop's P_NONE), unless a key recurs under another prefix and it must
    for order in ((NO_ORDER, 0), kind) if sim.unbounded else (kind,):
        # its reuse times see every distinct key of its run (its capacity): sized once to them
        keys_seen = sim.capacity if sim.unbounded else 0
        fresh = ghosts_core.IntGhostSet(held.capacity, held.times.horizon, keys_seen)
        keys = core.KeySet(window=manager._metrics.reprefill.window)  # the row's: the whole run (None)
        settings = _settings(sim, cache, order, candidates, policy, fresh, keys, progress)
        run = loop.RadixLoop(columns, settings, codes, tenants)
        if run.run(float(st.clock)):
            _fill_state(st, run)
            cache.figures = _figures(run, settings)
            sim.adaptive = settings.adaptive  # the adaptive batch the row ran with, its changes
            return None
        if not run.cache.needs_order:
            break
        progress.again()
    return "a request larger than the pool"


class _Progress:
    """The row's progress callback, told each call once when the row runs again (the unbounded
    row without an order, then with its policy's): the same calls, up to where it stopped."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self.progress, self.told, self.skip = progress, 0, 0

    def __call__(self, done: int) -> None:
        if self.skip:
            self.skip -= 1
        elif self.progress is not None:
            self.told += 1
            self.progress(done)

    def again(self) -> None:
        """The run starts over: its first calls were told already."""
        self.skip = self.told
        self.told = 0

    def callback(self) -> Callable[[int], None] | None:
        """What the loop calls (None: no progress asked)."""
        return None if self.progress is None else self


def _fill_state(st: RunState, run: Any) -> None:
    """The event loop's figures, as the Python loop leaves them in `st`."""
    ttfts, tpots, order, served, looked, counts = run.outputs()
    st.clock, st.step, st.finished, st.total_tokens = run.clock, run.step, run.finished, run.total_tokens
    st.block_lookups, st.block_hits, st.tokens_looked_up, st.tokens_hit = counts
    st.ttfts, st.tpots = ttfts.tolist(), tpots.tolist()
    groups = zip(order.tolist(), served.tolist(), looked.tolist(), strict=True)
    st.group_hits = {g: [h, n] for g, h, n in groups}
    st.next_arrival = st.queued = len(st.requests)


def _figures(run: Any, settings: RadixSettings) -> RadixFigures:
    """The cache's figures (the loop's `cache` and its `acct`), as the manager's `stats()`
    would give them."""
    cache, acct = run.cache, run.cache.acct
    ages = AgeHistograms()
    counts, sums, seen = acct.hist_counts, acct.hist_sums, acct.hist_seen
    for k, kind in enumerate(_KINDS):
        n_buckets = len(settings.bounds[k]) + 1
        for t, tenant in enumerate(acct.tenant_names):  # "-": None, as the histograms name it
            if seen[k, t]:
                total = float(sums[k, t])
                ages.add_counts(kind, settings.policy_name, tenant, counts[k, t, :n_buckets].tolist(), total)
    held = min(cache.latency_count, settings.latency_window)  # the recorder's window
    evictions, calls = cache.total_evictions, cache.eviction_calls
    return RadixFigures(
        re_prefill_rate=cache.re_prefilled / evictions if evictions else 0.0,
        memory_utilization=cache.utilization_sum / calls if calls else 0.0,
        evictions=evictions,
        decision_times=cache.latency_ring[:held],
        preemptions=cache.preemptions,
        missed=acct.missed,
        ghost_hits=acct.ghost_hits,
        regrets=acct.regrets,
        histograms=ages.snapshot(),
    )
