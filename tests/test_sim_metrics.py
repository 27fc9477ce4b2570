"""Every metric of docs/architecture.md, "Metrics" in the simulator, on tiny traces computed by hand.

The cost model used here makes times easy to add up: a prefill step costs 0.01 s per computed
prompt token, a decode step 0.1 s, nothing else. Blocks hold 4 tokens.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest

from engine_adapter.sim.benchmark import run_benchmark
from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.simulator import SimResult, simulate
from engine_adapter.sim.workloads import SimRequest, Workload

BS = 4
COST = CostModel(
    name="test",
    prefill_base_s=0.0,
    prefill_per_token_s=0.01,
    prefill_attn_s=0.0,
    decode_base_s=0.1,
    decode_per_seq_s=0.0,
    decode_per_context_token_s=0.0,
)
MODELS = ["radix", "flat"]


def workload(*requests: tuple[float, Sequence[Hashable], int, int, str | None, str | None]) -> Workload:
    """Requests as (arrival, keys, input_len, output_len, tenant, session)."""
    return Workload(
        requests=[
            SimRequest(i, arrival, tuple(keys), input_len, output_len, tenant=tenant, session=session)
            for i, (arrival, keys, input_len, output_len, tenant, session) in enumerate(requests)
        ],
        block_size=BS,
        source="test",
    )


def run(w: Workload, capacity: int, model: str = "radix", policy: str = "lru") -> SimResult:
    return simulate(w, policy, capacity, cache_model=model, cost_model=COST)


# Three requests, far apart, on a cache with room for all: a, a+b+c, a+x.
SHARED = workload(
    (0.0, ["a", "b"], 8, 3, None, None),
    (100.0, ["a", "b", "c"], 12, 1, None, None),
    (200.0, ["a", "x"], 8, 2, None, None),
)


@pytest.mark.parametrize("model", MODELS)
def test_hit_rate_counts_prompt_tokens_served_from_cache(model: str) -> None:
    result = run(SHARED, 8, model)
    # Request 2 is served a and b (8 of 12 tokens), request 3 a (4 of 8): 12 of 28 tokens.
    assert result.hit_rate == pytest.approx(12 / 28)
    assert (result.block_hits, result.block_lookups) == (3, 7)
    assert result.evictions == 0
    assert result.re_prefill_rate == 0.0
    assert result.memory_utilization == 0.0  # no eviction, no sample
    assert (result.eviction_p50_us, result.eviction_p99_us) == (0.0, 0.0)
    assert result.requests == 3


@pytest.mark.parametrize("model", MODELS)
def test_ttft_tpot_and_throughput_on_the_virtual_clock(model: str) -> None:
    result = run(SHARED, 8, model)
    # TTFT: 8 tokens computed (0.08 s), 4 (0.04 s), 4 (0.04 s). Sorted [0.04, 0.04, 0.08].
    assert result.ttft_p50_s == pytest.approx(0.04)
    assert result.ttft_p99_s == pytest.approx(0.04 * 0.02 + 0.08 * 0.98)
    # TPOT: request 1 decodes 2 tokens in 0.2 s, request 3 one in 0.1 s; request 2 has none.
    assert result.tpot_p50_s == pytest.approx(0.1)
    assert result.tpot_p99_s == pytest.approx(0.1)
    # 34 tokens (prompts and outputs) from the first arrival to the last finish (200 + 0.04 + 0.1).
    assert result.throughput_tok_s == pytest.approx(34 / 200.14)
    assert result.preemptions == 0


@pytest.mark.parametrize("model", MODELS)
def test_re_prefill_rate_evictions_and_memory_utilization(model: str) -> None:
    # One block of cache: a, then b evicts a, then a comes back (a re-prefill) and evicts b.
    w = workload(
        (0.0, ["a"], 4, 1, None, None),
        (10.0, ["b"], 4, 1, None, None),
        (20.0, ["a"], 4, 1, None, None),
    )
    result = run(w, 1, model)
    assert result.evictions == 2
    assert result.re_prefill_rate == pytest.approx(1 / 2)  # a came back; b did not
    assert result.memory_utilization == pytest.approx(1.0)  # full right after each eviction
    assert result.hit_rate == 0.0
    assert result.eviction_p50_us > 0.0
    assert result.eviction_p99_us >= result.eviction_p50_us


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("label", ["tenant", "session"])
def test_fairness_is_jain_over_per_tenant_hit_rates(model: str, label: str) -> None:
    def req(
        arrival: float, keys: list[str], who: str
    ) -> tuple[float, list[str], int, int, str | None, str | None]:
        return (arrival, keys, 8, 1, who if label == "tenant" else None, who if label == "session" else None)

    # t1 asks a+b twice (hit rate 8/16 = 0.5); t2 asks c+d then e+f (hit rate 0).
    w = workload(
        req(0, ["a", "b"], "t1"),
        req(10, ["c", "d"], "t2"),
        req(20, ["a", "b"], "t1"),
        req(30, ["e", "f"], "t2"),
    )
    result = run(w, 6, model)
    assert result.hit_rate == pytest.approx(8 / 32)
    assert result.fairness_score == pytest.approx(0.5**2 / (2 * 0.5**2))  # (0.5 + 0)^2 / (2 * 0.25)
    one = workload((0.0, ["a", "b"], 8, 1, None, None), (10.0, ["a", "b"], 8, 1, None, None))
    assert run(one, 6, model).fairness_score == 1.0  # no tenant, no session: one group


def test_decode_growth_preempts_when_the_pool_is_short() -> None:
    # Two 1-block prompts decode 8 tokens each: 3 blocks apiece at the end. With 3 blocks in
    # all, both want their second block at the first decode step: one is preempted.
    w = workload((0.0, ["a"], 4, 9, None, None), (0.0, ["b"], 4, 9, None, None))
    tight = run(w, 3)
    assert tight.preemptions >= 1
    assert tight.requests == 2
    roomy = run(w, 6)
    assert roomy.preemptions == 0
    # Decode alone: 8 steps of 0.1 s after a 0.08 s prefill of both prompts.
    assert roomy.tpot_p50_s == pytest.approx(0.1)
    assert roomy.ttft_p50_s == pytest.approx(0.08)
    assert tight.throughput_tok_s < roomy.throughput_tok_s


def test_throughput_impact_is_relative_to_the_unbounded_cache(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_benchmark(
        policies=["lru", "fifo"],
        workload="synthetic",
        requests=120,
        seed=4,
        capacity_ratios=[0.1, 0.3],
        output=out,
    )
    rows = result["results"]
    unbounded = [row for row in rows if row["policy"] == "unbounded"]
    assert len(unbounded) == 1 and unbounded[0]["throughput_impact"] == 0.0
    assert unbounded[0]["evictions"] == 0
    reference = unbounded[0]["throughput_tok_s"]
    for row in rows:
        assert row["throughput_impact"] == pytest.approx(1 - row["throughput_tok_s"] / reference)
    capacities = result["settings"]["capacities"]
    assert sorted(
        (row["policy"], row["capacity_blocks"]) for row in rows if row["policy"] != "unbounded"
    ) == sorted((policy, capacity) for capacity in capacities for policy in ("lru", "fifo", "belady"))
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
