"""Hypothesis strategies and cost models shared by the simulator's tests (tests/test_flat_run.py,
tests/test_radix_run.py, tests/test_table_readers.py, tests/test_sim_trace_memory.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.workloads import SimRequest

# binary fractions: clocks land exactly on arrivals (the boundaries of `steps_until`)
BINARY = CostModel(
    prefill_base_s=0.25,
    prefill_per_token_s=0.0,
    prefill_attn_s=0.0,
    decode_base_s=0.125,
    decode_per_seq_s=0.0,
    decode_per_context_token_s=0.0,
)
COSTS = (
    CostModel(),
    CostModel(prefill_base_s=0.0, decode_base_s=0.02, decode_per_context_token_s=1e-6),
    CostModel(decode_base_s=0.0, decode_per_seq_s=0.0, decode_per_context_token_s=0.0),
    CostModel(prefill_base_s=0.003, prefill_per_token_s=0.0, prefill_attn_s=0.0, decode_base_s=0.003),
    CostModel(prefill_per_token_s=1.3e-4, prefill_attn_s=7.7e-8, decode_per_seq_s=3.1e-3),
    # each term alone sets the clock's last bits: an operation out of order shows in the TTFTs
    CostModel(prefill_base_s=0.0, prefill_per_token_s=0.0, prefill_attn_s=1.1e-3, decode_base_s=0.0),
    CostModel(
        prefill_base_s=0.0,
        prefill_per_token_s=0.0,
        prefill_attn_s=0.0,
        decode_base_s=0.0,
        decode_per_seq_s=0.0,
        decode_per_context_token_s=1.3e-3,
    ),
    BINARY,
)


@st.composite
def workloads(draw: Callable[..., Any]) -> tuple[list[SimRequest], int]:
    """Small workloads: arrival ties and bursts, repeated keys, partial last blocks (a prompt
    shorter than its blocks) and longer prompts, output lengths 0 and 1, tenants or sessions."""
    block_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(0, 24))
    times = st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.5, 0.25, 0.375, 1.0, 1.5]) | st.floats(0.0, 3.0)
    arrivals = sorted(draw(st.lists(times, min_size=n, max_size=n)))
    tenants = draw(st.booleans())
    requests = []
    for i, arrival in enumerate(arrivals):
        keys = draw(st.lists(st.integers(-3, 14), max_size=7))
        extra = st.just(0) | st.integers(-block_size + 1, block_size)  # whole blocks, or a part more or less
        input_len = max(0, len(keys) * block_size + draw(extra))
        label = st.none() | st.sampled_from(["a", "b", "c"])
        requests.append(
            SimRequest(
                i,
                arrival,
                tuple(keys),
                input_len,
                draw(st.sampled_from([0, 1, 1, 2]) | st.integers(1, 60)),
                tenant=draw(label) if tenants else None,
                session=draw(label),
            )
        )
    return requests, block_size


@st.composite
def synthetic_params(draw: Callable[..., Any], block_sizes: tuple[int, ...] = ()) -> dict[str, Any]:
    """Keyword arguments of `synthetic` / `synthetic_stream`: request counts, seeds, arrival
    patterns, sessions, turns, tenants (None: synthetic's one tenant), prompt caps, two priority
    classes, and a block size drawn from `block_sizes` (none: the generator's)."""
    tenants = draw(st.none() | st.integers(0, 3))
    params: dict[str, Any] = {
        "requests": draw(st.integers(1, 80)),
        "seed": draw(st.integers(0, 10_000)),
        "arrival": draw(st.sampled_from(["poisson", "bursty", "periodic"])),
        "sessions": draw(st.integers(1, 10)),
        "turns": draw(st.floats(1.0, 6.0)),
        "max_input_tokens": draw(st.integers(64, 4096)),
        "priority_weights": [1.0, 2.0],
        **({} if tenants is None else {"tenants": tenants}),
    }
    if block_sizes:
        params["block_size"] = draw(st.sampled_from(block_sizes))
    return params
