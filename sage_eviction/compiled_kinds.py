"""Where each built-in policy runs compiled: the one table of compiled kinds.

Three compiled homes run a built-in policy at C speed, and each keeps its own table of the
policies it has a kind for. A kind is registered here, once; each home's table is derived from
this one or checked against it (tests/test_compiled_kinds.py fails when a policy is in one home's
table and not in what this table says):

- ``ops``: the engine's compiled operations over the Python policy object (the policies' core,
  sage_eviction/_core_ops*.pxi; `_core.compiled_policies()`), checked against this table;
- ``flat``: the flat cache's state in C (sage_eviction/_core_flat_state.pxi;
  `_core.flat_state_policies()`), checked against this table;
- ``radix``: the simulator's radix loop (engine_adapter/sim/_radix_run.pyx), whose table of
  policy classes `engine_adapter.sim.radix_run` derives from `compiled_in("radix")`.

The two tables in the core's .pxi sources are checked rather than generated (they are C
dispatch over Cython symbols; generating them is issue 50's item 1). A policy not listed runs
its Python methods everywhere (`policy_calls` says so in a row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["COMPILED_KINDS", "HOMES", "CompiledKind", "Home", "compiled_in"]

Home = Literal["ops", "flat", "radix"]
HOMES: tuple[Home, ...] = ("ops", "flat", "radix")


@dataclass(frozen=True, slots=True)
class CompiledKind:
    """The compiled homes of one built-in policy (module docstring)."""

    ops: bool = False
    flat: bool = False
    radix: bool = False


COMPILED_KINDS: dict[str, CompiledKind] = {
    "lru": CompiledKind(ops=True, flat=True, radix=True),
    "fifo": CompiledKind(ops=True, flat=True, radix=True),
    "mru": CompiledKind(ops=True, flat=True, radix=True),
    "filo": CompiledKind(ops=True, flat=True, radix=True),
    "sieve": CompiledKind(ops=True, flat=True, radix=True),
    "s3fifo": CompiledKind(ops=True, flat=True, radix=True),
    "arc": CompiledKind(ops=True, flat=True, radix=True),
    "belady": CompiledKind(ops=True, flat=True, radix=True),
    "lfu": CompiledKind(ops=True, radix=True),
    "gdsf": CompiledKind(ops=True, radix=True),
    "priority": CompiledKind(ops=True),
    "slru": CompiledKind(ops=True),
    "mq": CompiledKind(ops=True),
    "predictive": CompiledKind(ops=True),
    "slo": CompiledKind(ops=True),
}
"""Registry name -> its compiled homes. ``reuse`` (learnt online) has none."""


def compiled_in(home: Home) -> list[str]:
    """The registry names of the policies `home` runs compiled, in this table's order."""
    if home not in HOMES:
        raise ValueError(f"unknown compiled home {home!r}; homes: {', '.join(HOMES)}")
    return [name for name, kind in COMPILED_KINDS.items() if getattr(kind, home)]
