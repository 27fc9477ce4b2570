"""The table of a policy benchmark (one row per policy and cache size), and where a result goes.

The simulator, a live engine and a vLLM server all return ``{"results": [row, ...], ...}`` with
flat rows; `results_table` shows the columns the rows have (preemptions among them: at a small
cache every row may preempt, Belady's included) and, under them, the simulator's saturation
warnings (``result["saturation"]["warnings"]``: when the median TTFT is queueing, not prefill);
`save_and_show` writes ``--output`` (for the engine modes; the simulator writes its own) and
prints the table or ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sage_cli.output import Output, format_cell

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["cost_model_name", "results_table", "run_caption", "saturation_warnings", "save_and_show"]


# The table's columns (key, title, format); --json and --output carry every field.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("hit_rate", "Hit", "percent"),
    ("re_prefill_rate", "Re-prefill", "percent"),
    ("regret_ratio", "Regret", "percent"),
    ("fairness_score", "Fair", "ratio"),
    ("memory_utilization", "Util", "percent"),
    ("evictions", "Evicted", "int"),
    ("preemptions", "Preempted", "int"),
    ("eviction_p50_us", "p50 µs", "number"),
    ("ttft_p50_s", "TTFT p50 s", "number"),
    ("throughput_impact", "Tput loss", "percent"),
)

# With KV tiers (--host-capacity-ratio): the hits by tier and what loading cost against recomputing.
_TIER_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("host_policy", "Host", "text"),
    ("host_capacity_blocks", "Host blocks", "int"),
    ("block_hit_ratio", "Block hit", "percent"),
    ("device_hit_ratio", "Device", "percent"),
    ("host_hit_ratio", "Host hit", "percent"),
    ("disk_hit_ratio", "Disk hit", "percent"),
    ("prefetch_hits", "Prefetched", "int"),
    ("load_s", "Load s", "number"),
    ("recompute_s", "Recompute s", "number"),
    ("ttft_p50_s", "TTFT p50 s", "number"),
    ("throughput_tok_s", "Tok/s", "number"),
)

# With --adaptive-batch: each policy without and with it, on the figures the batch limit moves.
_ADAPTIVE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("adaptive_batch", "Adaptive", "yesno"),
    ("hit_rate", "Hit", "percent"),
    ("re_prefill_rate", "Re-prefill", "percent"),
    ("evictions", "Evicted", "int"),
    ("preemptions", "Preempted", "int"),
    ("throughput_tok_s", "Tok/s", "number"),
    ("ttft_p99_s", "TTFT p99 s", "number"),
    ("batch_changes", "Batch changes", "int"),
)

# With --replicas: the fleet rows, routers side by side.
_FLEET_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("router", "Router", "text"),
    ("replicas", "Replicas", "int"),
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks each", "int"),
    ("block_hit_ratio", "Block hit", "percent"),
    ("load_spread", "Load max/mean", "ratio"),
    ("ttft_p50_s", "TTFT p50 s", "number"),
    ("ttft_p99_s", "TTFT p99 s", "number"),
    ("throughput_tok_s", "Tok/s", "number"),
    ("preemptions", "Preempted", "int"),
)

# With --engine-url ROUTER --worker-url ...: real engines behind a real router, measured on the
# engines' own counters (sage_cli.benchmark.remote); "served" is each engine's finished requests.
_ROUTED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("router", "Router", "text"),
    ("replicas", "Engines", "int"),
    ("policy", "Policy", "text"),
    ("hit_rate", "Fleet hit", "percent"),
    ("load_spread", "Load max/mean", "ratio"),
    ("served", "Served", "text"),
    ("ttft_p50_s", "TTFT p50 s", "number"),
    ("ttft_p99_s", "TTFT p99 s", "number"),
    ("tpot_p50_s", "TPOT p50 s", "number"),
    ("throughput_tok_s", "Tok/s", "number"),
    ("failed", "Failed", "int"),
)


def _policy_calls(calls: Any) -> list[str]:
    """Which rows' policies ran in C with their state in C ("c-state", the flat cache's
    `FlatState`), which the cache called through their C tables ("compiled", or both), and which
    through Python (any row of the policy)."""
    if not isinstance(calls, dict) or not calls:
        return []
    groups: dict[str, list[str]] = {"state": [], "table": [], "python": []}
    for policy, path in sorted(calls.items(), key=lambda item: str(item[0])):
        paths = set(str(path).split("; "))
        group = "state" if paths == {"c-state"} else "table" if paths <= {"c-state", "compiled"} else "python"
        groups[group].append(str(policy))
    labels = {"state": "policies in C with their state", "table": "called in C", "python": "in Python"}
    parts = [f"{labels[group]}: {', '.join(names)}" for group, names in groups.items() if names]
    if groups["table"] and not groups["state"]:
        parts[0] = "policies " + parts[0]
    return parts


def run_caption(run: Any) -> str | None:
    """How the simulator's rows ran, under the table: the implementation of the core (compiled or
    pure Python) and the executor, e.g. "core: compiled; 2 processes; 4.1 s"."""
    if not isinstance(run, dict):
        return None
    parts = []
    if run.get("implementation"):
        parts.append(f"core: {run['implementation']}")
    parts.extend(_policy_calls(run.get("policy_calls")))
    loops = run.get("python_loops")
    if isinstance(loops, dict) and loops:
        slow = ", ".join(f"{policy} ({why})" for policy, why in sorted(loops.items()))
        parts.append(f"Python event loop: {slow}")
    executor = run.get("executor")
    if executor == "ray":
        parts.append(f"Ray tasks at {run.get('ray_address')}")
    elif executor == "processes":
        parts.append(f"{run.get('workers')} processes")
    elif executor == "in-process":
        parts.append("1 process")
    wall = run.get("wall_s")
    if isinstance(wall, int | float) and not isinstance(wall, bool):
        parts.append(f"{wall:.1f} s")
    return "; ".join(parts) or None


def saturation_warnings(result: dict[str, Any]) -> list[str]:
    """The simulator's saturation warnings (none for the engine modes, which measure real times)."""
    saturation = result.get("saturation")
    warnings = saturation.get("warnings") if isinstance(saturation, dict) else None
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


# With --compress-on-evict: each policy dropping, then compressing, what it evicts.
_COMPRESS_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("compress_on_evict", "Compress", "text"),
    ("hit_rate", "Hit", "percent"),
    ("re_prefill_rate", "Re-prefill", "percent"),
    ("evictions", "Evicted", "int"),
    ("compressions", "Compressed", "int"),
    ("compressed_hits", "Comp. hits", "int"),
    ("compressed_hit_tokens", "Comp. hit tok", "int"),
    ("ttft_p50_s", "TTFT p50 s", "number"),
    ("throughput_tok_s", "Tok/s", "number"),
)


# With prompt-cache contracts in the trace (cache_ttl_s, cache_breakpoint, cache_salt): what the
# contracts cost and bought, per tier (the row's "cache_contract", flattened by `_with_contract`).
_CONTRACT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("host_capacity_blocks", "Host blocks", "int"),
    ("hit_rate", "Hit", "percent"),
    ("retention_hit_blocks", "Retained hits", "int"),
    ("retention_broken_blocks", "Breaks", "int"),
    *(
        (f"{what}_{tier}", f"{title} {tier}", "int")
        for what, title in (("written", "Wrote"), ("read", "Read"))
        for tier in ("device", "host", "disk")
    ),
    *((f"idle_{tier}", f"Idle {tier} blk·s", "number") for tier in ("device", "host", "disk")),
    ("ttft_p50_s", "TTFT p50 s", "number"),
)


def _with_contract(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its ``cache_contract`` figures as flat keys (tokens written and read, idle
    block-seconds, per tier; a tier the row has no capacity for left out)."""
    contract = row.get("cache_contract")
    if not isinstance(contract, dict):
        return row
    tiers = ["device"]
    tiers += ["host"] * bool(row.get("host_capacity_blocks")) + ["disk"] * bool(
        row.get("disk_capacity_blocks")
    )
    flat = {k: v for k, v in contract.items() if not isinstance(v, dict)}
    for what, prefix in (("written_tokens", "written"), ("read_tokens", "read"), ("idle_block_s", "idle")):
        figures = contract.get(what)
        if isinstance(figures, dict):
            flat.update({f"{prefix}_{tier}": figures.get(tier) for tier in tiers})
    return {**row, **flat}


def results_table(result: dict[str, Any]) -> RenderableType:
    """The rows ``run_benchmark`` returned, one per policy and capacity, as a table, and any
    saturation warning under it."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rows = result.get("results", result.get("rows"))
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return "No results."
    rows = [_with_contract(_with_block_hit_ratio(row)) for row in rows]
    present = {key for row in rows for key in row}
    adaptive = any(row.get("adaptive_batch") for row in rows)
    tiered = any(row.get("host_policy") for row in rows)
    fleet = any(row.get("router") for row in rows)
    compressed = any(row.get("compress_on_evict") for row in rows)
    chosen = _TIER_COLUMNS if tiered else _COMPRESS_COLUMNS if compressed else _COLUMNS
    chosen = _CONTRACT_COLUMNS if any(row.get("cache_contract") for row in rows) else chosen
    chosen = _ADAPTIVE_COLUMNS if adaptive and not (tiered or compressed) else chosen
    chosen = _FLEET_COLUMNS if fleet else chosen
    chosen = _ROUTED_COLUMNS if any(row.get("workers") for row in rows) else chosen
    columns = [c for c in chosen if c[0] in present]
    if not columns:  # rows of another shape: show them as they are
        keys = list(dict.fromkeys(key for row in rows for key in row))
        columns = [(key, key, "number") for key in keys]
    table = Table(
        title="Fleet routing benchmark" if fleet else "Eviction policy benchmark",
        title_justify="left",
        caption=run_caption(result.get("run")),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for key, title, _ in columns:
        widest_word = max(len(word) for word in title.split())
        table.add_column(
            title,
            justify="left" if key in ("policy", "router") else "right",
            min_width=widest_word,
            no_wrap=key == "policy",
        )
    for row in rows:
        table.add_row(*(format_cell(row.get(key), kind) for key, _, kind in columns))
    notes = [Text(f"cost model: {name}")] if (name := cost_model_name(result)) else []
    warnings = saturation_warnings(result)
    if not warnings and not notes:
        return table
    return Group(table, *notes, *(Text(f"warning: {w}", style="bold yellow") for w in warnings))


def cost_model_name(result: dict[str, Any]) -> str | None:
    """What the simulator's times come from (its cost model's `name`), said under the table so that
    a TTFT is never read without it; None for the engine modes, which measure real times."""
    settings = result.get("settings")
    cost = settings.get("cost_model") if isinstance(settings, dict) else None
    name = cost.get("name") if isinstance(cost, dict) else None
    return str(name) if name else None


def _with_block_hit_ratio(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``block_hit_ratio`` (block hits / block lookups) when it has both counts."""
    hits, lookups = row.get("block_hits"), row.get("block_lookups")
    if isinstance(hits, int) and isinstance(lookups, int) and lookups > 0:
        return {**row, "block_hit_ratio": hits / lookups}
    return row


def save_and_show(result: dict[str, Any], output: Path | None, json_out: bool) -> None:
    """An engine-mode result: written to --output as JSON (the simulator writes its own), then
    shown as the table or as JSON."""
    if output is not None:
        output.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    Output(json_out).result(result, lambda: results_table(result), wide=True)
