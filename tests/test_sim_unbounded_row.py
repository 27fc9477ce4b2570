"""The unbounded reference row in the compiled radix loop holds what a row that never evicts needs
(issue 49, item 3: `sage llm benchmark` at 10^8 lookups under 2 GiB).

- No eviction order: its tree is built without one (`radix_run.NO_ORDER`, the loop's P_NONE: no
  policy ticks or heap, no key, depth, hit count or tenant per node), and it evicts nothing.
- No regret clock of every key it saw: the ghost set's C API records lookups in the regret clock
  only while a ghost is held, so a row that never evicts keeps none (`IntGhostSet.clock_keys`),
  while a row that evicts keeps one and counts its regrets as the Python loop does.
- Where a key recurs under another prefix the unbounded row must evict after all: the loop stops
  and the row runs again with its policy's order, the Python loop's row, each progress call told
  once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING
from radix_rows import python_loop, without_timings

from engine_adapter.sim import radix_run
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

pytestmark = pytest.mark.skipif(radix_run.radix_loop() is None, reason=COMPILED_CORE_MISSING)


@contextmanager
def _loops_built() -> Iterator[list[Any]]:
    """The compiled loops (`RadixLoop`s) the rows run inside this block build, in order."""
    module, built = radix_run.radix_loop(), []
    assert module is not None

    def build(*args: Any) -> Any:
        built.append(module.RadixLoop(*args))
        return built[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(radix_run, "radix_loop", lambda: SimpleNamespace(RadixLoop=build))
        yield built


def _unique_workload() -> Workload:
    # many distinct blocks, few of them seen again: most lookups bring a key never seen before
    return synthetic(requests=400, seed=5, sessions=8)


def test_the_unbounded_row_keeps_no_order_and_no_regret_clock() -> None:
    workload = _unique_workload()
    with _loops_built() as built:
        sim = Simulator(workload, "unbounded", None)
        row = sim.run().to_dict()
    (loop,) = built
    assert sim.event_loop == "compiled" and row["block_hits"] > 0
    assert loop.cache.order_kind == radix_run.NO_ORDER
    assert loop.cache.total_evictions == 0 and row["evictions"] == 0
    ghosts = loop.cache.acct.ghosts
    assert len(ghosts) == 0 and ghosts.clock_keys == 0, ghosts.clock_keys


def test_a_row_that_evicts_keeps_its_regret_clock_and_the_python_loops_regrets() -> None:
    workload = _unique_workload()
    capacity = max(64, unique_blocks(workload.requests) // 20)
    with _loops_built() as built:
        row = Simulator(workload, "lru", capacity).run().to_dict()
    (loop,) = built
    with python_loop():
        expected = Simulator(workload, "lru", capacity).run().to_dict()
    assert loop.cache.order_kind != radix_run.NO_ORDER
    assert row["evictions"] > 0 and loop.cache.acct.ghosts.clock_keys > 0
    assert row["regrets"] > 0 and without_timings(row) == without_timings(expected)


def _key_under_two_prefixes() -> Workload:
    # key 0 first as a first block, then under key 1: two tree nodes for one of the two distinct
    # keys, so the pool of the distinct blocks is one block short and the row evicts
    shapes = [(), (), (), (0,), (1, 0)]
    requests = [
        SimRequest(request_id=i, arrival_s=0.0, block_hashes=keys, input_len=len(keys), output_len=0)
        for i, keys in enumerate(shapes)
    ]
    return Workload(requests=requests, block_size=1, source="drawn")


def test_an_unbounded_row_that_must_evict_runs_again_with_its_order() -> None:
    workload = _key_under_two_prefixes()
    options: dict[str, Any] = dict(max_running=1, max_prefill_tokens=1, progress_every=1)
    calls: list[int] = []
    with _loops_built() as built:
        sim = Simulator(workload, "unbounded", None, progress=calls.append, **options)
        row = sim.run().to_dict()
    expected_calls: list[int] = []
    with python_loop():
        reference = Simulator(workload, "unbounded", None, progress=expected_calls.append, **options)
        expected = reference.run().to_dict()
    assert sim.event_loop == "compiled" and expected["evictions"] == 1
    assert [loop.cache.order_kind == radix_run.NO_ORDER for loop in built] == [True, False]
    assert built[0].cache.needs_order and not built[1].cache.needs_order
    assert without_timings(row) == without_timings(expected)
    assert calls == expected_calls == [1, 2, 3, 4, 5]
