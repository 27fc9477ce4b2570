"""The ages and regret lines of ``sage llm eviction stats`` and the ``top`` view.

Reads the engine's stats object (``GET /v1/eviction/stats``; docs/architecture.md, "Ages and
regret"): the regret ratio and the thrashing warning with its threshold, and for each age
histogram the bucket bounds holding its median and 90th percentile, per policy, all tenants
together (a histogram's quantile is known to its bucket). Imports nothing of the engine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["age_lines", "histogram_quantile", "regret_line", "thrashing_warning"]

_TITLES = (
    ("age_at_hit_seconds", "Age At Hit", "s"),
    ("age_at_eviction_seconds", "Age At Eviction", "s"),
    ("reuse_distance_blocks", "Reuse Distance", "blocks"),
    ("regret_age_seconds", "Regret After", "s"),
)


def histogram_quantile(bounds: list[float], counts: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` (inf past the last bound; None when
    empty)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for i, count in enumerate(counts):
        seen += count
        if count and seen >= q * total:
            return bounds[i] if i < len(bounds) else float("inf")
    return float("inf")


def _duration(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "longer"
    if unit == "blocks":
        return f"<={value:g}"
    if value >= 3600:
        return f"<={value / 3600:g}h"
    if value >= 60:
        return f"<={value / 60:g}m"
    return f"<={value:g}s"


def age_lines(stats: dict[str, Any]) -> list[str]:
    """One line per histogram kind the stats carry: each policy's p50 / p90 and its count."""
    merged: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
    for h in stats.get("age_histograms") or ():
        if not isinstance(h, dict):
            continue
        key = (str(h.get("kind")), str(h.get("policy")))
        bounds, counts = list(h.get("le") or ()), list(h.get("counts") or ())
        if key in merged:
            counts = [a + b for a, b in zip(merged[key][1], counts, strict=True)]
        merged[key] = (bounds, counts)
    lines = []
    for kind, title, unit in _TITLES:
        parts = []
        for (k, policy), (bounds, counts) in sorted(merged.items()):
            if k == kind and sum(counts):
                p50 = _duration(histogram_quantile(bounds, counts, 0.5), unit)
                p90 = _duration(histogram_quantile(bounds, counts, 0.9), unit)
                parts.append(f"{policy} p50 {p50} p90 {p90} (n={sum(counts)})")
        if parts:
            lines.append(f"  {title}: " + "; ".join(parts))
    return lines


def regret_line(stats: dict[str, Any]) -> str | None:
    """``Regret Ratio: ...`` when the stats carry it (engines before issue 32 do not)."""
    ratio = stats.get("regret_ratio")
    if not isinstance(ratio, int | float):
        return None
    return (
        f"  Regret Ratio: {ratio:.1%} ({stats.get('regrets', 0)} avoidable of "
        f"{stats.get('missed_blocks', 0)} missed blocks; {stats.get('ghost_hits', 0)} were recent evictions)"
    )


def thrashing_warning(stats: dict[str, Any]) -> str | None:
    """The thrashing warning with its threshold, while the engine says it is thrashing."""
    if not stats.get("thrashing"):
        return None
    window = stats.get("window_regret_ratio")
    threshold = stats.get("thrashing_threshold")
    now = f"{window:.0%}" if isinstance(window, int | float) else "?"
    limit = f"{threshold:.0%}" if isinstance(threshold, int | float) else "?"
    return f"THRASHING: {now} of recently missed blocks were avoidable evictions (threshold {limit})"
