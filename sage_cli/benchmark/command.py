"""``sage llm benchmark``: the one command, its options declared by `BenchmarkArgs`, its steps.

The command checks the options (`checks`, `colocation`), then runs one mode, each in a module of
its own, imported only then: the simulator (`sim`), a live sage engine on its socket (`engine`),
engines over HTTP (`remote`: a sage or vLLM server, or a router in front of several), or the
colocation grid in the simulator (`colocation_sim`) or on engines (`colocation_engine`).
"""

from __future__ import annotations

from typing import Any

from sage_cli.benchmark.checks import check_plan, parse_policies
from sage_cli.benchmark.colocation import check_grid
from sage_cli.benchmark.options import BenchmarkArgs, EngineKind, Mode, Workload
from sage_cli.errors import CLIUsageError
from sage_cli.options import record_parameters, with_parameters

__all__ = ["benchmark", "run"]


@with_parameters(record_parameters(BenchmarkArgs))
def benchmark(**options: Any) -> None:
    """Compare eviction policies: hit rate, re-prefill rate, fairness, utilization, latency.

    Replays a Mooncake or Azure trace, or generates a workload, against each policy and cache
    size, with the unbounded cache and Belady as reference rows. With --workload colocation:
    LLM requests beside embedding batches, the colocation systems side by side.
    """
    run(BenchmarkArgs(**options))


def run(args: BenchmarkArgs) -> None:
    """Check the options, then run the mode they name and print its table (or JSON).

    Raises:
        CLIUsageError: The first option that cannot be used.
    """
    fleet = args.replicas is not None or args.router is not None
    if fleet and (args.workload is Workload.colocation or args.mode is not Mode.sim or args.engine_url):
        raise CLIUsageError("--replicas and --router run the fleet simulator (--mode sim, no colocation)")
    if args.workload is Workload.colocation:
        _run_colocation(args)
        return
    plan = check_plan(args, _policies(args))
    if args.engine_url is not None:
        from sage_cli.benchmark.remote import run_on_remote

        run_on_remote(args, plan, args.engine_url)
    elif args.mode is Mode.engine:
        from sage_cli.benchmark.engine import run_on_engine

        run_on_engine(args, plan)
    else:
        from sage_cli.benchmark.sim import run_in_simulator

        run_in_simulator(args, plan)


def _policies(args: BenchmarkArgs) -> list[str]:
    """The policies to compare (default lru,lfu,arc), or the one a vLLM server runs."""
    if args.engine_kind is EngineKind.vllm or args.engine_url is not None or args.worker_url:
        from sage_cli.benchmark.remote import remote_policies

        return remote_policies(args)
    # None is the default; an empty string is a mistake (it used to run the default silently).
    if args.cache_model == "sglang" and args.mode is Mode.sim:
        # SGLang's own strategies, checked by the simulator (sage's registry has no mru or filo)
        text = "lru,lfu" if args.eviction_policies is None else args.eviction_policies
        names = [item.strip() for item in text.split(",") if item.strip()]
        if not names:
            raise CLIUsageError("--eviction-policies is empty")
        return list(dict.fromkeys(names))
    text = "lru,lfu,arc" if args.eviction_policies is None else args.eviction_policies
    return parse_policies(text, args.mode.value)


def _run_colocation(args: BenchmarkArgs) -> None:
    """``--workload colocation``: the grid in the simulator, or on live engines with ``--mode engine``."""
    grid = check_grid(args)
    if args.mode is Mode.engine:
        from sage_cli.benchmark.colocation_engine import run_on_engines

        run_on_engines(grid)
    else:
        from sage_cli.benchmark.colocation_sim import run_in_simulator

        run_in_simulator(grid)
