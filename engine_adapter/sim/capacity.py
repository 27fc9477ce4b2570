"""How many blocks a simulated engine may hold: the smallest capacity the radix model can run a
workload in, and a row's capacity checked against it (the unbounded row's is the workload's
distinct blocks)."""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.sim.workloads import SimRequest, Workload, unique_blocks

__all__ = ["checked_capacity", "min_capacity"]


def min_capacity(workload: Workload | Sequence[SimRequest], block_size: int | None = None) -> int:
    """Blocks the largest request needs at its full length (prompt and output): the smallest
    capacity the radix model can run."""
    requests = workload.requests if isinstance(workload, Workload) else workload
    bs = workload.block_size if isinstance(workload, Workload) else block_size
    if bs is None:
        raise ValueError("give block_size with a list of requests")
    need = 0
    for r in requests:
        prompt = max(r.input_len, len(r.block_hashes) * bs)
        need = max(need, -(-(prompt + max(r.output_len - 1, 0)) // bs))
    return need


def checked_capacity(
    workload: Workload, holds_running: bool, unbounded: bool, capacity_blocks: int | None
) -> int:
    """A row's capacity in blocks: the workload's distinct blocks when `unbounded`, else
    `capacity_blocks`, at least the largest request where the pool `holds_running` requests'
    blocks (`CacheModelKind.holds_running`: the radix and sglang models).

    Raises:
        ValueError: No positive capacity, or one that cannot hold the largest request.
    """
    if unbounded:
        capacity_blocks = max(1, unique_blocks(workload.requests))
    if capacity_blocks is None or type(capacity_blocks) is not int or capacity_blocks < 1:
        raise ValueError(f"capacity_blocks={capacity_blocks!r} must be a positive number of blocks")
    if holds_running and not unbounded:
        need = min_capacity(workload)
        if capacity_blocks < need:
            raise ValueError(
                f"capacity {capacity_blocks} blocks cannot hold the largest request of the workload "
                f"({need} blocks with its output); give at least {need}"
            )
    return capacity_blocks
