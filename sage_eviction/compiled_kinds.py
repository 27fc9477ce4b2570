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

The flat cache and the radix loop share one C home for their policies (issue 50, item 1): a
file per kind over node-indexed state (sage_eviction/_kind_*.pxi; `C_KINDS` below), whose
dispatch, sage_eviction/_kinds.pxi, is generated from `C_KINDS` and `VARIANTS` by
scripts/gen_kinds.py (tests/test_compiled_kinds.py fails when it is stale), and `C_CODES` says
which kind and variant runs each policy. The engine's table (``ops``) is still checked rather
than generated. A policy not listed runs its Python methods everywhere (`policy_calls` says so
in a row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COMPILED_KINDS",
    "C_CODES",
    "C_KINDS",
    "HOMES",
    "NO_ORDER",
    "VARIANTS",
    "CKind",
    "CompiledKind",
    "Home",
    "c_codes",
    "compiled_in",
]

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
    "lfu": CompiledKind(ops=True, flat=True, radix=True),
    "gdsf": CompiledKind(ops=True, flat=True, radix=True),
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


@dataclass(frozen=True, slots=True)
class CKind:
    """One kind of the policies' C home: the file sage_eviction/_kind_<file>.pxi, whose functions
    `_<prefix>_init` (nodes, the Python policy or what the kind reads), `_free`, `_insert`,
    `_access`, `_evictable` and `_pop` are the hooks of the policies it runs, over int32 node
    ids; `prepare`: it has `_<prefix>_prepare` (`prepare_insert`); `serve`: the function of its
    file that `RadixModel.allocate`'s `serve` calls, if any. Kinds may share a file (the score
    heap's gdsf and belady)."""

    name: str  # its code's name in C: P_<name>
    code: int
    file: str
    prefix: str
    prepare: bool = False
    serve: str | None = None


C_KINDS: tuple[CKind, ...] = (
    CKind("TICK", 0, "tick", "tick"),  # lru, fifo, mru, filo
    CKind("SIEVE", 1, "sieve", "sieve"),
    CKind("LEVELLED", 2, "levelled", "lvl"),  # lfu
    CKind("S3FIFO", 3, "s3fifo", "s3fifo", prepare=True),
    CKind("ARC", 5, "arc", "arc", prepare=True),
    CKind("GDSF", 10, "score", "score"),
    CKind("BELADY", 11, "score", "score", serve="_belady_serve"),  # the radix model's Belady
)
"""The kinds of the policies' C home, in dispatch order."""

NO_ORDER = 12
"""P_NONE: no eviction order and no state (the radix loop's unbounded reference row)."""

VARIANTS: dict[str, int] = {"TOUCH_ON_ACCESS": 1, "NEWEST_FIRST": 2, "LEVEL_HITS": 0}
"""The kinds' variants (`Nodes.flags`): the tick kind's bits (a hit gives the newest tick; the
newest tick goes first), the levelled kind's level (hits since insert)."""

C_CODES: dict[str, tuple[str, int]] = {
    "lru": ("TICK", VARIANTS["TOUCH_ON_ACCESS"]),
    "fifo": ("TICK", 0),
    "mru": ("TICK", VARIANTS["TOUCH_ON_ACCESS"] | VARIANTS["NEWEST_FIRST"]),
    "filo": ("TICK", VARIANTS["NEWEST_FIRST"]),
    "sieve": ("SIEVE", 0),
    "lfu": ("LEVELLED", VARIANTS["LEVEL_HITS"]),
    "s3fifo": ("S3FIFO", 0),
    "arc": ("ARC", 0),
    "gdsf": ("GDSF", 0),
    "belady": ("BELADY", 0),
}
"""Registry name -> the kind (by name) and variant that run it in the C home. The flat cache's
belady is `BeladyPolicy` over its whole future (its own heap in `FlatState`), not this kind."""


def c_codes(name: str) -> tuple[int, int]:
    """The C home's (kind code, variant) of policy `name` (KeyError: it has none)."""
    kind, variant = C_CODES[name]
    return next(k.code for k in C_KINDS if k.name == kind), variant
