"""The simulator's library as a notebook uses it (issue 48): `simulate` takes a comma-separated
string, specs with params (each row keeps its spec), policy classes and instances of the
session (`register_policy`, the one registry; built-ins stay on the compiled paths, a class of
the session runs through Python and its rows say so); its errors name the Python arguments;
`repr(results)` is a summary; `dir(engine_adapter.sim)` shows the library; a saturated row is a
Python warning, and a shipped cost model keeps up with the shipped Mooncake traces.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine_adapter.sim as sim
from engine_adapter.sim.api import BenchmarkError, SaturationWarning, Trace, simulate
from engine_adapter.sim.cost_models import SHIPPED_COST_MODELS
from sage_eviction import policy_label, register_policy, split_policy_specs
from sage_eviction.policies import POLICIES, LRUPolicy, SLRUPolicy
from sage_eviction.registry import _session_names, split_specs

# The small caches of this workload queue (a result in itself); the one test of the warning
# catches it, the others leave it be.
pytestmark = pytest.mark.filterwarnings("ignore::engine_adapter.sim.saturation.SaturationWarning")

TRACE = Trace.synthetic(requests=150, seed=3)
RATIO = [0.3]


@pytest.fixture(autouse=True)
def _forget_session_policies() -> Iterator[None]:
    """Each test registers its own classes; the registry is left as it was found."""
    before = dict(POLICIES)
    yield
    for name in list(POLICIES):
        if name not in before:
            del POLICIES[name]
    _session_names.clear()


def _labels(results: sim.Results) -> list[str]:
    return [row["policy"] for row in results.rows]


def test_a_comma_separated_string_is_a_list_of_specs() -> None:
    results = simulate(TRACE, "lru,arc", capacity_ratios=RATIO)
    assert _labels(results) == ["lru", "arc", "belady", "unbounded"]
    listed = simulate(TRACE, ["lru", "arc"], capacity_ratios=RATIO)
    assert [r["hit_rate"] for r in results.rows] == [r["hit_rate"] for r in listed.rows]


def test_rows_keep_their_params_and_are_told_apart() -> None:
    both = "slru:protected_threshold=1,protected_ratio=0.5"
    specs = f"slru,slru:protected_ratio=0.1,{both}"
    results = simulate(TRACE, specs, capacity_ratios=RATIO, cache_model="flat")
    labels = _labels(results)
    assert labels[:3] == ["slru", "slru:protected_ratio=0.1", both]
    hits = [row["hit_rate"] for row in results.rows[:3]]
    assert len(set(hits)) == 3  # the params reached the policy: three different rows
    assert list(results.raw["run"]["policy_calls"])[:3] == labels[:3]
    assert "slru:protected_ratio=0.1" in repr(results)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["lru", "LRU", "s3-fifo", "slru:protected_threshold=3", "arc", " mq "])))
def test_a_list_of_specs_reads_back_as_itself(items: list[str]) -> None:
    """Joined with commas and split again, specs come back in order, named as rows name them."""
    labels = split_policy_specs(",".join(items))
    assert labels == list(dict.fromkeys(policy_label(item) for item in items))  # each item alone
    assert len(split_specs(",".join(items))) == len(items)
    assert all(label == label.strip().lower() for label in labels)
    assert ("slru:protected_threshold=3" in labels) == ("slru:protected_threshold=3" in items)


class MyLRU(LRUPolicy):
    """A notebook's policy: LRU under its own name."""


def test_classes_and_instances_of_the_session_run_through_python() -> None:
    results = simulate(TRACE, [MyLRU(), "lru", SLRUPolicy(protected_threshold=5)], capacity_ratios=RATIO)
    rows = {row["policy"]: row for row in results.rows}
    assert list(rows) == ["mylru", "lru", "slru:protected_threshold=5", "belady", "unbounded"]
    assert rows["mylru"]["policy_calls"] == "python"  # a class of the session: the Python path
    assert rows["lru"]["policy_calls"] in ("c-state", "compiled")  # a built-in: still compiled
    assert rows["mylru"]["hit_rate"] == rows["lru"]["hit_rate"]  # the same policy, both paths
    again = simulate(TRACE, MyLRU, capacity_ratios=RATIO)
    assert _labels(again)[0] == "mylru" and again.rows[0]["hit_rate"] == rows["mylru"]["hit_rate"]
    with pytest.raises(BenchmarkError, match="jobs=1"):
        simulate(TRACE, [MyLRU], capacity_ratios=RATIO, jobs=2)


def test_register_policy_is_the_one_registry() -> None:
    class Mine(LRUPolicy):
        name = "mine"

    assert register_policy(Mine) is Mine and POLICIES["mine"] is Mine
    assert "mine" in split_policy_specs("lru,mine")

    class Mine2(LRUPolicy):  # a notebook cell run again: the same name, a new class
        name = "mine"

    assert register_policy(Mine2) is Mine2 and POLICIES["mine"] is Mine2
    class Other(LRUPolicy):  # inherits the name "lru": not its own
        pass

    with pytest.raises(ValueError, match="built-in"):
        register_policy(Other, name="lru")
    with pytest.raises(TypeError):
        register_policy(object)  # type: ignore[arg-type]
    assert register_policy(LRUPolicy) is LRUPolicy and POLICIES["lru"] is LRUPolicy


def test_errors_name_the_python_arguments() -> None:
    with pytest.raises(BenchmarkError, match=r"capacity_ratios=\[0.05\]") as info:
        simulate(TRACE, "lru", capacities=[0.05])
    assert "--" not in str(info.value)
    with pytest.raises(TypeError, match=r"capacities must be a list"):
        simulate(TRACE, "lru", capacities=1000)  # type: ignore[arg-type]
    with pytest.raises(BenchmarkError, match="not both"):
        simulate(TRACE, "lru", capacities=[100], capacity_ratios=[0.1])
    with pytest.raises(TypeError, match=r"did you mean capacities .*capacity_ratios"):
        simulate(TRACE, "lru", capacity=100)
    with pytest.raises(TypeError, match="did you mean cache_model"):
        simulate(TRACE, "lru", cache_modle="flat")
    with pytest.raises(BenchmarkError) as beyond:
        simulate(TRACE, "lru", capacities=[10**9])
    assert "--" not in str(beyond.value) and "10" in str(beyond.value)


def test_the_package_shows_its_library_and_results_sum_up() -> None:
    names = dir(sim)
    assert {"Trace", "simulate", "Results", "register_policy", "SaturationWarning"} <= set(names)
    assert "annotations" not in names and "Any" not in names
    results = simulate(TRACE, "lru", capacity_ratios=RATIO)
    text = repr(results)
    assert len(text) < 1000 and text.count("\n") == 1 + len(results.rows)
    assert text.startswith("<Results: synthetic, 150 requests, radix model, 3 rows")
    assert '"results"' not in text  # not the JSON document


def test_a_saturated_row_warns_in_python() -> None:
    with pytest.warns(SaturationWarning, match="saturated"):
        results = simulate(TRACE, "lru", capacity_ratios=RATIO)
    assert results.raw["saturation"]["saturated_rows"]


@pytest.mark.slow
@pytest.mark.parametrize("trace", ["mooncake:conversation", "mooncake:synthetic"])
def test_the_shipped_cost_model_keeps_up_with_the_shipped_mooncake_traces(trace: str) -> None:
    """The README's headline rows (lru, arc, s3fifo at 5 % and 10 %) are not saturated with the
    shipped cost model; with the default one they are, and the warning names the shipped one."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SaturationWarning)
        fast = simulate(
            Trace.shipped(trace), "lru,arc,s3fifo", capacity_ratios=[0.05, 0.1],
            cost_model_path=SHIPPED_COST_MODELS[0], jobs=2,
        )  # fmt: skip
    assert fast.raw["saturation"]["saturated_rows"] == []
    assert fast.settings["cost_model"]["name"].startswith("llama-1b-bf16 on H100")
    with pytest.warns(SaturationWarning, match=SHIPPED_COST_MODELS[0]):
        simulate(Trace.shipped(trace), "lru", capacity_ratios=[0.1], jobs=2)
