"""Shared by the tests of the compiled radix loop's policy kinds (tests/test_radix_run.py,
tests/test_radix_pol_*.py): one kind (`PolicyProbe`) and its Python policy driven by the same
operation sequence, and small synthetic conversation workloads for whole rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

from engine_adapter.sim import radix_run
from engine_adapter.sim.capacity import min_capacity
from engine_adapter.sim.synthetic import synthetic
from engine_adapter.sim.workloads import Workload
from sage_eviction.base import EvictionPolicy

Op = tuple[str, int, bool]
OPS = ("insert", "insert", "insert", "access", "access", "lock", "unlock", "evict")


def probe(policy: EvictionPolicy, capacity: int) -> Any:
    """The compiled kind of `policy`'s class over a pool of `capacity` blocks."""
    loop = radix_run.radix_loop()
    assert loop is not None
    kind, flags = radix_run.policy_kind(type(policy))
    return loop.PolicyProbe(policy, kind, flags, capacity)


@st.composite
def sequences(
    draw: Callable[..., Any],
    max_capacity: int = 24,
    max_length: int = 240,
    ops: tuple[str, ...] = OPS,
    min_length: int = 0,
) -> tuple[list[Op], int]:
    """A pool and an operation sequence long enough to fill it several times over, on about
    twice as many keys as the pool holds: keys come back after their eviction (a node reused,
    its old state not its own), the pool stays full. Drawn as bytes, two an operation (what,
    which key, an insert's evictable flag: 3 leaves in 4), which hypothesis draws and shrinks
    far faster than a list of tuples. `ops`: the operations drawn from, equally likely; the
    sequence's length from `min_length` to `max_length`."""
    capacity = draw(st.integers(1, max_capacity))
    length = 2 * draw(st.integers(min_length, max_length))
    data = draw(st.binary(min_size=length, max_size=length))
    drawn = [
        (ops[what % len(ops)], key % (2 * capacity + 2), what // 8 % 4 != 0)
        for what, key in zip(data[::2], data[1::2], strict=False)
    ]
    return drawn, capacity


def _evict(reference: EvictionPolicy, compiled: Any, victims: tuple[list[Any], list[Any]]) -> None:
    victims[0].append(next(iter(reference.evict(1)), None))
    victims[1].append(compiled.evict())


def apply_ops(reference: EvictionPolicy, ops: list[Op], capacity: int) -> tuple[list[Any], list[Any], int]:
    """The sequence on `reference` (fresh) and on its probe, `num_evictable` and the sizes
    checked after each operation; each side's victims (None: nothing was evictable), then both
    drained, so that the state left behind is compared too; and how many came before the drain."""
    compiled = probe(reference, capacity)
    victims: tuple[list[Any], list[Any]] = ([], [])
    for op, key, flag in ops:
        held = key in reference
        if op == "insert" and not held:
            if len(reference) == capacity:  # full: make room first, as the cache does
                _evict(reference, compiled, victims)
            if len(reference) < capacity:
                reference.insert(key, evictable=flag)
                compiled.insert(key, flag)
        elif op == "access" and held:
            reference.access(key, 0.0)
            compiled.access(key)
        elif op in ("lock", "unlock") and held:
            reference.set_evictable(key, op == "unlock")
            compiled.set_evictable(key, op == "unlock")
        elif op == "evict":
            _evict(reference, compiled, victims)
        assert compiled.num_evictable == reference.num_evictable
        assert len(compiled) == len(reference)
    swept = len(victims[0])
    while reference.num_evictable:
        _evict(reference, compiled, victims)
    assert compiled.evict() is None
    return (*victims, swept)


@st.composite
def conversations(draw: Callable[..., Any]) -> tuple[Workload, int]:
    """A small synthetic workload of multi-turn conversations with shared system prompts, and a
    pool from the least that holds its largest request to a few blocks more (preemptions and
    evictions of locked chains' leaves happen there)."""
    block_size = draw(st.sampled_from([4, 8, 16]))
    workload = synthetic(
        requests=draw(st.integers(1, 40)),
        rate=draw(st.sampled_from([5.0, 50.0, 500.0])),
        input_tokens=draw(st.sampled_from([24.0, 96.0])),
        turn_tokens=32.0,
        output_tokens=draw(st.sampled_from([4.0, 24.0, 64.0])),
        max_input_tokens=256,
        seed=draw(st.integers(0, 2**16)),
        block_size=block_size,
        sessions=draw(st.integers(1, 8)),
        turns=3.0,
        system_prompts=draw(st.integers(0, 3)),
        system_prompt_tokens=32,
        tenants=draw(st.integers(0, 2)),
    )
    return workload, min_capacity(workload) + draw(st.integers(0, 24))


def pinned_conversations() -> Workload:
    """A fixed workload whose rows preempt at a pool of 40 blocks and 2 running sequences."""
    return synthetic(
        requests=30, rate=50.0, input_tokens=96, turn_tokens=32, output_tokens=24, max_input_tokens=256,
        seed=1, block_size=8, sessions=6, turns=3.0, system_prompts=2, system_prompt_tokens=32, tenants=2,
    )  # fmt: skip


def probe_agrees(reference: EvictionPolicy, ops: list[Op], capacity: int) -> None:
    """The sequence on `reference` and on its probe: the same victims, drain included (the
    hypothesis event says whether five or more came before the drain)."""
    expected, got, swept = apply_ops(reference, ops, capacity)
    early = sum(victim is not None for victim in expected[:swept])
    event(f"victims before the drain: {'5 or more' if early >= 5 else 'fewer'}")
    assert got == expected


HOT = ("access", "access", "lock", "unlock", "lock", "unlock")
"""Hits and evictable flips, no eviction: a heap's stale entries pile up until it is rebuilt."""


def through_rebuilds(reference: EvictionPolicy, ops: list[Op], capacity: int) -> None:
    """Every block of the pool cached, then `ops` (drawn from `HOT`) all on cached blocks: a
    heap kind outgrows twice its evictable blocks (and 64) and is rebuilt from its live entries,
    perhaps several times, then drained; the same victims."""
    filled: list[Op] = [("insert", key, True) for key in range(capacity)]
    held = [(op, key % capacity, flag) for op, key, flag in ops]
    expected, got, _ = apply_ops(reference, filled + held, capacity)
    assert got == expected
