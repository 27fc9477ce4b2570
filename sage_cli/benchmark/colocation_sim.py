"""``sage llm benchmark --workload colocation`` (``--mode sim``): the colocation grid in the simulator.

The simulator (`engine_adapter.sim.colocation.benchmark.run_colocation_benchmark`) is imported only
when the command runs; it writes ``--output`` itself. Its pool runs the registered eviction policy
``--eviction-policies`` names (``policy=``; default lru).
"""

from __future__ import annotations

from sage_cli.benchmark.colocation import ColocationGrid, colocation_table
from sage_cli.errors import CLIUsageError
from sage_cli.output import Output

__all__ = ["run_in_simulator"]


def run_in_simulator(grid: ColocationGrid) -> None:
    """Run the grid in the simulator behind a progress bar; print the table (or JSON).

    Raises:
        CLIUsageError: The simulator's `ColocationBenchmarkError` (a bad system name, say).
    """
    from rich.console import Console
    from rich.progress import Progress

    from engine_adapter.sim.colocation.benchmark import ColocationBenchmarkError, run_colocation_benchmark

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("colocation", total=len(grid.ratios) * len(grid.loads) * len(grid.seeds))
        try:
            result = run_colocation_benchmark(
                ratios=grid.ratios,
                loads=grid.loads,
                arrival=grid.arrival,
                output_length=grid.output_length,
                compute=grid.compute,
                seeds=grid.seeds,
                systems=grid.systems,
                alpha=grid.alpha,
                beta=grid.beta,
                gamma=grid.gamma,
                duration_s=grid.duration if grid.duration is not None else 60.0,
                output=grid.output,
                progress=lambda done, total: bar.update(task, completed=done),
                policy=grid.policy,
            )
        except ColocationBenchmarkError as exc:
            raise CLIUsageError(str(exc)) from None
    Output(grid.json_out).result(result, lambda: colocation_table(result, grid.policy), wide=True)

