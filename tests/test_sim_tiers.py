"""KV tiers in the simulator and in ``sage llm benchmark`` (issue 30): the differential against one
cache of the summed size, golden numbers on a fixed trace, the cost of loads, and the options.

The differential: with write-back and promotion on a hit, a device LRU over a host LRU (and a
disk LRU under it) holds, request after request, exactly the blocks one LRU cache of the summed
capacity holds, when nothing but the request being admitted locks blocks (each request is
admitted and released before the next: no running sequences). Demotion keeps the global recency
order (the device evicts its least recent leaf, which becomes the host's most recent entry), and
admission loads blocks back one at a time, so each promotion frees its host slot before the next
demotion needs one. With running sequences (the simulator) the two differ: the running
sequences' blocks must all be on the device, so the device size, not the summed one, bounds how
many requests run at once, which changes when each request is admitted and what it finds
committed. On a slice whose largest request nearly fills the device the gap is large (the golden
test: 1,126 block hits with tiers against 996 for one cache, the tiers ahead); over the whole
trace, with room for the running batch, it is below 0.005 of the block hit ratio (the slow test).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_benchmark_cli import assert_one_line_error, sage

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tiers import TierConfig
from engine_adapter.sim.cost_model import LINKS, CostModel, CostModelError
from engine_adapter.sim.shipped_traces import shipped_trace
from engine_adapter.sim.simulator import simulate
from engine_adapter.sim.sources import load
from engine_adapter.sim.workloads import Workload, unique_blocks


@pytest.fixture(scope="module")
def mooncake() -> Workload:
    """The first 600 requests of the shipped Mooncake conversation trace."""
    return load("mooncake", path=shipped_trace("mooncake:conversation")[0], limit=600)


def hits_per_request(workload: Workload, manager: CacheManager) -> list[int]:
    """Admit and release each request in turn (no running sequences); its cached blocks."""
    bs = workload.block_size
    hits = []
    for i, r in enumerate(workload.requests):
        n = len(r.block_hashes) * bs
        alloc = manager.allocate(
            CacheRequest(i, num_tokens=n, block_keys=r.block_hashes, recompute_last_token=False)
        )
        manager.take_moves()
        manager.free_sequence(i, block_keys=r.block_hashes, num_computed_tokens=n)
        hits.append(alloc.num_cached_blocks)
    return hits


def manager(workload: Workload, blocks: int, tiers: TierConfig | None = None) -> CacheManager:
    ticks = itertools.count()
    return CacheManager(
        BlockAllocator(blocks, workload.block_size),
        record_events=False,
        clock=lambda: float(next(ticks)),
        tiers=tiers,
    )


@pytest.mark.parametrize("disk", [0, pytest.param(300, marks=pytest.mark.slow)])
def test_two_tier_lru_equals_one_lru_of_the_summed_size(mooncake: Workload, disk: int) -> None:
    device = max(len(r.block_hashes) for r in mooncake.requests) + 40
    host = 900
    one = hits_per_request(mooncake, manager(mooncake, device + host + disk))
    tiered = manager(mooncake, device, TierConfig(host_blocks=host, disk_blocks=disk))
    two = hits_per_request(mooncake, tiered)
    assert sum(one) > sum(hits_per_request(mooncake, manager(mooncake, device)))  # the tiers matter
    assert two == one
    host_stats = tiered.stats().tiers[0]
    assert host_stats.hits > 0 and host_stats.drops + (tiered.stats().tiers[-1].drops if disk else 0) > 0


def test_simulator_rows_with_a_host_tier_golden_numbers(mooncake: Workload) -> None:
    """Golden numbers of the radix model on the Mooncake slice, device 5 % + host 20 % of the
    distinct blocks, LRU on both, the A100 cost model with PCIe 5 loads (computed by this code;
    the differential test above is what says they are right)."""
    unique = unique_blocks(mooncake.requests)
    costs = CostModel().with_links(host="pcie5")
    device = max(int(unique * 0.05), 40)
    only = simulate(mooncake, "lru", device, cost_model=costs)
    tiered = simulate(
        mooncake, "lru", device, cost_model=costs, tiers=TierConfig(host_blocks=int(unique * 0.2))
    )
    one = simulate(mooncake, "lru", device + int(unique * 0.2), cost_model=costs)
    assert (unique, device) == (13_712, 685)
    assert (only.block_lookups, only.block_hits) == (16_495, 599)
    assert (tiered.block_hits, round(tiered.host_hit_ratio * tiered.block_lookups)) == (1_126, 527)
    assert one.block_hits == 996  # one cache of the summed size: see the module docstring
    assert tiered.device_hit_ratio + tiered.host_hit_ratio == pytest.approx(
        tiered.block_hits / tiered.block_lookups
    )
    assert tiered.disk_hit_ratio == 0.0 and only.load_s == 0.0 and only.host_policy is None
    # every load is far cheaper than prefilling the same blocks again, and the TTFT shows it
    assert 0 < tiered.load_s < tiered.recompute_s / 5
    assert tiered.ttft_p50_s < only.ttft_p50_s
    assert (tiered.host_policy, tiered.host_capacity_blocks) == ("lru", 2_742)


@pytest.mark.slow
def test_the_issue_target_on_the_whole_mooncake_trace() -> None:
    """Issue 30's target: device 5 % + host 20 % of the distinct blocks, LRU on both: a block hit
    ratio >= 0.35, within 0.005 of one LRU cache of 25 % (0.353; device-only 0.197)."""
    workload = load("mooncake", path=shipped_trace("mooncake:conversation")[0])
    unique = unique_blocks(workload.requests)
    costs = CostModel().with_links(host="pcie5")
    device, host = int(unique * 0.05), int(unique * 0.2)
    tiered = simulate(workload, "lru", device, cost_model=costs, tiers=TierConfig(host_blocks=host))
    one = simulate(workload, "lru", int(unique * 0.25), cost_model=costs)
    ratio = tiered.block_hits / tiered.block_lookups
    assert ratio >= 0.35
    assert abs(ratio - one.block_hits / one.block_lookups) <= 0.005
    assert tiered.device_hit_ratio == pytest.approx(0.197, abs=0.001)


def test_load_time_follows_the_links() -> None:
    costs = CostModel(kv_bytes_per_token=1e6).with_links(host="pcie5", disk="nvme")
    bandwidth, latency = LINKS["pcie5"]
    assert costs.load_time(0, 0) == 0.0
    assert costs.load_time(512) == pytest.approx(latency + 512e6 / bandwidth)
    assert costs.load_time(0, 512) == pytest.approx(LINKS["nvme"][1] + 512e6 / LINKS["nvme"][0])
    assert CostModel().with_links(host="pcie4").load_time(512) > CostModel().with_links(
        host="pcie5"
    ).load_time(512)
    with pytest.raises(CostModelError, match="unknown host link 'pcie9'"):
        CostModel().with_links(host="pcie9")
    with pytest.raises(CostModelError, match="host_link_bytes_per_s"):
        CostModel(host_link_bytes_per_s=0)


@pytest.mark.slow
def test_benchmark_command_runs_tiered_rows_and_references(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = sage(
        "--trace",
        "mooncake:conversation",
        "--requests",
        "300",
        "--eviction-policies",
        "lru",
        "--capacity-ratio",
        "0.1",
        "--host-capacity-ratio",
        "0.2",
        "--host-eviction-policies",
        "lru,arc",
        "--host-link",
        "pcie5",
        "--jobs",
        "1",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Host hit" in proc.stdout and "Recompute s" in proc.stdout
    result = json.loads(out.read_text(encoding="utf-8"))
    rows = [(r["policy"], r["host_policy"]) for r in result["results"]]
    assert rows == [
        ("lru", None),
        ("lru", "lru"),
        ("lru", "arc"),
        ("belady", None),
        ("belady", None),
        ("unbounded", None),
    ]
    device, belady_total = result["results"][0]["capacity_blocks"], result["results"][4]["capacity_blocks"]
    assert belady_total == device + result["settings"]["tiers"]["host_blocks"]
    assert result["settings"]["cost_model"]["host_link_bytes_per_s"] == LINKS["pcie5"][0]
    hit = [r["block_hits"] for r in result["results"]]
    assert (
        hit[0] < hit[1] <= hit[4] <= hit[5]
    )  # device only < two tiers <= Belady over the total <= unbounded


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--host-capacity-ratio", "1.5"], ["--host-capacity-ratio 1.5", "(0, 1]"]),
        (["--disk-capacity-ratio", "0.1"], ["need --host-capacity-ratio"]),
        (["--prefetch-ratio", "0.1"], ["need --host-capacity-ratio"]),
        (["--host-capacity-ratio", "0.2", "--cache-model", "flat"], ["--cache-model radix"]),
        (["--host-capacity-ratio", "0.2", "--mode", "engine"], ["--host-kv-cache"]),
        (
            ["--host-capacity-ratio", "0.2", "--host-eviction-policies", "nope"],
            ["--host-eviction-policies", "nope"],
        ),
        (
            ["--host-capacity-ratio", "0.2", "--host-eviction-policies", "belady"],
            ["--host-eviction-policies"],
        ),
        (
            ["--host-capacity-ratio", "0.2", "--host-write-policy", "write_around"],
            ["write_back or write_through"],
        ),
        (["--host-capacity-ratio", "0.2", "--host-link", "pcie9"], ["unknown host link 'pcie9'"]),
    ],
)
def test_bad_tier_options_are_one_line_errors(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    proc = sage(
        "--workload", "synthetic", "--requests", "20", "--eviction-policies", "lru", *args, cwd=tmp_path
    )
    assert_one_line_error(proc, *fragments)


def test_time_scale_spreads_the_arrivals() -> None:
    from engine_adapter.sim.benchmark import build_workload

    as_recorded = build_workload(trace=shipped_trace("mooncake:conversation")[0], requests=50)
    spread = build_workload(trace=shipped_trace("mooncake:conversation")[0], requests=50, time_scale=8.0)
    start = as_recorded.requests[0].arrival_s
    assert spread.requests[0].arrival_s == start
    for a, b in zip(as_recorded.requests, spread.requests, strict=True):
        assert b.arrival_s - start == pytest.approx(8.0 * (a.arrival_s - start))
        assert b.block_hashes == a.block_hashes
    assert spread.params["time_scale"] == 8.0


@pytest.mark.slow
def test_prefetch_loads_queued_prefixes_ahead_of_their_admission(mooncake: Workload) -> None:
    """Prefetch changes when a hit's block is loaded (ahead of time, behind a step's compute):
    fewer hits are loaded at admission; about as many blocks hit (the blocks a prefetch holds
    locked shift admissions a little: 1,159 against 1,126 here)."""
    unique = unique_blocks(mooncake.requests)
    costs = CostModel().with_links(host="pcie5")
    device = max(int(unique * 0.05), 40)
    tiers = TierConfig(host_blocks=int(unique * 0.2))
    plain = simulate(mooncake, "lru", device, cost_model=costs, tiers=tiers)
    ahead = simulate(
        mooncake, "lru", device, cost_model=costs, tiers=replace(tiers, prefetch_blocks=device // 10)
    )
    assert plain.prefetch_hits == 0 < ahead.prefetch_hits
    assert ahead.host_hit_ratio < plain.host_hit_ratio and ahead.load_s < plain.load_s
    assert ahead.block_hits == pytest.approx(plain.block_hits, rel=0.05)
