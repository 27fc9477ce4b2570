"""Whether a benchmark's rows measure the cache or a queue: `saturation`.

A row is *saturated* when its median TTFT is more than `SATURATION_FACTOR` times what an idle
engine of the cost model takes to prefill the workload's mean prompt: requests then wait, most
of their TTFT, behind others, and TTFT, TPOT and throughput measure that queue (hit and
re-prefill rates do not depend on time and are unaffected). Across the simulator's workloads
the two kinds of row are far apart: 1 to 6 times the idle prefill where the engine keeps up,
80 to 14,000 times where it does not (the Mooncake conversation trace on the default 7B/A100
cost model: 11,697 times, 14,344 s, for the unbounded cache itself).

Two cases, two messages: the unbounded reference row saturated means the workload overloads
the modelled engine whatever the cache (a faster `--cost-model` would let the times speak of
the cache: `engine_adapter.sim.cost_models` ships such models, named in the warning); only
smaller caches saturated means their misses and preemptions are what builds the queue, a
result in itself.

Pure Python; imports the cost model and the workload records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.cost_models import SHIPPED_COST_MODELS
from engine_adapter.sim.workloads import Workload

__all__ = ["SATURATION_FACTOR", "SaturationWarning", "idle_prefill_s", "saturation"]

SATURATION_FACTOR = 10.0
"""A row whose median TTFT exceeds this many idle prefills of the mean prompt is saturated."""


class SaturationWarning(UserWarning):
    """The library's warning (`engine_adapter.sim.api.simulate`) that rows measure a queue; the
    CLI prints the same lines itself."""


def idle_prefill_s(workload: Workload, cost: CostModel) -> tuple[float, int]:
    """Seconds an idle engine takes to prefill the workload's mean prompt, and that prompt's tokens."""
    requests = workload.requests
    mean_prompt = round(sum(r.input_len for r in requests) / len(requests)) if requests else 0
    seconds = cost.step_time(
        prefill_tokens=mean_prompt, prefill_batch=1, cached_tokens=0, decode_batch=0, context_tokens=0
    )
    return seconds, mean_prompt


def _shipped() -> str:
    return ", ".join(SHIPPED_COST_MODELS)


def _label(row: dict[str, Any]) -> str:
    label = f"{row['policy']}@{row['capacity_blocks']}"
    return label + " (adaptive)" if row.get("adaptive_batch") else label


def saturation(
    rows: Sequence[dict[str, Any]], workload: Workload, cost: CostModel, reference: str
) -> dict[str, Any]:
    """The saturated rows and what to tell the user about them.

    Args:
        rows: The benchmark's rows (``ttft_p50_s``, ``policy``, ``capacity_blocks``).
        workload: The workload they ran.
        cost: The cost model they ran on.
        reference: The policy name of the unbounded reference row.

    Returns:
        ``{"idle_prefill_s", "mean_prompt_tokens", "factor", "saturated_rows", "reference_saturated",
        "warnings"}``: the rows as ``policy@blocks`` labels, the warnings as one line each
        (none when no row is saturated).
    """
    idle, mean_prompt = idle_prefill_s(workload, cost)
    limit = SATURATION_FACTOR * idle
    saturated = [row for row in rows if row["ttft_p50_s"] > limit]
    reference_rows = [row for row in saturated if row["policy"] == reference]
    warnings: list[str] = []
    if reference_rows:
        ttft = reference_rows[0]["ttft_p50_s"]
        warnings.append(
            f"saturated: the workload overloads the modelled engine: even the unbounded cache waits "
            f"a median TTFT of {ttft:,.1f} s, {ttft / idle:,.0f}x the {idle:.3g} s an idle engine takes "
            f"to prefill the mean prompt ({mean_prompt:,} tokens); TTFT, TPOT and throughput measure "
            f"the queue, not the cache (hit and re-prefill rates stand); for times that speak of the "
            f"cache, give an engine that keeps up: a shipped cost model ({_shipped()}: --cost-model "
            f"{SHIPPED_COST_MODELS[0]}, cost_model_path=\"{SHIPPED_COST_MODELS[0]}\" in Python) "
            f"or your own FILE.yaml"
        )
    elif saturated:
        names = ", ".join(_label(row) for row in saturated[:6])
        more = f" and {len(saturated) - 6} more" if len(saturated) > 6 else ""
        warnings.append(
            f"saturated at {len(saturated)} of {len(rows)} rows ({names}{more}): median TTFT over "
            f"{SATURATION_FACTOR:g}x an idle prefill of the mean prompt ({idle:.3g} s), while the "
            f"unbounded cache keeps up: at these sizes misses and preemptions build a queue"
        )
    return {
        "idle_prefill_s": idle,
        "mean_prompt_tokens": mean_prompt,
        "factor": SATURATION_FACTOR,
        "saturated_rows": [_label(row) for row in saturated],
        "reference_saturated": bool(reference_rows),
        "warnings": warnings,
    }
