"""The colocation systems of the comparison: `SystemSpec` and the table `SYSTEMS`.

A system is a partition of the pool (none, static, dynamic), whether the `ColocationController`
runs Algorithms 1 and 3, whether work that can no longer meet its SLO is dropped, and how
embedding batches are ordered and run. The rows are the baselines (static partitions, one shared
pool, each with and without deadline-aware admission), the spec's system with each algorithm
ablated, and sage's with each algorithm ablated.

Pure data; imports nothing of the run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_SYSTEMS", "SYSTEMS", "SystemSpec", "system_named"]


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """One colocation system of the comparison.

    Attributes:
        name: Its row name.
        partition: ``"none"`` (one shared pool, no quotas), ``"static:F"`` (LLM share F) or
            ``"dynamic"`` (Algorithm 2).
        controller: ``"spec"``, ``"sage"`` or None (a baseline without the controller).
        alg1: Algorithm 1 admits LLM requests (else first come, first served).
        alg3: Algorithm 3 picks preemption victims (else the latest arrival, as vLLM does).
        deadline_drop: Queued work that can no longer meet its SLO is dropped with a reason.
        edf: Embedding batches run one at a time, earliest deadline first (else all that fit
            run together, first come first served).
        chunked: Under shared compute, embedding work runs in chunks fused into LLM steps.
        embedding_admission: The controller admits embedding batches (fit and deadline).
        borrow: The LLM side may hold blocks of the embedding quota that no embedding batch
            uses or waits for; a batch that needs them back preempts (work-conserving quotas).
    """

    name: str
    partition: str
    controller: str | None = None
    alg1: bool = False
    alg3: bool = False
    deadline_drop: bool = False
    edf: bool = False
    chunked: bool = False
    embedding_admission: bool = False
    borrow: bool = False


def _systems() -> dict[str, SystemSpec]:
    rows = [
        SystemSpec("static-50/50", "static:0.5"),
        SystemSpec("static-80/20", "static:0.8"),
        SystemSpec("shared-lru", "none"),
        SystemSpec("static-50/50+adm", "static:0.5", deadline_drop=True),
        SystemSpec("static-80/20+adm", "static:0.8", deadline_drop=True),
        SystemSpec("shared-lru+adm", "none", deadline_drop=True),
        SystemSpec("spec", "dynamic", "spec", alg1=True, alg3=True),
        SystemSpec("spec-no-alg1", "dynamic", "spec", alg1=False, alg3=True),
        SystemSpec("spec-no-alg2", "static:0.7", "spec", alg1=True, alg3=True),
        SystemSpec("spec-no-alg3", "dynamic", "spec", alg1=True, alg3=False),
    ]
    sage = {"deadline_drop": True, "edf": True, "chunked": True, "embedding_admission": True, "borrow": True}
    rows += [
        SystemSpec("sage", "dynamic", "sage", alg1=True, alg3=True, **sage),
        SystemSpec("sage-no-alg1", "dynamic", "sage", alg1=False, alg3=True, **sage),
        SystemSpec("sage-no-alg2", "static:0.7", "sage", alg1=True, alg3=True, **sage),
        SystemSpec("sage-no-alg3", "dynamic", "sage", alg1=True, alg3=False, **sage),
    ]
    return {row.name: row for row in rows}


SYSTEMS: dict[str, SystemSpec] = _systems()
DEFAULT_SYSTEMS = tuple(SYSTEMS)


def system_named(system: SystemSpec | str) -> SystemSpec:
    """`system` itself, or the row of `SYSTEMS` it names.

    Raises:
        ValueError: An unknown name.
    """
    if isinstance(system, SystemSpec):
        return system
    if system not in SYSTEMS:
        raise ValueError(f"unknown colocation system {system!r}; systems: {', '.join(SYSTEMS)}")
    return SYSTEMS[system]
