"""``sage llm benchmark``: compare eviction policies on a trace or a generated workload.

This module checks the options (policy names against the light `sage_eviction` registry,
capacities, readable files) and then hands them, as keyword arguments, to
``engine_adapter.sim.benchmark.run_benchmark(**options)``, imported only then: the simulator
and torch load for this command alone.

The contract with the simulator: ``run_benchmark`` takes the keyword arguments of
`BenchmarkOptions` (see `BenchmarkOptions.as_kwargs`), shows its own progress on stderr, writes
``output`` (JSON) and ``plot`` (PNG) when they are set, and returns a JSON-able dict with a
``"results"`` list of flat dicts (one per policy and capacity), which the CLI prints as a table
(or the whole dict with ``--json``). Its bad-input error, ``BenchmarkError``, is reported as one
line with exit code 2.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli import colocation_bench as colo
from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.options import NameOpt, SocketOpt
from sage_cli.output import Output, format_cell

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "BenchmarkOptions",
    "benchmark",
    "parse_capacities",
    "parse_policies",
    "results_table",
    "run_caption",
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


class CacheModel(str, Enum):
    radix = "radix"
    flat = "flat"


@dataclass(frozen=True)
class BenchmarkOptions:
    """The checked options, as ``run_benchmark`` receives them."""

    policies: list[str]
    mode: str
    trace: Path | None
    trace_format: str | None
    workload: str | None
    requests: int | None
    tenants: int | None
    seed: int
    capacity_blocks: list[int] | None
    capacity_ratios: list[float] | None
    cache_model: str
    duration: float | None
    output: Path | None
    plot: Path | None
    cost_model: dict[str, Any] | None
    cost_model_path: Path | None
    protect_queued: float = 0.0
    adaptive_batch: bool = False
    jobs: int | None = None
    ray_address: str | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return asdict(self)


def parse_policies(text: str, mode: str = "sim") -> list[str]:
    """``lru,lfu,arc`` as checked registry names (aliases resolved, duplicates dropped).

    Raises:
        CLIUsageError: An unknown name (the message lists the available ones), an empty list,
            or an offline policy outside the simulator.
    """
    from sage_eviction import PolicyConfigError, available_policies, get_policy_class

    names = [item.strip() for item in text.split(",") if item.strip()]
    if not names:
        raise CLIUsageError("--eviction-policies is empty; available: " + ", ".join(available_policies()))
    policies: list[str] = []
    for item in names:
        try:
            cls = get_policy_class(item, online=mode != "sim")
        except PolicyConfigError as exc:
            raise CLIUsageError(str(exc)) from None
        if cls.name not in policies:
            policies.append(cls.name)
    return policies


def parse_capacities(text: str, flag: str, *, ratio: bool) -> list[int] | list[float]:
    """``N[,N...]`` block counts (positive integers) or ``R[,R...]`` ratios in (0, 1].

    Raises:
        CLIUsageError: A value that is not one, or an empty list.
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise CLIUsageError(
            f"{flag} {text!r}: give a comma-separated list, e.g. {'0.1,0.2' if ratio else '1000,2000'}"
        )
    values: list[Any] = []
    for item in items:
        try:
            value: float = float(item) if ratio else int(item)
        except ValueError:
            kind = "a ratio in (0, 1]" if ratio else "a positive number of blocks"
            raise CLIUsageError(f"{flag}: {item!r} is not {kind}") from None
        if (ratio and not 0.0 < value <= 1.0) or (not ratio and value < 1):
            kind = "a ratio in (0, 1]" if ratio else "a positive number of blocks"
            raise CLIUsageError(f"{flag}: {item!r} is not {kind}")
        if value not in values:
            values.append(value)
    return values


def _readable(path: Path, flag: str) -> Path:
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:
        raise CLIUsageError(f"{flag} {path}: is a directory") from None
    except OSError as exc:
        raise CLIUsageError(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from None
    return path


def _writable_target(path: Path, flag: str) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise CLIUsageError(f"{flag} {path}: is a directory")
    if not parent.is_dir():
        raise CLIUsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CLIUsageError(f"{flag} {path}: cannot write in {parent}")
    return path


def _load_cost_model(path: Path) -> dict[str, Any]:
    from engine_adapter.safe_yaml import YAMLInputError, load_yaml_file

    _readable(path, "--cost-model")
    try:
        values = load_yaml_file(path)
    except (YAMLInputError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CLIUsageError(f"--cost-model {path}: not valid YAML: {first}") from None
    if not isinstance(values, dict):
        raise CLIUsageError(f"--cost-model {path}: the top level is not a mapping")
    return values


def _infer_trace_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return TraceFormat.mooncake.value
    if suffix == ".csv":
        return TraceFormat.azure.value
    raise CLIUsageError(
        f"--trace {path}: cannot tell its format from the name; give --trace-format mooncake|azure"
    )


# The table's columns (key, title, format); --json and --output carry every field.
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "Policy", "text"),
    ("capacity_blocks", "Blocks", "int"),
    ("hit_rate", "Hit", "percent"),
    ("re_prefill_rate", "Re-prefill", "percent"),
    ("fairness_score", "Fair", "ratio"),
    ("memory_utilization", "Util", "percent"),
    ("evictions", "Evicted", "int"),
    ("eviction_p50_us", "p50 µs", "number"),
    ("throughput_impact", "Tput loss", "percent"),
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



def run_caption(run: Any) -> str | None:
    """How the simulator's rows ran, under the table: the implementation of the core (compiled or
    pure Python) and the executor, e.g. "core: compiled; 2 processes; 4.1 s"."""
    if not isinstance(run, dict):
        return None
    parts = []
    if run.get("implementation"):
        parts.append(f"core: {run['implementation']}")
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


def results_table(result: dict[str, Any]) -> Table | str:
    """The rows ``run_benchmark`` returned, one per policy and capacity, as a table."""
    from rich import box
    from rich.table import Table

    rows = result.get("results", result.get("rows"))
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return "No results."
    present = {key for row in rows for key in row}
    adaptive = any(row.get("adaptive_batch") for row in rows)
    columns = [c for c in (_ADAPTIVE_COLUMNS if adaptive else _COLUMNS) if c[0] in present]
    if not columns:  # rows of another shape: show them as they are
        keys = list(dict.fromkeys(key for row in rows for key in row))
        columns = [(key, key, "number") for key in keys]
    table = Table(
        title="Eviction policy benchmark",
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
            justify="left" if key == "policy" else "right",
            min_width=widest_word,
            no_wrap=key == "policy",
        )
    for row in rows:
        table.add_row(*(format_cell(row.get(key), kind) for key, _, kind in columns))
    return table


def benchmark(
    eviction_policies: Annotated[
        str | None,
        typer.Option(
            "--eviction-policies",
            metavar="P[,P...]",
            show_default=False,
            help="Policies to compare, comma-separated (default: lru,lfu,arc; with --engine-kind vllm, "
            "the one policy the server runs, 'vllm' for its own, the default).",
        ),
    ] = None,
    mode: Annotated[
        Mode, typer.Option("--mode", help="sim: the simulator on a virtual clock; engine: a real engine.")
    ] = Mode.sim,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            metavar="FILE",
            dir_okay=False,
            show_default=False,
            help="Replay a trace instead of generating a workload.",
        ),
    ] = None,
    trace_format: Annotated[
        TraceFormat | None,
        typer.Option(
            "--trace-format",
            show_default=False,
            help="Format of --trace: mooncake (JSON lines) or azure (CSV); default: from the file name.",
        ),
    ] = None,
    workload: Annotated[
        Workload | None,
        typer.Option(
            "--workload",
            show_default=False,
            help="Generated workload when there is no --trace: synthetic, the module spec's (spec), or"
            " LLM requests beside embedding batches (colocation: the --ratio ... --gamma options).",
        ),
    ] = None,
    ratio: colo.RatioOpt = "1:9,3:7,5:5,7:3,9:1",
    load: colo.LoadOpt = "1.0",
    arrival: colo.ArrivalOpt = colo.Arrival.poisson,
    output_length: colo.OutputLengthOpt = colo.OutputLength.medium,
    compute: colo.ComputeOpt = colo.Compute.shared,
    seeds: colo.SeedsOpt = None,
    systems: colo.SystemsOpt = None,
    alpha: colo.AlphaOpt = 0.5,
    beta: colo.BetaOpt = 0.5,
    gamma: colo.GammaOpt = 0.0,
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests",
            min=1,
            metavar="N",
            show_default=False,
            help="Requests to generate (or to take from the start of --trace).",
        ),
    ] = None,
    tenants: Annotated[
        int | None,
        typer.Option(
            "--tenants", min=1, metavar="K", show_default=False, help="Tenants of the generated workload."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, metavar="S", help="Seed of the generated workload.")
    ] = 0,
    capacity_blocks: Annotated[
        str | None,
        typer.Option(
            "--capacity-blocks",
            metavar="N[,N...]",
            show_default=False,
            help="Cache sizes in blocks to run each policy at.",
        ),
    ] = None,
    capacity_ratio: Annotated[
        str | None,
        typer.Option(
            "--capacity-ratio",
            metavar="R[,R...]",
            show_default=False,
            help="Cache sizes as fractions of the workload's distinct blocks, in (0, 1].",
        ),
    ] = None,
    cache_model: Annotated[
        CacheModel,
        typer.Option(
            "--cache-model",
            help="radix: prefix cache (a hit stops at the first miss); flat: independent blocks.",
        ),
    ] = CacheModel.radix,
    protect_queued: Annotated[
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
    ] = 0.0,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            metavar="SECONDS",
            show_default=False,
            help="Stop after this much (virtual, in sim) time; default: the whole workload.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE.json",
            dir_okay=False,
            show_default=False,
            help="Write the results as JSON.",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE.png",
            dir_okay=False,
            show_default=False,
            help="Plot hit rate against capacity and the latency CDF (needs matplotlib).",
        ),
    ] = None,
    cost_model: Annotated[
        Path | None,
        typer.Option(
            "--cost-model",
            metavar="FILE.yaml",
            dir_okay=False,
            show_default=False,
            help="Prefill and decode cost model of the simulator (YAML).",
        ),
    ] = None,
    adaptive_batch: Annotated[
        bool,
        typer.Option(
            "--adaptive-batch",
            help="sim mode: run each policy also with the adaptive batch limit, side by side.",
        ),
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            metavar="N",
            show_default=False,
            help="sim mode: run the (policy, capacity) rows in N processes (default: the usable cores; "
            "1: in this process). The results are the same, wall times aside.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            show_default=False,
            help="sim mode: run the rows as tasks on a Ray cluster: local (start one here), auto (the one "
            "running here), HOST:6379 or ray://HOST:10001. Needs the ray extra: pip install 'sage-kv[ray]'.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    socket: SocketOpt = None,
    name: NameOpt = None,
    max_output_tokens: Annotated[
        int,
        typer.Option(
            "--max-output-tokens",
            min=1,
            metavar="N",
            help="engine mode: cap on each request's output tokens.",
        ),
    ] = 16,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, metavar="N", help="engine mode: client threads."),
    ] = 8,
    time_scale: Annotated[
        float,
        typer.Option(
            "--time-scale",
            min=0.0,
            metavar="F",
            help="engine mode: wall seconds per trace second (0: send as fast as possible).",
        ),
    ] = 0.0,
    engine_kind: Annotated[
        EngineKind,
        typer.Option(
            "--engine-kind",
            help="engine mode: sage (the engine on --socket) or vllm (a vLLM server at --engine-url).",
        ),
    ] = EngineKind.sage,
    engine_url: Annotated[
        str | None,
        typer.Option(
            "--engine-url",
            metavar="URL",
            show_default=False,
            help="engine mode, --engine-kind vllm: the running vLLM OpenAI server, e.g. http://127.0.0.1:8000.",
        ),
    ] = None,
) -> None:
    """Compare eviction policies: hit rate, re-prefill rate, fairness, utilization, latency.

    Replays a Mooncake or Azure trace, or generates a workload, against each policy and cache
    size, with the unbounded cache and Belady as reference rows. With --workload colocation:
    LLM requests beside embedding batches, the colocation systems side by side.
    """
    if workload is Workload.colocation:
        given = {
            "--eviction-policies": eviction_policies is not None,
            "--capacity-blocks": capacity_blocks is not None and mode is not Mode.engine,
            "--capacity-ratio": capacity_ratio is not None,
            "--requests": requests is not None and mode is not Mode.engine,
            "--tenants": tenants is not None,
            "--plot": plot is not None,
            "--trace": trace is not None,
        }
        pool = capacity_blocks and parse_capacities(capacity_blocks, "--capacity-blocks", ratio=False)
        colo.run_colocation_cli(
            ratio=ratio, load=load, arrival=arrival, output_length=output_length, compute=compute,
            seeds=seeds, seed=seed, systems=systems, alpha=alpha, beta=beta, gamma=gamma,
            duration=duration, output=output, json_out=json_out, engine_mode=mode is Mode.engine,
            requests=requests, num_blocks=int(pool[0]) if pool else None,
            other_options=[flag for flag, on in given.items() if on],
        )
        return
    if engine_kind is EngineKind.vllm or engine_url is not None:
        label = (eviction_policies or "vllm").strip()
        _check_vllm_target(mode, engine_kind, engine_url, label, capacity_blocks, capacity_ratio)
        policies = [label] if label == "vllm" else parse_policies(label, mode.value)
    else:
        policies = parse_policies(eviction_policies or "lru,lfu,arc", mode.value)
    if trace is not None and workload is not None:
        raise CLIUsageError("give either --trace or --workload, not both")
    if trace is None and trace_format is not None:
        raise CLIUsageError("--trace-format goes with --trace")
    if trace is not None and tenants is not None:
        raise CLIUsageError("--tenants applies to a generated --workload, not to --trace")
    fmt: str | None = None
    if trace is not None:
        _readable(trace, "--trace")
        fmt = trace_format.value if trace_format is not None else _infer_trace_format(trace)
    if capacity_blocks is not None and capacity_ratio is not None:
        raise CLIUsageError("give either --capacity-blocks or --capacity-ratio, not both")
    blocks = (
        None
        if capacity_blocks is None
        else parse_capacities(capacity_blocks, "--capacity-blocks", ratio=False)
    )
    ratios = (
        None if capacity_ratio is None else parse_capacities(capacity_ratio, "--capacity-ratio", ratio=True)
    )
    if duration is not None and not duration > 0:
        raise CLIUsageError(f"--duration {duration:g}: give a positive number of seconds")
    if output is not None:
        _writable_target(output, "--output")
    if plot is not None:
        _writable_target(plot, "--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise CLIUsageError("--plot needs matplotlib: pip install 'sage-kv[plot]'")
    costs = _load_cost_model(cost_model) if cost_model is not None else None
    if protect_queued > 0 and mode is Mode.engine:
        raise CLIUsageError(
            "--protect-queued applies to the simulator; start the engine with --protect-queued instead"
        )
    if protect_queued > 0 and cache_model is not CacheModel.radix:
        raise CLIUsageError("--protect-queued needs --cache-model radix (the flat model has no queue)")
    _check_executor(jobs, ray_address, mode)
    if engine_url is not None:
        result = _vllm_mode(
            url=engine_url,
            policy=policies[0],
            built=_engine_workload(trace, fmt, workload, requests, tenants, seed, duration),
            max_output_tokens=max_output_tokens,
            concurrency=concurrency,
            time_scale=time_scale,
        )
        _save_and_show(result, output, json_out)
        return
    if mode is Mode.engine:
        if adaptive_batch:
            raise CLIUsageError(
                "--adaptive-batch compares in sim mode; start an engine with it for engine mode"
            )
        if ratios is not None or (blocks is not None and len(blocks) > 1):
            raise CLIUsageError(
                "engine mode runs one pool size: give --capacity-blocks N (a temporary engine's pool)"
            )
        result = _engine_mode(
            policies=policies,
            built=_engine_workload(trace, fmt, workload, requests, tenants, seed, duration),
            num_blocks=int(blocks[0]) if blocks else None,
            socket=socket,
            name=name,
            max_output_tokens=max_output_tokens,
            concurrency=concurrency,
            time_scale=time_scale,
        )
        _save_and_show(result, output, json_out)
        return

    options = BenchmarkOptions(
        policies=policies,
        mode=mode.value,
        trace=trace,
        trace_format=fmt,
        workload=None if trace is not None else (workload or Workload.synthetic).value,
        requests=requests,
        tenants=tenants,
        seed=seed,
        capacity_blocks=[int(b) for b in blocks] if blocks is not None else None,
        capacity_ratios=[float(r) for r in ratios] if ratios is not None else None,
        cache_model=cache_model.value,
        duration=duration,
        output=output,
        plot=plot,
        cost_model=costs,
        cost_model_path=cost_model,
        protect_queued=protect_queued,
        adaptive_batch=adaptive_batch,
        jobs=jobs,
        ray_address=ray_address,
    )
    try:
        from engine_adapter.sim.benchmark import run_benchmark
    except ImportError as exc:
        raise CLIError(
            f"the benchmark needs engine_adapter.sim.benchmark, which cannot be loaded: {exc}"
        ) from exc
    result = run_benchmark(**options.as_kwargs())
    if isinstance(result, dict):
        Output(json_out).result(result, lambda: results_table(result))


def _check_executor(jobs: int | None, ray_address: str | None, mode: Mode) -> None:
    """--jobs and --ray: where the simulator's rows run, checked before anything runs."""
    if (jobs is not None or ray_address is not None) and mode is not Mode.sim:
        raise CLIUsageError("--jobs and --ray spread the simulator's rows: they go with --mode sim")
    if jobs is not None and jobs < 1:
        raise CLIUsageError(f"--jobs {jobs}: give a positive number of processes (1 runs the rows here)")
    if ray_address is None:
        return
    if jobs is not None:
        raise CLIUsageError("give either --jobs (processes here) or --ray (tasks on a Ray cluster), not both")
    if not ray_address.strip():
        raise CLIUsageError("--ray: give a cluster address, 'local' to start one here or 'auto'")
    if importlib.util.find_spec("ray") is None:
        raise CLIUsageError("--ray needs Ray, which is not installed: pip install 'sage-kv[ray]'")


def _save_and_show(result: dict[str, Any], output: Path | None, json_out: bool) -> None:
    """An engine-mode result: written to --output as JSON (the simulator writes its own), then
    shown as the table or as JSON."""
    if output is not None:
        import json

        output.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    Output(json_out).result(result, lambda: results_table(result))


def _check_vllm_target(
    mode: Mode,
    kind: EngineKind,
    url: str | None,
    policies: str,
    capacity_blocks: str | None,
    capacity_ratio: str | None,
) -> None:
    """The options of a benchmark against a vLLM server, checked before anything runs."""
    if mode is not Mode.engine:
        raise CLIUsageError("--engine-url and --engine-kind vllm go with --mode engine")
    if kind is not EngineKind.vllm:
        raise CLIUsageError("--engine-url is a vLLM server's: give --engine-kind vllm with it")
    if url is None:
        raise CLIUsageError("--engine-kind vllm needs --engine-url URL (the running vLLM OpenAI server)")
    if not url.startswith(("http://", "https://")):
        raise CLIUsageError(f"--engine-url {url!r}: give an http:// or https:// URL")
    if "," in policies:
        raise CLIUsageError(
            "vLLM runs one eviction policy per server start: give the one it runs in --eviction-policies "
            "(a sage policy name, or 'vllm' for its own), then restart it with the next one "
            "(SAGE_VLLM_GPU_POLICY=name) and run again"
        )
    if capacity_blocks is not None or capacity_ratio is not None:
        raise CLIUsageError(
            "the vLLM server's pool is its own (--num-gpu-blocks-override): drop --capacity-*"
        )


def _engine_workload(
    trace: Path | None,
    trace_format: str | None,
    workload: Workload | None,
    requests: int | None,
    tenants: int | None,
    seed: int,
    duration: float | None,
) -> Any:
    """The workload an engine mode replays: the trace, or a generated one (64 requests unless
    --requests says otherwise, since every request is a real completion)."""
    from engine_adapter.sim.benchmark import build_workload

    return build_workload(
        trace=trace,
        trace_format=trace_format,
        workload=None if trace is not None else (workload or Workload.synthetic).value,
        requests=requests if requests is not None else (None if trace is not None else 64),
        tenants=tenants,
        seed=seed,
        duration=duration,
    )


def _vllm_mode(
    *,
    url: str,
    policy: str,
    built: Any,
    max_output_tokens: int,
    concurrency: int,
    time_scale: float,
) -> dict[str, Any]:
    """Replay the workload through the vLLM server at `url` (sage_cli/vllm_bench.py)."""
    from rich.progress import Progress

    from sage_cli.vllm_bench import VLLMBenchmarkError, run_vllm_benchmark

    with Progress(transient=True) as bar:
        task = bar.add_task(f"{policy} on vLLM", total=len(built.requests))
        try:
            return run_vllm_benchmark(
                url=url,
                policy=policy,
                requests=built.requests,
                workload=built.describe(),
                tokens_per_block=16,
                max_output_tokens=max_output_tokens,
                time_scale=time_scale,
                concurrency=concurrency,
                tick=lambda: bar.advance(task),
            )
        except VLLMBenchmarkError as exc:
            raise CLIError(str(exc)) from None


def _engine_mode(
    *,
    policies: list[str],
    built: Any,
    num_blocks: int | None,
    socket: Path | None,
    name: str | None,
    max_output_tokens: int,
    concurrency: int,
    time_scale: float,
) -> dict[str, Any]:
    """Replay the workload through a live engine (a temporary one when none answers)."""
    from rich.progress import Progress

    from sage_cli.engine_bench import run_engine_benchmark
    from sage_cli.paths import resolve_socket

    try:
        target = resolve_socket(socket, name)
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None
    with Progress(transient=True) as bar:
        tasks: dict[int, Any] = {}

        def progress(index: int, total: int) -> Any:
            task = bar.add_task(f"{policies[index]} ({index + 1}/{total})", total=len(built.requests))
            tasks[index] = task
            return lambda: bar.advance(task)

        try:
            return run_engine_benchmark(
                policies=policies,
                requests=built.requests,
                workload=built.describe(),
                socket=target,
                tokens_per_block=16,
                max_output_tokens=max_output_tokens,
                time_scale=time_scale,
                concurrency=concurrency,
                num_blocks=num_blocks,
                progress=progress,
            )
        except RuntimeError as exc:
            raise CLIError(str(exc)) from None
        except ValueError as exc:
            raise CLIUsageError(str(exc)) from None
