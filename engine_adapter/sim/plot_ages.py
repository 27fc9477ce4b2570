"""The age panels of ``sage llm benchmark --plot``: block age at hit and at eviction per policy.

Each radix-model row carries its age histograms on the virtual clock (`SimResult.age_histograms`,
the cache's `ages`): one panel per kind draws, for each policy at the smallest cache size, the
share of hits (or evictions) at or under each bucket bound, all tenants together, on a log axis
(docs/architecture.md, "Ages and regret"). A policy that evicts blocks a moment before their reuse
shows evictions younger than its hits. Called by `plot.benchmark_figure`; matplotlib comes with
the axes it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["AGE_PANELS", "age_cdf", "draw_age_panels"]

AGE_PANELS = (
    ("age_at_hit_seconds", "block age at hit"),
    ("age_at_eviction_seconds", "block age at eviction"),
)
"""The histogram kinds drawn, with their panels' titles."""


def age_cdf(row: dict[str, Any], kind: str) -> tuple[list[float], list[float]] | None:
    """The row's `kind` histograms summed over tenants, as (bounds, share at or under each);
    None when it has none."""
    hists = [h for h in row.get("age_histograms", ()) if h["kind"] == kind]
    if not hists:
        return None
    counts = [sum(c) for c in zip(*(h["counts"] for h in hists), strict=True)]
    total = sum(counts)
    if not total:
        return None
    shares, seen = [], 0
    for count in counts[:-1]:  # the last bucket is +Inf: the line ends at 100 % beyond the axis
        seen += count
        shares.append(seen / total)
    return list(hists[0]["le"]), shares


def draw_age_panels(axes: Sequence[Any], rows: Sequence[dict[str, Any]], capacity: int) -> None:
    """One panel per `AGE_PANELS` kind on `axes`: each policy's CDF at `capacity`."""
    for ax, (kind, title) in zip(axes, AGE_PANELS, strict=False):
        for row in rows:
            if row["capacity_blocks"] != capacity:
                continue
            cdf = age_cdf(row, kind)
            if cdf is not None:
                ax.step(cdf[0], cdf[1], where="post", label=str(row["policy"]))
        ax.set_xscale("log")
        ax.set_xlabel("seconds (virtual clock)")
        ax.set_ylabel("share at or under")
        ax.set_ylim(0.0, 1.0)
        ax.set_title(f"{title} at {capacity} blocks")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
