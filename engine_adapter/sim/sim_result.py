"""`SimResult`: one row of the benchmark, as every cache model ends a run with it.

Its own module, importing nothing of the simulator, so that the event loop's records
(`run_state`), the fleet and the engine twins (`twins/`) all write the same row without
importing one another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ModelStats", "SimResult", "TierLoads"]


@dataclass(frozen=True, slots=True)
class TierLoads:
    """Blocks loaded back to the device from the host and from the disk tier (an allocation's or a
    prefetch's; both 0 without tiers)."""

    host_blocks: int = 0
    disk_blocks: int = 0


@dataclass(frozen=True, slots=True)
class ModelStats:
    """A cache model's own figures for the row (`stats()` of the radix, flat and sglang models;
    the rest of the row is the event loop's)."""

    re_prefill_rate: float
    memory_utilization: float  # 0.0 until something was evicted
    evictions: int
    eviction_p50_us: float
    eviction_p99_us: float
    preemptions: int


@dataclass(slots=True)
class SimResult:
    """One benchmark row: a policy at a capacity on a workload (keys as `run_benchmark` writes them).

    With KV tiers (docs/architecture.md, "Tiers"), `capacity_blocks` is the device pool's;
    `host_policy` and the capacities say what was below it; the block hits of first admissions
    split by the tier they came from (`device_hit_ratio + host_hit_ratio + disk_hit_ratio` is
    `block_hits / block_lookups`); `load_s` is the step time spent loading blocks back (every
    admission, re-admissions too) and `recompute_s` what prefilling those blocks again would have
    cost in the same steps instead; `prefetch_hits` counts the device hits whose blocks were
    loaded ahead of time while their request queued (`TierConfig.prefetch_blocks`). With
    compress-on-evict (`compress_on_evict` set), `compressions` counts the chains compressed and
    `compressed_hits` / `compressed_hit_tokens` the admissions served from one; a row without it
    has none of these keys (rows are unchanged when it is off). The radix model's rows carry the
    regret (`regrets`, `ghost_hits`, `regret_ratio` = regrets / missed blocks) and the age
    histograms on the virtual clock (`age_histograms`, `ages.HistogramSnapshot.to_dict` each;
    docs/architecture.md, "Ages and regret"); the flat model's have zeros and none. A radix row
    of a workload with prompt-cache contracts carries `cache_contract`
    (`contract_model.ContractRadixModel.contract_figures`); other rows have no such key.
    """

    policy: str
    capacity_blocks: int
    cache_model: str
    requests: int
    block_lookups: int
    block_hits: int
    hit_rate: float
    re_prefill_rate: float
    fairness_score: float
    memory_utilization: float
    evictions: int
    eviction_p50_us: float
    eviction_p99_us: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    throughput_tok_s: float
    throughput_impact: float
    preemptions: int
    wall_s: float
    lookups_per_s: float
    adaptive_batch: bool = False
    batch_changes: int = 0
    host_policy: str | None = None
    host_capacity_blocks: int = 0
    disk_capacity_blocks: int = 0
    device_hit_ratio: float = 0.0
    host_hit_ratio: float = 0.0
    disk_hit_ratio: float = 0.0
    load_s: float = 0.0
    recompute_s: float = 0.0
    prefetch_hits: int = 0
    compress_on_evict: str | None = None
    compressions: int = 0
    compressed_hits: int = 0
    compressed_hit_tokens: int = 0
    regrets: int = 0
    ghost_hits: int = 0
    regret_ratio: float = 0.0
    age_histograms: list[dict[str, Any]] = field(default_factory=list)
    cache_contract: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-able dict."""
        row = asdict(self)
        if self.compress_on_evict is None:
            for key in ("compress_on_evict", "compressions", "compressed_hits", "compressed_hit_tokens"):
                del row[key]
        if self.cache_contract is None:
            del row["cache_contract"]
        return row
