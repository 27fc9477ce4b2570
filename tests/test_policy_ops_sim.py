"""The simulator's rows with the policy called through its C table, and through Python.

Issue 34 asks for the same rows on both paths, and for the row to say which ran. Each built-in
policy with a C table runs the radix model twice on the same generated workloads: the compiled
cache (which calls the policy's C functions) and the pure-Python cache (its methods); the rows
must be equal field for field (timings aside), and the run reports "compiled" and "python". A
policy without a table (a subclass standing in for a plugin) runs the compiled cache through its
Python methods and gives the rows of the built-in class it extends. The rows run the Python
event loop over the `CacheManager` (the compiled radix loop, which keeps the tick policies' state
in C arrays, has its own tests: tests/test_radix_run.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from radix_rows import python_loop

from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.sweep import RowSpec, SweepContext, run_row
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload, unique_blocks
from sage_cli.benchmark.table import run_caption
from sage_eviction import get_policy_class, native
from sage_eviction.registry import POLICIES

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

TIMINGS = ("wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us")


def _compiled_policies() -> list[str]:
    core = native.load(native.CORE)
    return list(core.compiled_policies()) if core is not None else []


def _figures(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key not in TIMINGS}


@pytest.fixture(scope="module", params=[3, 11])
def workload(request: pytest.FixtureRequest) -> Workload:
    return synthetic(requests=60, rate=20.0, seed=request.param)


def _capacity(workload: Workload, small: bool = True) -> int:
    """A tenth (small) or a third of the distinct blocks, at least what the largest request needs."""
    return max(min_capacity(workload), unique_blocks(workload) // (10 if small else 3))


def _row(workload: Workload, policy: str, capacity: int, compiled: bool) -> tuple[dict[str, Any], str]:
    simulator = Simulator(workload, policy, capacity, compiled=compiled, cost_model=CostModel())
    with python_loop():
        row = simulator.run().to_dict()
    return _figures(row), simulator.policy_calls


@pytest.mark.parametrize("policy", _compiled_policies() or ["lru"])
def test_a_policys_c_table_gives_the_rows_of_its_python_methods(workload: Workload, policy: str) -> None:
    if get_policy_class(policy).offline and policy != "belady":
        pytest.skip(f"{policy} is offline: the radix model runs belady only")  # none today
    for small in (True, False):
        capacity = _capacity(workload, small)
        compiled, compiled_calls = _row(workload, policy, capacity, compiled=True)
        pure, pure_calls = _row(workload, policy, capacity, compiled=False)
        assert compiled["evictions"] > 0 or not small  # the small cache evicts
        assert compiled == pure, (policy, capacity)
        assert (compiled_calls, pure_calls) == ("compiled", "python")


def test_a_policy_without_a_table_is_called_in_python_with_the_same_rows(
    workload: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    lru = get_policy_class("lru")

    class PluginLRU(lru):  # type: ignore[misc, valid-type]
        """A plugin: LRU's behaviour, but a class the compiled core has no table for."""

        name = "plugin-lru"

    monkeypatch.setitem(POLICIES, "plugin-lru", PluginLRU)
    capacity = _capacity(workload)
    plugin, plugin_calls = _row(workload, "plugin-lru", capacity, compiled=True)
    builtin, builtin_calls = _row(workload, "lru", capacity, compiled=True)
    assert (plugin_calls, builtin_calls) == ("python", "compiled")
    # the same figures; the policy's name is in the row and in its age histograms' labels
    assert json.loads(json.dumps(plugin).replace('"plugin-lru"', '"lru"')) == builtin


def test_the_run_block_and_the_caption_say_which_path_ran(workload: Workload) -> None:
    capacity = _capacity(workload)
    radix = run_row(SweepContext(workload, "radix", CostModel()), RowSpec(0, "lru", capacity))
    flat = run_row(SweepContext(workload, "flat", CostModel()), RowSpec(1, "lru", capacity))
    assert (radix.policy_calls, flat.policy_calls) == ("c-state", "c-state")  # the compiled loops
    with python_loop():  # the radix row over the CacheManager: the policy's C table
        table = run_row(SweepContext(workload, "radix", CostModel()), RowSpec(0, "lru", capacity))
    assert table.policy_calls == "compiled"
    assert _figures(table.row) == _figures(radix.row)
    with native.pure_python():  # the policy built for the row has no table: its methods are called
        pure = run_row(SweepContext(workload, "flat", CostModel()), RowSpec(2, "lru", capacity))
    assert pure.policy_calls == "python"
    assert _figures(pure.row) == _figures(flat.row)
    run = {"implementation": "compiled", "policy_calls": {"lru": "compiled", "gdsf": "python"}}
    assert run_caption(run) == "core: compiled; policies called in C: lru; in Python: gdsf"
    run["policy_calls"] = {"lru": "c-state; compiled", "fifo": "c-state", "gdsf": "compiled; python"}
    assert run_caption(run) == (
        "core: compiled; policies in C with their state: fifo; called in C: lru; in Python: gdsf"
    )
