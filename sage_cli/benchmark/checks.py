"""The checks of ``sage llm benchmark``'s options, made before anything runs, and what they yield.

`check_plan` checks, in a fixed order (the first bad option is the one reported), the workload
(``--trace``: a file, or a trace shipped with sage by name, ``mooncake:conversation``; or a
generated ``--workload``), the cache sizes, the duration, the files to write,
the cost model, ``--protect-queued``, ``--preemption-order``, the KV tiers (``--host-capacity-ratio`` and its
companions) and where the simulator's rows run; it returns a `BenchmarkPlan`. Policy names
are checked against the light `sage_eviction` registry.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage_cli.benchmark.options import BenchmarkArgs, Mode, TraceFormat, Workload
from sage_cli.errors import CLIUsageError

__all__ = [
    "BenchmarkPlan",
    "TierPlan",
    "WorkloadSource",
    "check_plan",
    "fraction",
    "parse_capacities",
    "parse_policies",
    "readable",
    "writable_target",
]


@dataclass(frozen=True, slots=True)
class WorkloadSource:
    """The workload a run replays: a readable trace and its format, or a generated workload.

    Attributes:
        trace: The trace file, or None for a generated workload.
        trace_format: ``mooncake`` or ``azure`` with a trace.
        workload: The generated workload (``synthetic`` or ``spec``); None with a trace.
        requests: How many requests to generate or take from the trace; None: the default.
        tenants: Tenants of a generated workload; None: the default.
        seed: Seed of a generated workload.
        duration: Seconds of the workload to run; None: all of it.
    """

    trace: Path | None
    trace_format: str | None
    workload: str | None
    requests: int | None
    tenants: int | None
    seed: int
    duration: float | None


@dataclass(frozen=True, slots=True)
class TierPlan:
    """The simulator's KV tiers: the host tier's size (a fraction of the distinct blocks) and
    policies, and the disk tier's size (None: no disk tier)."""

    host_capacity_ratio: float
    host_eviction_policies: list[str]
    disk_capacity_ratio: float | None


@dataclass(frozen=True, slots=True)
class BenchmarkPlan:
    """What the options ask for, checked: the policies, the workload, the cache sizes, the costs,
    the KV tiers."""

    policies: list[str]
    source: WorkloadSource
    capacity_blocks: list[int] | None
    capacity_ratios: list[float] | None
    cost_model: dict[str, Any] | None
    tiers: TierPlan | None = None


def parse_policies(text: str, mode: str = "sim") -> list[str]:
    """``lru,slru:protected_threshold=3,arc`` as checked policy labels (aliases resolved, params
    kept: `sage_eviction.registry.split_policy_specs`; duplicates dropped).

    Raises:
        CLIUsageError: An unknown name (the message lists the available ones), a bad param, an
            empty list, or an offline policy outside the simulator.
    """
    from sage_eviction import PolicyConfigError, available_policies, split_policy_specs

    try:
        policies = split_policy_specs(text, online=mode != "sim")
    except PolicyConfigError as exc:
        raise CLIUsageError(str(exc)) from None
    if not policies:
        raise CLIUsageError("--eviction-policies is empty; available: " + ", ".join(available_policies()))
    return policies


def fraction(item: str) -> float:
    """``0.05`` or ``5%`` as a fraction (a percentage is divided by 100).

    Raises:
        ValueError: Neither a number nor a percentage.
    """
    text = item.strip()
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def parse_capacities(text: str, flag: str, *, ratio: bool) -> list[int] | list[float]:
    """``N[,N...]`` block counts (positive integers) or ``R[,R...]`` ratios in (0, 1], each a
    fraction or a percentage (``0.05`` or ``5%``, as ``--load`` takes them).

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
            value: float = fraction(item) if ratio else int(item)
        except ValueError:
            kind = "a ratio in (0, 1] or a percentage" if ratio else "a positive number of blocks"
            raise CLIUsageError(f"{flag}: {item!r} is not {kind}") from None
        if (ratio and not 0.0 < value <= 1.0) or (not ratio and value < 1):
            kind = "a ratio in (0, 1] or a percentage" if ratio else "a positive number of blocks"
            raise CLIUsageError(f"{flag}: {item!r} is not {kind}")
        if value not in values:
            values.append(value)
    return values


def readable(path: Path, flag: str) -> Path:
    """`path`, when it is a file this process can read.

    Raises:
        CLIUsageError: A folder, or a file that cannot be opened (the reason given).
    """
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:
        raise CLIUsageError(f"{flag} {path}: is a directory") from None
    except OSError as exc:
        raise CLIUsageError(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from None
    return path


def writable_target(path: Path, flag: str) -> Path:
    """`path`, when a file can be written there (its folder exists and is writable).

    Raises:
        CLIUsageError: A folder, a missing folder, or one this process cannot write in.
    """
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise CLIUsageError(f"{flag} {path}: is a directory")
    if not parent.is_dir():
        raise CLIUsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CLIUsageError(f"{flag} {path}: cannot write in {parent}")
    return path


def check_plan(args: BenchmarkArgs, policies: list[str]) -> BenchmarkPlan:
    """Every option of a policy benchmark (not ``--workload colocation``), checked in order.

    Raises:
        CLIUsageError: The first option that cannot be used, named in the message.
    """
    source = _workload_source(args)
    blocks, ratios = _capacities(args)
    if args.duration is not None and not args.duration > 0:
        raise CLIUsageError(f"--duration {args.duration:g}: give a positive number of seconds")
    _check_targets(args)
    costs = _load_cost_model(args.cost_model) if args.cost_model is not None else None
    _check_protect_queued(args)
    _check_preemption_order(args)
    if args.block_size is not None and (args.block_size < 1 or args.mode is Mode.engine):
        what = "give a positive number of tokens" if args.block_size < 1 else "the engine has its own"
        raise CLIUsageError(f"--block-size {args.block_size}: {what}")
    tiers = _tier_plan(args)
    _check_executor(args)
    return BenchmarkPlan(policies, source, blocks, ratios, costs, tiers)


def _workload_source(args: BenchmarkArgs) -> WorkloadSource:
    """``--trace`` (readable, its format given or told by its name) or a generated ``--workload``."""
    if args.trace is not None and args.workload is not None:
        raise CLIUsageError("give either --trace or --workload, not both")
    if args.trace is None and args.trace_format is not None:
        raise CLIUsageError("--trace-format goes with --trace")
    if args.trace is not None and args.tenants is not None:
        raise CLIUsageError("--tenants applies to a generated --workload, not to --trace")
    fmt: str | None = None
    trace = args.trace
    if trace is not None:
        trace, shipped_format = _shipped_or_file(trace)
        readable(trace, "--trace")
        given = args.trace_format.value if args.trace_format is not None else None
        if shipped_format is not None and given not in (None, shipped_format):
            raise CLIUsageError(
                f"--trace {args.trace} is a {shipped_format} trace, not --trace-format {given}"
            )
        fmt = given or shipped_format or _infer_trace_format(trace)
    return WorkloadSource(
        trace=trace,
        trace_format=fmt,
        workload=None if args.trace is not None else (args.workload or Workload.synthetic).value,
        requests=args.requests,
        tenants=args.tenants,
        seed=args.seed,
        duration=args.duration,
    )


def _shipped_or_file(trace: Path) -> tuple[Path, str | None]:
    """A file as given; a trace shipped with sage (``mooncake:conversation``) as its file and
    format. An existing file wins over a name."""
    text = str(trace)
    if trace.exists():
        return trace, None
    from engine_adapter.sim.shipped_traces import is_trace_name, shipped_trace

    if not is_trace_name(text):
        return trace, None  # `readable` says what is wrong with the path
    try:
        path, shipped = shipped_trace(text)
    except (ValueError, FileNotFoundError) as exc:
        raise CLIUsageError(f"--trace: {exc}") from None
    return path, shipped.trace_format


def _infer_trace_format(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    suffix = Path(name).suffix
    if suffix in (".jsonl", ".json", ".ndjson"):
        return TraceFormat.mooncake.value
    if suffix == ".csv":
        return TraceFormat.azure.value
    raise CLIUsageError(
        f"--trace {path}: cannot tell its format from the name; give --trace-format mooncake|azure"
    )


def _capacities(args: BenchmarkArgs) -> tuple[list[int] | None, list[float] | None]:
    """``--capacity-blocks`` or ``--capacity-ratio`` (one of them, or neither)."""
    if args.capacity_blocks is not None and args.capacity_ratio is not None:
        raise CLIUsageError("give either --capacity-blocks or --capacity-ratio, not both")
    blocks = (
        None
        if args.capacity_blocks is None
        else [int(b) for b in parse_capacities(args.capacity_blocks, "--capacity-blocks", ratio=False)]
    )
    ratios = (
        None
        if args.capacity_ratio is None
        else [float(r) for r in parse_capacities(args.capacity_ratio, "--capacity-ratio", ratio=True)]
    )
    return blocks, ratios


def _check_targets(args: BenchmarkArgs) -> None:
    """``--output`` and ``--plot`` can be written (and matplotlib draws the plot)."""
    if args.output is not None:
        writable_target(args.output, "--output")
    if args.plot is not None:
        writable_target(args.plot, "--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise CLIUsageError("--plot needs matplotlib: pip install 'sage-kv[plot]'")


def _load_cost_model(path: Path) -> dict[str, Any]:
    """``--cost-model``: a YAML file, or a shipped cost model's name (a file of that name wins)."""
    from engine_adapter.safe_yaml import YAMLInputError, load_yaml_file
    from engine_adapter.sim.cost_models import shipped_cost_model

    shipped = None if path.exists() else shipped_cost_model(str(path))
    path = shipped if shipped is not None else path
    readable(path, "--cost-model")
    try:
        values = load_yaml_file(path)
    except (YAMLInputError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CLIUsageError(f"--cost-model {path}: not valid YAML: {first}") from None
    if not isinstance(values, dict):
        raise CLIUsageError(f"--cost-model {path}: the top level is not a mapping")
    return values


def _check_protect_queued(args: BenchmarkArgs) -> None:
    """``--protect-queued`` and ``--compress-on-evict`` are the simulator's radix model's (the
    spec itself is checked by the simulator)."""
    if args.protect_queued > 0 and args.mode is Mode.engine:
        raise CLIUsageError(
            "--protect-queued applies to the simulator; start the engine with --protect-queued instead"
        )
    if args.protect_queued > 0 and args.cache_model != "radix":
        raise CLIUsageError(f"--protect-queued needs --cache-model radix (not {args.cache_model})")
    radix_sim = args.mode is not Mode.engine and args.cache_model == "radix"
    if args.compress_on_evict is not None and not radix_sim:
        raise CLIUsageError(
            "--compress-on-evict here is the simulator's radix model's; an engine starts with its own"
        )


def _check_preemption_order(args: BenchmarkArgs) -> None:
    """``--preemption-order``: a name in `sage_eviction.preemption.ORDERS` (or ``policy``), for the
    scheduler of the simulator's radix model or of the sage twin (sage's engine's); a fleet's
    replicas keep their policies' own (not plumbed there yet), and an engine is started with its
    own ``--preemption-order``."""
    from sage_eviction.preemption import POLICY, resolve_order  # light: the policy library only

    try:
        resolve_order(args.preemption_order)
    except ValueError as exc:
        raise CLIUsageError(f"--preemption-order: {exc}") from None
    if args.preemption_order == POLICY:
        return
    if args.mode is Mode.engine:
        raise CLIUsageError("--preemption-order applies to the simulator; start the engine with it instead")
    if args.cache_model not in ("radix", "sage") or args.replicas is not None:
        where = "--replicas (a fleet)" if args.replicas is not None else f"--cache-model {args.cache_model}"
        raise CLIUsageError(
            f"--preemption-order {args.preemption_order} needs --cache-model radix or sage, not {where}"
        )


def _tier_plan(args: BenchmarkArgs) -> TierPlan | None:
    """``--host-capacity-ratio`` and its companions: the simulator's radix model's KV tiers (the
    link names are checked against the cost model's presets by the simulator)."""
    host, disk = args.host_capacity_ratio, args.disk_capacity_ratio
    if host is None:
        if disk is not None or args.host_eviction_policies is not None or args.prefetch_ratio:
            raise CLIUsageError(
                "--disk-capacity-ratio, --host-eviction-policies and --prefetch-ratio"
                " need --host-capacity-ratio"
            )
        return None
    if args.mode is Mode.engine:
        raise CLIUsageError(
            "--host-capacity-ratio applies to the simulator; start the engine with --host-kv-cache instead"
        )
    if args.cache_model != "radix":
        raise CLIUsageError(f"--host-capacity-ratio needs --cache-model radix (not {args.cache_model})")
    for flag, ratio in (("--host-capacity-ratio", host), ("--disk-capacity-ratio", disk)):
        if ratio is not None and not 0.0 < ratio <= 1.0:
            raise CLIUsageError(f"{flag} {ratio:g}: give a ratio in (0, 1]")
    if args.host_write_policy not in ("write_back", "write_through"):
        raise CLIUsageError(
            f"--host-write-policy {args.host_write_policy!r}: give write_back or write_through"
        )
    text = args.host_eviction_policies if args.host_eviction_policies is not None else "lru"
    try:
        host_policies = parse_policies(text, mode="engine")  # online policies only
    except CLIUsageError as exc:
        raise CLIUsageError(f"--host-eviction-policies: {exc}") from None
    return TierPlan(host, host_policies, disk)


def _check_executor(args: BenchmarkArgs) -> None:
    """--jobs and --ray: where the simulator's rows run, checked before anything runs."""
    jobs, ray_address = args.jobs, args.ray_address
    if (jobs is not None or ray_address is not None) and args.mode is not Mode.sim:
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
