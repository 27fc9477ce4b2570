"""The flat row's event loop in one compiled call (`engine_adapter.sim._flat_run`).

`Simulator.run()` of a flat row spends its time in the Python event loop (about 20 us a request:
`advance` and its steps, a `SimSequence` a request, a `SimRequest` built from a `RequestTable`),
not in the flat cache, whose lookups run in C (`FlatState`). Where it can, the whole loop runs
in one compiled call instead: the requests go in as arrays (a `RequestTable`'s own columns, or
arrays built once from a list), each admitted request is looked up in the `FlatState` at C level,
and the counters, TTFTs and TPOTs come back into the `RunState`, from which `Simulator.row`
builds the row as for the Python loop. Same row either way, timings aside
(tests/test_flat_run.py holds the two loops to it, TTFTs bit for bit).

It runs when (`compiled_run`): the flat cache model, its cache running "c-state", the
extension built (not under `SAGE_PURE_PYTHON`), and a plain `run()` (no fleet `horizon`: a
fleet drives its replicas through `advance`, which stays the Python loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine_adapter.sim.cost_model import CostModel
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.run_state import RunRequests, RunState
from engine_adapter.sim.workloads import any_tenant, request_ends
from sage_eviction import native

__all__ = [
    "FlatColumns",
    "LoopSettings",
    "compiled_loop",
    "compiled_run",
    "cost_coefficients",
    "flat_columns",
]

LOOP_MODULE = "engine_adapter.sim._flat_run"

Ints = npt.NDArray[np.int64]


class LoopSettings(Protocol):
    """What the loop reads of the `Simulator` that runs it (a protocol: the simulator imports
    this module, not the other way round)."""

    @property
    def cache_model(self) -> str: ...
    @property
    def horizon(self) -> float | None: ...
    @property
    def cost(self) -> CostModel: ...
    @property
    def block_size(self) -> int: ...
    @property
    def max_running(self) -> int: ...
    @property
    def max_prefill_tokens(self) -> int: ...
    @property
    def progress(self) -> Callable[[int], None] | None: ...
    @property
    def progress_every(self) -> int: ...


def cost_coefficients(cost: CostModel) -> tuple[float, float, float, float, float, float]:
    """The cost model's coefficients in the order the compiled loops' `Cost` holds them
    (_sim_loop.pxd): prefill base, per token, attention; decode base, per sequence, per token."""
    c = cost
    prefill = (c.prefill_base_s, c.prefill_per_token_s, c.prefill_attn_s)
    return (*prefill, c.decode_base_s, c.decode_per_seq_s, c.decode_per_context_token_s)


def compiled_loop() -> ModuleType | None:
    """The compiled loop, or None where it is not built or `SAGE_PURE_PYTHON` forces the Python
    loop (the tests replace this function to force it)."""
    return native.load(LOOP_MODULE)


@dataclass(frozen=True, slots=True)
class FlatColumns:
    """A run's requests as the compiled loop reads them: the lookup sequence (int32 or int64),
    each request's end in it, its arrival, prompt and output lengths, and its group as an int
    (tenant if any request has one, else session; None is a group of its own)."""

    keys: npt.NDArray[np.int32] | Ints
    ends: Ints
    arrivals: npt.NDArray[np.float64]
    input_len: Ints
    output_len: Ints
    groups: Ints
    n_groups: int


def _int64(values: object) -> Ints:
    """An int64 view of an array('q') (no copy)."""
    return np.frombuffer(values, dtype=np.int64)  # type: ignore[call-overload,no-any-return]


def _table_columns(table: RequestTable, by_tenant: bool) -> FlatColumns:
    """A table's own columns, no copy but the group codes: a `SimRequest` built per request is
    what this loop exists to avoid."""
    keys = table.key_array()
    assert keys is not None  # int keys: the flat cache runs "c-state" only then
    labels, n_labels = table.label_codes(by_tenant)
    codes = labels.astype(np.int64)
    codes[codes < 0] = n_labels  # None: one group after the labels
    input_len, output_len = table.lengths()
    return FlatColumns(
        keys=keys,
        ends=_int64(table.request_ends()),
        arrivals=table.arrivals(),
        input_len=input_len,
        output_len=output_len,
        groups=codes,
        n_groups=n_labels + 1,
    )


def _list_columns(requests: RunRequests, by_tenant: bool) -> FlatColumns:
    """Arrays built once from a list of `SimRequest`s (its keys are ints within int64: the flat
    cache runs "c-state" only then)."""
    n = len(requests)
    ends = _int64(request_ends(requests))
    rows = [requests[i] for i in range(n)]
    codes: dict[object, int] = {}
    groups = [codes.setdefault(r.tenant if by_tenant else r.session, len(codes)) for r in rows]
    return FlatColumns(
        keys=np.fromiter(
            (key for r in rows for key in r.block_hashes), dtype=np.int64, count=int(ends[-1]) if n else 0
        ),
        ends=ends,
        arrivals=np.fromiter((r.arrival_s for r in rows), dtype=np.float64, count=n),
        input_len=np.fromiter((r.input_len for r in rows), dtype=np.int64, count=n),
        output_len=np.fromiter((r.output_len for r in rows), dtype=np.int64, count=n),
        groups=np.asarray(groups, dtype=np.int64),
        n_groups=len(codes),
    )


def flat_columns(requests: RunRequests) -> FlatColumns:
    """The run's requests as arrays, grouped as `Simulator` groups them (tenants if any)."""
    by_tenant = any_tenant(requests)
    if isinstance(requests, RequestTable):
        return _table_columns(requests, by_tenant)
    return _list_columns(requests, by_tenant)


def compiled_run(sim: LoopSettings, st: RunState) -> str | None:
    """Run the whole of `st` in the compiled loop when it can (module docstring) and fill `st`
    as `Simulator.advance(st, math.inf)` leaves it for `Simulator.row`: None when it did, else
    why the Python loop must run (nothing done)."""
    loop = compiled_loop()
    flat = st.flat
    if loop is None:
        return native.unavailable(LOOP_MODULE)
    if flat is None:
        return "not a flat row"
    if sim.horizon is not None:
        return "a fleet replica"
    if flat.policy_calls != "c-state":
        calls = "its C table" if flat.policy_calls == "compiled" else "Python"
        return f"{flat.cache.policy.name} keeps no state in C, called through {calls}"
    columns = flat_columns(st.requests)
    try:
        _call(loop, sim, st, columns)
    finally:
        flat.cache.sync_from_state()
    return None


def _call(loop: ModuleType, sim: LoopSettings, st: RunState, columns: FlatColumns) -> None:
    """One call into the loop, its figures written into `st`."""
    assert st.flat is not None
    n, groups = len(columns.arrivals), columns.n_groups
    ttfts, tpots = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64)
    served, looked = np.zeros(groups, dtype=np.int64), np.zeros(groups, dtype=np.int64)
    order = np.empty(groups, dtype=np.int64)
    cost = cost_coefficients(sim.cost)
    figures = loop.run_flat(
        st.flat.cache.state,
        columns.keys,
        columns.ends,
        columns.arrivals,
        columns.input_len,
        columns.output_len,
        columns.groups,
        ttfts,
        tpots,
        served,
        looked,
        order,
        cost,
        sim.block_size,
        sim.max_running,
        sim.max_prefill_tokens,
        sim.progress,
        sim.progress_every,
        float(st.clock),
    )
    st.clock, st.step, n_ttfts, n_tpots, n_seen = figures[:5]
    st.block_lookups, st.block_hits, st.tokens_looked_up, st.tokens_hit = figures[5:9]
    st.total_tokens, st.finished = figures[9:]
    st.ttfts, st.tpots = ttfts[:n_ttfts].tolist(), tpots[:n_tpots].tolist()
    # the groups in the order of their first admission, as the Python loop's dict holds them
    hits, tokens = served.tolist(), looked.tolist()
    st.group_hits = {g: [hits[g], tokens[g]] for g in order[:n_seen].tolist()}
    st.next_arrival = st.queued = n
