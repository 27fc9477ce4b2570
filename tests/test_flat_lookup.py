"""`FlatCache.lookup` in one compiled call against the pure-Python loop (issue 34).

The compiled `flat_lookup` runs `FlatCache.request` per key in C, the policy through its C table
where it has one. Its twin is a FlatCache built inside `native.pure_python()` (the Python loop
and the pure-Python policy): the same hypothesis-drawn key streams, given in chunks as the
simulator gives a request's blocks, must give the same hits per chunk, the same victims in the
same order, the same re-prefill and latency counts and the same final policy order, for every
registered policy (Belady with its future).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_eviction import available_policies, get_policy_class, native
from sage_eviction.errors import PolicyStateError
from sage_eviction.flat import FlatCache, simulate_flat
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker
from sage_eviction.policies.lru import LRUPolicy

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

STREAMS = st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=12), min_size=1, max_size=30)


def _cache(policy: str, capacity: int, future: list[int]) -> tuple[FlatCache, list[Any]]:
    victims: list[Any] = []
    cache = FlatCache(
        policy,
        capacity,
        future=future,
        reprefill=ReprefillTracker(),
        latency=LatencyRecorder(window=4),  # a small ring: its wrap-around is exercised
        on_evict=lambda victim, seconds: victims.append(victim),
    )
    return cache, victims


def _picture(cache: FlatCache, victims: list[Any]) -> dict[str, Any]:
    assert cache.reprefill is not None and cache.latency is not None
    return {
        "result": cache.result(),
        "held": cache._held,
        "victims": victims,
        "re_prefilled": cache.reprefill.re_prefilled,
        "evictions": cache.reprefill.evictions,
        "latency_count": cache.latency.count,
        "ring": len(cache.latency._ring),
        "order": cache.policy.peek(len(cache.policy)),
    }


@pytest.mark.parametrize("policy", available_policies())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=STREAMS, capacity=st.integers(1, 12))
def test_the_compiled_lookup_is_the_python_loop(policy: str, chunks: list[list[int]], capacity: int) -> None:
    future = [key for chunk in chunks for key in chunk]
    compiled, compiled_victims = _cache(policy, capacity, future)
    with native.pure_python():
        reference, reference_victims = _cache(policy, capacity, future)
    assert reference._lookup_in_c is None and compiled._lookup_in_c is not None
    for chunk in chunks:
        assert compiled.lookup(chunk) == reference.lookup(chunk)
    assert _picture(compiled, compiled_victims) == _picture(reference, reference_victims)


def test_the_cache_says_how_it_calls_the_policy() -> None:
    core = native.load(native.CORE)
    assert core is not None
    expected = "compiled" if core.has_compiled_ops(LRUPolicy()) else "python"
    assert FlatCache("lru", 4).policy_calls == expected == "compiled"

    class Plugin(LRUPolicy):
        name = "plugin"

    assert FlatCache(Plugin(), 4).policy_calls == "python"
    with native.pure_python():
        assert FlatCache("lru", 4).policy_calls == "python"


def test_a_plugin_runs_the_compiled_loop_through_its_methods() -> None:
    class Plugin(LRUPolicy):
        name = "plugin"

    keys = [i % 7 for i in range(200)] + list(range(50))
    plugin, builtin = simulate_flat(keys, Plugin(), 5), simulate_flat(keys, "lru", 5)
    assert plugin.evictions > 0
    assert (plugin.hits, plugin.misses, plugin.evictions) == (builtin.hits, builtin.misses, builtin.evictions)


def test_nothing_evictable_raises_and_keeps_the_counts_the_python_loop_keeps() -> None:
    class Stuck(LRUPolicy):
        """Evicts nothing: a full cache cannot admit a miss."""

        name = "stuck"

        def evict(self, n: int = 1) -> list[Any]:
            return []

    pictures = []
    for pure in (False, True):
        with native.pure_python() if pure else contextlib.nullcontext():
            cache = FlatCache(Stuck(), 2, reprefill=ReprefillTracker())
        with pytest.raises(PolicyStateError, match="flat cache full"):
            cache.lookup([1, 2, 1, 3, 4])
        pictures.append((cache.requests, cache.hits, cache.evictions, cache._held, len(cache.policy)))
    assert pictures[0] == pictures[1] == (4, 1, 0, 2, 2)


def test_every_policy_is_tested() -> None:
    assert {get_policy_class(name).name for name in available_policies()} >= {"lru", "belady", "arc"}
