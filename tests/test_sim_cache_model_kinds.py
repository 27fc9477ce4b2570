"""The simulator's cache models as objects (issue 50, item 3): a name resolves to a model that
carries its options, refuses another model's, returns named records, and says whether and why a
row ran in a compiled loop; the benchmark's JSON and table show it."""

from __future__ import annotations

from typing import Any

import pytest

from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim import flat_run, radix_run
from engine_adapter.sim.benchmark import run_benchmark
from engine_adapter.sim.cache_model_kinds import (
    FlatCacheModel,
    RadixCacheModel,
    SGLangCacheModel,
    cache_model_for,
)
from engine_adapter.sim.cache_models import FlatLookup
from engine_adapter.sim.model_names import EVENT_LOOP_MODELS
from engine_adapter.sim.sim_result import ModelStats
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.synthetic import synthetic
from sage_cli.benchmark.table import run_caption
from sage_eviction import native

WORKLOAD = synthetic(requests=60, seed=2)


def native_loops_built() -> bool:
    return native.load(flat_run.LOOP_MODULE) is not None and radix_run.radix_loop() is not None


def test_each_name_resolves_to_its_model_with_its_options() -> None:
    assert [type(cache_model_for(name)).name for name in EVENT_LOOP_MODELS] == list(EVENT_LOOP_MODELS)
    radix = cache_model_for("radix", protect_queued=0.25, compress_on_evict="snapkv:0.5", compiled=False)
    assert radix == RadixCacheModel(protect_queued=0.25, compiled=False, compress_on_evict="snapkv:0.5")
    assert cache_model_for("sglang", schedule_policy="lpm") == SGLangCacheModel("lpm")
    assert cache_model_for("flat") == FlatCacheModel()
    assert Simulator(
        WORKLOAD, "lru", 400, cache_model="sglang", schedule_policy="lpm"
    ).model == SGLangCacheModel("lpm")


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("sglang", {"protect_queued": 0.5}, "sage's radix model's, not SGLang's"),
        ("flat", {"tiers": TierConfig(host_blocks=8)}, "need the radix cache model"),
        ("sglang", {"adaptive_batch": True}, "need the radix cache model"),
        ("radix", {"schedule_policy": "lpm"}, "is SGLang's: needs the sglang model"),
        ("sglang", {"schedule_policy": "hrrn"}, "unknown schedule policy 'hrrn'"),
        ("lru", {}, "unknown cache model 'lru'; cache models: radix, flat, sglang"),
    ],
)
def test_an_option_of_another_model_is_refused(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cache_model_for(name, **options)


def test_the_models_return_named_records() -> None:
    for name in EVENT_LOOP_MODELS:
        sim = Simulator(WORKLOAD, "lru", 400, cache_model=name)
        st = sim.start_run()
        model = st.cache if st.cache is not None else st.flat
        assert model is not None
        assert isinstance(model.stats(), ModelStats)
    flat = Simulator(WORKLOAD, "lru", 400, cache_model="flat").start_run().flat
    assert flat is not None
    first = WORKLOAD.requests[0]
    found = flat.lookup(first.block_hashes, first.input_len, WORKLOAD.block_size)
    assert found == FlatLookup(hit_blocks=0, served_tokens=0)


def _why(policy: str, **options: Any) -> str | None:
    sim = Simulator(WORKLOAD, policy, 400, **options)
    sim.run()
    assert sim.event_loop == ("compiled" if sim.python_because is None else "python")
    return sim.python_because


@pytest.mark.skipif(not native_loops_built(), reason="the compiled loops are not built here")
def test_a_row_says_whether_and_why_it_ran_compiled() -> None:
    assert _why("lru") is None
    assert _why("lru", cache_model="flat") is None
    assert _why("lru", tiers=TierConfig(host_blocks=50)) == "KV tiers"
    assert _why("lru", protect_queued=0.2) is None  # compiled since issue 50, item 4
    assert _why("lru", protect_queued=0.2, adaptive_batch=True) is None  # both since issue 50, item 4
    assert _why("lru", compress_on_evict="knorm:0.5") == "compress-on-evict"
    assert _why("lru", compiled=False) == "compiled=False"
    assert _why("slru") == "slru has no kind in the compiled loop"
    assert _why("lfu", cache_model="flat") is None  # its state in C since issue 50, item 1
    assert _why("slru", cache_model="flat") == "slru keeps no state in C, called through its C table"
    assert _why("lru", cache_model="sglang") == "SGLang's tree is modelled in Python"


@pytest.mark.skipif(not native_loops_built(), reason="the compiled loops are not built here")
def test_the_json_rows_and_the_table_say_which_rows_ran_in_python() -> None:
    result = run_benchmark(
        mode="sim", requests=60, seed=2, policies=["lru", "slru"], capacity_blocks=[400], jobs=1
    )
    loops = {row["policy"]: row["event_loop"] for row in result["results"]}
    assert loops["lru"] == "compiled" and loops["slru"] == "python (slru has no kind in the compiled loop)"
    assert result["run"]["python_loops"] == {"slru": "slru has no kind in the compiled loop"}
    caption = run_caption(result["run"])
    assert (
        caption is not None and "Python event loop: slru (slru has no kind in the compiled loop)" in caption
    )
