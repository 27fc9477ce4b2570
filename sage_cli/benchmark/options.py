"""The options of ``sage llm benchmark``: their choices, their `Annotated` aliases, and `BenchmarkArgs`.

`BenchmarkArgs` is the command line as one record, one field per option whose annotation is the
option's alias: `sage_cli.benchmark.command` gives the command its fields as parameters
(`sage_cli.options.record_parameters`), so each option is declared once, here, and the modes read
the record."""

from __future__ import annotations

import importlib.util
import runpy
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from sage_cli.options import NameOpt, PreemptionOrderOpt, SocketOpt

__all__ = [
    "CACHE_MODELS",
    "SCHEDULE_POLICIES",
    "Arrival",
    "BenchmarkArgs",
    "Compute",
    "EngineKind",
    "Mode",
    "OutputLength",
    "TraceFormat",
    "Workload",
]


class Mode(str, Enum):
    sim = "sim"
    engine = "engine"


class TraceFormat(str, Enum):
    mooncake = "mooncake"
    azure = "azure"


class Workload(str, Enum):
    synthetic = "synthetic"
    spec = "spec"
    colocation = "colocation"


class EngineKind(str, Enum):
    sage = "sage"
    vllm = "vllm"


def simulator_names(path: Path | None = None) -> dict[str, Any]:
    """The simulator's list of names (`engine_adapter/sim/model_names.py`, or `path`), loaded by
    path: this module may not import engine_adapter (the light commands never load it), and that
    file imports nothing, so the CLI's choices are the simulator's own list, not a copy."""
    if path is None:
        spec = importlib.util.find_spec("engine_adapter")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("sage's engine_adapter package is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / "sim" / "model_names.py"
    return runpy.run_path(str(path), run_name="sage_model_names")


_NAMES = simulator_names()
CACHE_MODELS: tuple[str, ...] = tuple(_NAMES["CACHE_MODELS"])
"""``--cache-model``'s choices: the simulator's cache models and engine twins."""
SCHEDULE_POLICIES: tuple[str, ...] = tuple(_NAMES["SCHEDULE_POLICIES"])
"""``--schedule-policy``'s choices: SGLang's queue orders the sglang model has."""
if TYPE_CHECKING:  # a name, to the type checker; to Typer, one of the choices read above
    CacheModelName = str
    SchedulePolicyName = str
else:
    CacheModelName = Literal[CACHE_MODELS]
    SchedulePolicyName = Literal[SCHEDULE_POLICIES]


class Arrival(str, Enum):
    poisson = "poisson"
    bursty = "bursty"
    periodic = "periodic"


class OutputLength(str, Enum):
    short = "short"
    medium = "medium"
    long = "long"
    mixed = "mixed"


class Compute(str, Enum):
    shared = "shared"
    split_devices = "split"  # `split` would shadow str.split


# -- what to run ---------------------------------------------------------------------------------

PoliciesOpt = Annotated[
    str | None,
    typer.Option(
        "--eviction-policies",
        metavar="P[,P...]",
        show_default=False,
        help="Policies to compare, comma-separated (default: lru,lfu,arc; with --engine-kind vllm, "
        "the one policy the server runs, 'vllm' for its own, the default; with --workload colocation, "
        "the one policy of the simulated pool, lru by default).",
    ),
]
ModeOpt = Annotated[
    Mode, typer.Option("--mode", help="sim: the simulator on a virtual clock; engine: a real engine.")
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        metavar="FILE|NAME",
        dir_okay=False,
        show_default=False,
        help="Replay a trace instead of generating a workload: a file (.jsonl, .csv, either .gz), or "
        "one shipped with sage by name: mooncake:conversation, mooncake:synthetic, azure:code, "
        "azure:conversation.",
    ),
]
TraceFormatOpt = Annotated[
    TraceFormat | None,
    typer.Option(
        "--trace-format",
        show_default=False,
        help="Format of --trace: mooncake (JSON lines) or azure (CSV); default: from the file name.",
    ),
]
WorkloadOpt = Annotated[
    Workload | None,
    typer.Option(
        "--workload",
        show_default=False,
        help="Generated workload when there is no --trace: synthetic, the module spec's (spec), or"
        " LLM requests beside embedding batches (colocation: the --ratio ... --gamma options).",
    ),
]

# -- the colocation grid (--workload colocation) --------------------------------------------------

RatioOpt = Annotated[
    str,
    typer.Option(
        "--ratio",
        metavar="L:E[,L:E...]",
        help="colocation: LLM:embedding request ratios, or 'shift' (9:1 -> 1:9 -> 9:1 during the run).",
    ),
]
LoadOpt = Annotated[
    str,
    typer.Option(
        "--load",
        metavar="F[,F...]",
        help="colocation: offered load as fractions (1.25) or percentages (125%) of the mix's capacity.",
    ),
]
ArrivalOpt = Annotated[Arrival, typer.Option("--arrival", help="colocation: arrival pattern.")]
OutputLengthOpt = Annotated[
    OutputLength,
    typer.Option(
        "--output-length",
        help="colocation: LLM output tokens, short 50-100, medium 200-500, long 1000-2000, or mixed.",
    ),
]
ComputeOpt = Annotated[
    Compute,
    typer.Option(
        "--compute",
        help="colocation: shared (one engine time-slices both) or split (own devices, shared memory).",
    ),
]
SeedsOpt = Annotated[
    str | None,
    typer.Option(
        "--seeds",
        metavar="S[,S...]",
        show_default=False,
        help="colocation: seeds to average over (default: --seed).",
    ),
]
SystemsOpt = Annotated[
    str | None,
    typer.Option(
        "--systems",
        metavar="NAME[,NAME...]",
        show_default=False,
        help="colocation: systems to compare (default: all; see docs/concepts/colocation.md).",
    ),
]
AlphaOpt = Annotated[
    float, typer.Option("--alpha", min=0.0, help="colocation: objective weight of LLM SLO attainment.")
]
BetaOpt = Annotated[
    float, typer.Option("--beta", min=0.0, help="colocation: objective weight of embedding SLO attainment.")
]
GammaOpt = Annotated[
    float, typer.Option("--gamma", min=0.0, help="colocation: objective weight of the completion ratio.")
]

# -- the workload and the cache ---------------------------------------------------------------------

RequestsOpt = Annotated[
    int | None,
    typer.Option(
        "--requests",
        min=1,
        metavar="N",
        show_default=False,
        help="Requests to generate (or to take from the start of --trace).",
    ),
]
TenantsOpt = Annotated[
    int | None,
    typer.Option(
        "--tenants", min=1, metavar="K", show_default=False, help="Tenants of the generated workload."
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, metavar="S", help="Seed of the generated workload.")]
CapacityBlocksOpt = Annotated[
    str | None,
    typer.Option(
        "--capacity-blocks",
        metavar="N[,N...]",
        show_default=False,
        help="Cache sizes in blocks to run each policy at.",
    ),
]
CapacityRatioOpt = Annotated[
    str | None,
    typer.Option(
        "--capacity-ratio",
        metavar="R[,R...]",
        show_default=False,
        help="Cache sizes as fractions of the workload's distinct blocks, in (0, 1], or percentages (5%).",
    ),
]
CacheModelOpt = Annotated[
    CacheModelName,
    typer.Option(
        "--cache-model",
        help=(
            "radix: prefix cache (a hit stops at the first miss); flat: independent blocks;"
            " vllm: vLLM v1's block pool and scheduler (capacities are its num_gpu_blocks);"
            " sage: sage's engine's own scheduler (priority admission, chunked prefill, preemption);"
            " sglang: SGLang's radix cache, queue order and retraction (policies: SGLang's lru, lfu,"
            " fifo, mru, filo, priority, slru, or sage-NAME: a sage policy plugged into SGLang)."
        ),
    ),
]
SchedulePolicyOpt = Annotated[
    SchedulePolicyName,
    typer.Option(
        "--schedule-policy",
        help="sglang model: SGLang's queue order (its --schedule-policy); the other models admit fcfs.",
    ),
]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        "--page-size",
        metavar="TOKENS",
        show_default=False,
        help="Tokens per block (page) of a generated workload: vLLM's --block-size, SGLang's"
        " --page-size; a Mooncake trace has 512.",
    ),
]
HostCapacityRatioOpt = Annotated[
    float | None,
    typer.Option(
        "--host-capacity-ratio",
        metavar="R",
        show_default=False,
        help=(
            "radix model: a host KV tier of this fraction of the distinct blocks under each cache size"
            " (evicted blocks are demoted there and loaded back on a hit); each policy also runs without it."
        ),
    ),
]
HostPoliciesOpt = Annotated[
    str | None,
    typer.Option(
        "--host-eviction-policies",
        metavar="P[,P...]",
        show_default=False,
        help="The host tier's policies, a row each (default: lru).",
    ),
]
DiskCapacityRatioOpt = Annotated[
    float | None,
    typer.Option(
        "--disk-capacity-ratio",
        metavar="R",
        show_default=False,
        help="A disk KV tier (LRU) of this fraction of the distinct blocks under the host tier.",
    ),
]
HostWritePolicyOpt = Annotated[
    str,
    typer.Option(
        "--host-write-policy",
        metavar="write_back|write_through",
        help="When blocks are copied to host: when evicted (write_back) or when cached (write_through).",
    ),
]
PrefetchRatioOpt = Annotated[
    float,
    typer.Option(
        "--prefetch-ratio",
        min=0.0,
        max=1.0,
        metavar="FRACTION",
        help=(
            "with --host-capacity-ratio: load queued requests' host/disk-resident prefixes ahead of time,"
            " within this fraction of the device pool (0: off)."
        ),
    ),
]
HostLinkOpt = Annotated[
    str | None,
    typer.Option(
        "--host-link",
        metavar="pcie4|pcie5",
        show_default=False,
        help="The host tier's link in the cost model (default: the cost model's, PCIe 4).",
    ),
]
DiskLinkOpt = Annotated[
    str | None,
    typer.Option(
        "--disk-link",
        metavar="nvme",
        show_default=False,
        help="The disk tier's link in the cost model (default: the cost model's, NVMe).",
    ),
]
ProtectQueuedOpt = Annotated[
    float,
    typer.Option(
        "--protect-queued",
        min=0.0,
        max=1.0,
        metavar="FRACTION",
        help=(
            "radix model: protect queued requests' cached prefixes from eviction"
            " until they run, within this fraction of the pool."
        ),
    ),
]
CompressOnEvictOpt = Annotated[
    str | None,
    typer.Option(
        "--compress-on-evict",
        metavar="PRESS:RATIO",
        show_default=False,
        help=(
            "radix model: run each online row again with evicted prefixes compressed (RATIO of"
            " their tokens removed) instead of dropped, e.g. knorm:0.75; its rows count compressed hits."
        ),
    ),
]
DurationOpt = Annotated[
    float | None,
    typer.Option(
        "--duration",
        metavar="SECONDS",
        show_default=False,
        help="Stop after this much (virtual, in sim) time; default: the whole workload.",
    ),
]

# -- where the results go ------------------------------------------------------------------------------

OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE.json",
        dir_okay=False,
        show_default=False,
        help="Write the results as JSON.",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="FILE.png",
        dir_okay=False,
        show_default=False,
        help="Plot hit rate against the capacity ratio and, per cache size, the TTFT CDF (needs "
        "matplotlib: pip install 'sage-kv[plot]').",
    ),
]
CostModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--cost-model",
        metavar="FILE.yaml|NAME",
        dir_okay=False,
        show_default=False,
        help="Prefill and decode cost model of the simulator: a YAML file, or a shipped one by name "
        "(h100-llama-1b: an engine that keeps up with the shipped Mooncake traces; "
        "default: a 7B on one A100).",
    ),
]
AdaptiveBatchOpt = Annotated[
    bool,
    typer.Option(
        "--adaptive-batch",
        help="sim mode: run each policy also with the adaptive batch limit, side by side.",
    ),
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        metavar="N",
        show_default=False,
        help="sim mode: run the (policy, capacity) rows in N processes (default: the usable cores; "
        "1: in this process). The results are the same, wall times aside.",
    ),
]
RayOpt = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS",
        show_default=False,
        help="sim mode: run the rows as tasks on a Ray cluster: local (start one here), auto (the one "
        "running here), HOST:6379 or ray://HOST:10001. Needs the ray extra: pip install 'sage-kv[ray]'.",
    ),
]
ReplicasOpt = Annotated[
    str | None,
    typer.Option(
        "--replicas",
        metavar="N[,N...]",
        show_default=False,
        help="sim mode: replay the workload over a fleet of N engines (each with the cache size and "
        "policy of the row) behind --router; rows over replicas x policies x routers (docs/fleet.md).",
    ),
]
RouterOpt = Annotated[
    str | None,
    typer.Option(
        "--router",
        metavar="NAME[,NAME...]",
        show_default=False,
        help="with --replicas: round_robin (default), least_load, cache_aware, precise, predicted_ttft; "
        "params as name:k=v,k=v (e.g. cache_aware:cache_threshold=0.3).",
    ),
]
ResultsJsonOpt = Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]

# -- engine mode -----------------------------------------------------------------------------------

MaxOutputTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-output-tokens",
        min=1,
        metavar="N",
        help="engine mode: cap on each request's output tokens.",
    ),
]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", min=1, metavar="N", help="engine mode: client threads.")
]
TimeScaleOpt = Annotated[
    float,
    typer.Option(
        "--time-scale",
        min=0.0,
        metavar="F",
        help=(
            "engine mode: wall seconds per trace second (0: send as fast as possible);"
            " sim mode: virtual seconds per trace second (0: as recorded), e.g. 8 spreads arrivals 8x."
        ),
    ),
]
EngineKindOpt = Annotated[
    EngineKind,
    typer.Option(
        "--engine-kind",
        help="engine mode: sage (the engine on --socket, or sage engines at --engine-url) or vllm "
        "(vLLM servers at --engine-url); which prefix-cache counters the engines' /metrics export.",
    ),
]
EngineUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--engine-url",
        metavar="URL",
        show_default=False,
        help="engine mode: send the requests to this OpenAI server over HTTP instead of --socket: an "
        "engine of --engine-kind, or a router in front of the --worker-url engines, e.g. http://127.0.0.1:8000.",
    ),
]
WorkerUrlOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--worker-url",
        metavar="URL",
        show_default=False,
        help="with --engine-url ROUTER_URL, repeated: each engine behind the router; their /metrics "
        "are read before and after and summed (the fleet's hit ratio, each engine's share).",
    ),
]


def _panels(**titles: str) -> dict[str, str]:
    """Parameter name -> panel title, from each title's space-separated parameter names."""
    return {name: title for title, names in titles.items() for name in names.split()}


# The panels of `benchmark --help` (sage_cli.help_panels), by parameter; tests/test_help_panels.py
# fails when an option is in none, so a new option is placed here.
BENCHMARK_PANELS = _panels(
    **{
        "What to compare": "eviction_policies mode capacity_blocks capacity_ratio cache_model block_size",
        "Workload": "trace trace_format workload requests tenants seed duration",
        "Colocation (--workload colocation)": "ratio load arrival output_length compute seeds systems "
        "alpha beta gamma",
        "Cache model": "schedule_policy preemption_order protect_queued compress_on_evict cost_model "
        "adaptive_batch",
        "KV tiers (radix model)": "host_capacity_ratio host_eviction_policies disk_capacity_ratio "
        "host_write_policy prefetch_ratio host_link disk_link",
        "Output": "output plot json_out",
        "Running the simulator (sim mode)": "jobs ray_address replicas router",
        "Engine mode": "socket name max_output_tokens concurrency time_scale engine_kind engine_url "
        "worker_url",
    }
)


@dataclass(frozen=True, slots=True)
class BenchmarkArgs:
    """The command line of ``sage llm benchmark``, as given: one field per option, in the order of
    its help; each field's annotation is the option (its flag, metavar, bounds and help)."""

    eviction_policies: PoliciesOpt = None
    mode: ModeOpt = Mode.sim
    trace: TraceOpt = None
    trace_format: TraceFormatOpt = None
    workload: WorkloadOpt = None
    ratio: RatioOpt = "1:9,3:7,5:5,7:3,9:1"
    load: LoadOpt = "1.0"
    arrival: ArrivalOpt = Arrival.poisson
    output_length: OutputLengthOpt = OutputLength.medium
    compute: ComputeOpt = Compute.shared
    seeds: SeedsOpt = None
    systems: SystemsOpt = None
    alpha: AlphaOpt = 0.5
    beta: BetaOpt = 0.5
    gamma: GammaOpt = 0.0
    requests: RequestsOpt = None
    tenants: TenantsOpt = None
    seed: SeedOpt = 0
    capacity_blocks: CapacityBlocksOpt = None
    capacity_ratio: CapacityRatioOpt = None
    cache_model: CacheModelOpt = "radix"
    block_size: BlockSizeOpt = None
    schedule_policy: SchedulePolicyOpt = "fcfs"
    preemption_order: PreemptionOrderOpt = "policy"
    protect_queued: ProtectQueuedOpt = 0.0
    compress_on_evict: CompressOnEvictOpt = None
    host_capacity_ratio: HostCapacityRatioOpt = None
    host_eviction_policies: HostPoliciesOpt = None
    disk_capacity_ratio: DiskCapacityRatioOpt = None
    host_write_policy: HostWritePolicyOpt = "write_back"
    prefetch_ratio: PrefetchRatioOpt = 0.0
    host_link: HostLinkOpt = None
    disk_link: DiskLinkOpt = None
    duration: DurationOpt = None
    output: OutputOpt = None
    plot: PlotOpt = None
    cost_model: CostModelOpt = None
    adaptive_batch: AdaptiveBatchOpt = False
    jobs: JobsOpt = None
    ray_address: RayOpt = None
    replicas: ReplicasOpt = None
    router: RouterOpt = None
    json_out: ResultsJsonOpt = False
    socket: SocketOpt = None
    name: NameOpt = None
    max_output_tokens: MaxOutputTokensOpt = 16
    concurrency: ConcurrencyOpt = 8
    time_scale: TimeScaleOpt = 0.0
    engine_kind: EngineKindOpt = EngineKind.sage
    engine_url: EngineUrlOpt = None
    worker_url: WorkerUrlOpt = None
