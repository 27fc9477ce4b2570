"""Radix rows run twice: in the compiled radix loop (`engine_adapter.sim.radix_run`) and in the
Python event loop over the real `CacheManager` (forced by replacing `radix_run.radix_loop`), for
the differential tests of tests/test_radix_run.py and tests/test_radix_pol_*.py.

`both_rows` gives each run's `Simulator` and row; `assert_same_rows` holds them equal field for
field (timings aside), `Simulator.ttft_s` bit for bit, with the compiled one having run compiled.
`outcome` runs a built `Simulator` in either loop and keeps the error a run raised, and
`assert_same_outcomes` holds two such outcomes equal (for drawn rows the Python code may refuse).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from engine_adapter.sim import radix_run
from engine_adapter.sim.simulator import Simulator
from engine_adapter.sim.workloads import Workload

TIMINGS = ("wall_s", "lookups_per_s", "eviction_p50_us", "eviction_p99_us")
"""Row fields that are wall times (or derived from them): never compared."""


@contextmanager
def python_loop() -> Iterator[None]:
    """Radix rows run the Python event loop inside this block."""
    compiled = radix_run.radix_loop
    radix_run.radix_loop = lambda: None
    try:
        yield
    finally:
        radix_run.radix_loop = compiled


def run_row(
    workload: Workload, policy: str, capacity: int | None, **options: Any
) -> tuple[Simulator, dict[str, Any]]:
    """One radix row: its simulator (after `run`) and its row."""
    sim = Simulator(workload, policy, capacity, **options)
    return sim, sim.run().to_dict()


def both_rows(
    workload: Workload, policy: str, capacity: int | None, **options: Any
) -> tuple[Simulator, dict[str, Any], Simulator, dict[str, Any]]:
    """The row compiled and in the Python loop: (compiled sim, its row, Python sim, its row)."""
    compiled, row = run_row(workload, policy, capacity, **options)
    with python_loop():
        reference, expected = run_row(workload, policy, capacity, **options)
    return compiled, row, reference, expected


def without_timings(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in TIMINGS}


def assert_same_rows(
    workload: Workload,
    policy: str,
    capacity: int | None,
    *,
    expect_compiled: bool = True,
    check: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The two rows equal (timings aside), the TTFTs bit for bit (`float.hex`), and the compiled
    run compiled (or, `expect_compiled=False`, in the Python loop as well); returns the row."""
    compiled, row, reference, expected = both_rows(workload, policy, capacity, **options)
    assert compiled.event_loop == ("compiled" if expect_compiled else "python")
    assert reference.event_loop == "python"
    assert without_timings(row) == without_timings(expected)
    assert [t.hex() for t in compiled.ttft_s] == [t.hex() for t in reference.ttft_s]
    if check is not None:
        check(row)
    return row


def outcome(sim: Simulator, python: bool) -> dict[str, Any]:
    """Run `sim` in the compiled loop, or (`python`) in the Python loop: its loop, row (timings
    aside) and TTFTs (`float.hex`), or the error it raised (a pool too small for a request: the
    Python code raises, and a compiled run hands such a row to it)."""
    try:
        with python_loop() if python else nullcontext():
            row = sim.run().to_dict()
    except Exception as exc:
        return {"raised": (type(exc), str(exc))}
    return {"loop": sim.event_loop, "row": without_timings(row), "ttft_s": [t.hex() for t in sim.ttft_s]}


def assert_same_outcomes(compiled: dict[str, Any], reference: dict[str, Any]) -> None:
    """The compiled run's `outcome` is the Python loop's, and it ran compiled unless the Python
    code raised (then both raised the same error)."""
    if "raised" not in reference:
        assert (compiled.pop("loop"), reference.pop("loop")) == ("compiled", "python")
    assert compiled == reference
