"""Preemption orders: which running sequence a scheduler gives up first when the pool is short.

The order over running sequences is the scheduler's choice, not the block policy's: a block
policy orders cached blocks, and what it suggests for sequences is only a default. So every
order is written here once, as a `PreemptionOrder` (its Python key, its "<= bound" filter and
the compiled core's copy of the key), in one table, `ORDERS`; a policy class names its default
in `preemption_order` (e.g. ``"lfu"``), and `select_victims` takes any order the caller passes
(the engine's `--preemption-order`, the simulator's). A plugin with an order of its own
registers it with `register_order` and names it (docs/howto.md).

Keys compare with ``<``; the smaller is preempted first, ties by position (a stable sort).
`up_to(candidates, bound)` must keep exactly the candidates whose key is <= `bound`, in list
order: `select_in_order` uses it to skip computing every key when a sample suffices. The
compiled copies live in `sage_eviction/_core_select.pxi` (its `KINDS`); tests/test_native_core.py
holds each to its Python key.

Imports: the standard library and `sage_eviction.types` (the policy modules import the
constants their orders read from here, never the reverse).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sage_eviction.types import EvictionCandidate

__all__ = [
    "ORDERS",
    "POLICY",
    "PreemptionOrder",
    "UpTo",
    "get_order",
    "order_names",
    "register_order",
    "resolve_order",
]

Key = Callable[[EvictionCandidate], Any]
UpTo = Callable[[list[EvictionCandidate], Any], list[EvictionCandidate]]
"""An order's `up_to`: the candidates whose key is <= a bound, in list order."""


@dataclass(frozen=True, slots=True)
class PreemptionOrder:
    """One named order over running sequences.

    Attributes:
        name: Its name in `ORDERS` (what `--preemption-order` takes).
        key: Sort key of a candidate; smaller is preempted first.
        up_to: The candidates whose key is <= a bound, in one comprehension (no call per
            candidate), or None: `select_in_order` then computes every key.
        compiled: The compiled core's copy of `key`, its kind in `_core_select.pxi` and the
            constants it reads, or None: only Python orders by it.
        summary: One line for `--help` and the docs.
    """

    name: str
    key: Key
    up_to: UpTo | None
    compiled: tuple[str, tuple[float, ...]] | None
    summary: str


# ---- the keys and their filters ------------------------------------------------------------------


def _lru(c: EvictionCandidate) -> Any:
    return c.last_access_time


def _lru_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    return [c for c in cs if c.last_access_time <= bound]


def _mru(c: EvictionCandidate) -> Any:
    return -c.last_access_time


def _mru_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    return [c for c in cs if -c.last_access_time <= bound]


def _fifo(c: EvictionCandidate) -> Any:
    # sequence ids are given out in arrival order, and a candidate carries no creation time
    return c.sequence_id


def _fifo_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    return [c for c in cs if c.sequence_id <= bound]


def _filo(c: EvictionCandidate) -> Any:
    return -c.sequence_id


def _filo_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    return [c for c in cs if -c.sequence_id <= bound]


def _lfu(c: EvictionCandidate) -> Any:
    return (c.access_count, c.last_access_time)


def _lfu_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    count, t = bound
    return [c for c in cs if (c.last_access_time <= t and c.access_count <= count) or c.access_count < count]


def _priority(c: EvictionCandidate) -> Any:
    return (c.priority, c.last_access_time)


def _priority_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    priority, t = bound
    return [c for c in cs if (c.last_access_time <= t and c.priority <= priority) or c.priority < priority]


def _seen_once_first(c: EvictionCandidate) -> tuple[bool, float]:
    """Sequences seen once before sequences seen again, least recent first within each: the
    sequence-level order of the policies that split entries by reuse (ARC's T1/T2, SIEVE's
    visited bit, SLRU's segments) when the candidates carry only counts and times."""
    return (c.access_count > 1, c.last_access_time)


def _seen_once_first_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    again, t = bound
    if again:  # every first-timer, and the others up to t
        return [c for c in cs if c.access_count <= 1 or c.last_access_time <= t]
    return [c for c in cs if c.access_count <= 1 and c.last_access_time <= t]


# The policies' defaults that their orders read, defined here (the policy modules import them):
# an order is fixed by its constants, whatever params a policy instance was built with.
S3FIFO_MAX_FREQ = 3  # S3-FIFO's frequency cap
DEFAULT_DECODE_TIME_PER_TOKEN = 0.02  # predictive: seconds; a typical TPOT
DEFAULT_TOKEN_ESTIMATE_CONFIDENCE = 0.95  # predictive: its default predictor's confidence
DEFAULT_CONFIDENCE_THRESHOLD = 0.9  # predictive: the least confidence it trusts
DEFAULT_PRIORITY_BASE = 2.0  # slo
DEFAULT_EPS = 1e-3  # slo: seconds
DEFAULT_COST_WEIGHT = 1e-3  # slo: per token of recompute cost
DEFAULT_SLACK = 3600.0  # slo: seconds, for a block with no deadline
DEFAULT_PROTECT_COMPLETION = 0.9  # slo
_BY_TOKENS = DEFAULT_TOKEN_ESTIMATE_CONFIDENCE >= DEFAULT_CONFIDENCE_THRESHOLD
_SLO_SLACK = DEFAULT_SLACK + DEFAULT_EPS


def _s3fifo(c: EvictionCandidate) -> Any:
    # seen fewer than twice (the small queue) first, oldest first; then by capped frequency
    if c.access_count < 2:
        return (0, 0, c.last_access_time)
    return (1, min(c.access_count, S3FIFO_MAX_FREQ), c.last_access_time)


def _s3fifo_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    small, freq, t = bound
    if not small:  # (0, 0, t): the seen-once ones up to t
        return [c for c in cs if c.access_count < 2 and c.last_access_time <= t]
    if freq == S3FIFO_MAX_FREQ:
        return [c for c in cs if c.access_count < S3FIFO_MAX_FREQ or c.last_access_time <= t]
    if freq == 2 < S3FIFO_MAX_FREQ:
        return [c for c in cs if c.access_count < 2 or (c.access_count == 2 and c.last_access_time <= t)]
    return [c for c in cs if _s3fifo(c) <= bound]


def _gdsf(c: EvictionCandidate) -> Any:
    # with L = 0 at sequence level: (accesses + 1) * recompute cost (its tokens) / size (its blocks)
    blocks = max(len(c.block_ids), 1)
    return ((c.access_count + 1) * c.sequence_length / blocks, c.last_access_time)


def _gdsf_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    value, t = bound
    return [
        c
        for c in cs
        # `len(...) or 1` is max(len(...), 1) without a call
        if (v := (c.access_count + 1) * c.sequence_length / (len(c.block_ids) or 1)) < value
        or (v == value and c.last_access_time <= t)
    ]


def _predictive(c: EvictionCandidate) -> Any:
    # `estimated_lifetime` when given, else the default predictor's token estimate, else none
    # (last); then completion ratio, then LRU
    lifetime = c.estimated_lifetime
    if lifetime is None:
        if c.max_length > 0 and _BY_TOKENS:
            lifetime = max(c.max_length - c.sequence_length, 0) * DEFAULT_DECODE_TIME_PER_TOKEN
        else:
            lifetime = math.inf
    return (lifetime, -(c.sequence_length / c.max_length if c.max_length > 0 else 0.0), c.last_access_time)


def _predictive_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    return [
        c
        for c in cs
        if (
            c.estimated_lifetime
            if c.estimated_lifetime is not None
            else max(c.max_length - c.sequence_length, 0) * DEFAULT_DECODE_TIME_PER_TOKEN
            if c.max_length > 0 and _BY_TOKENS
            else math.inf,
            -(c.sequence_length / c.max_length if c.max_length > 0 else 0.0),
            c.last_access_time,
        )
        <= bound
    ]


def _slo(c: EvictionCandidate) -> Any:
    # no deadline is known for a sequence, so slack is the default; the recompute cost is its tokens
    protected = c.max_length > 0 and c.sequence_length >= DEFAULT_PROTECT_COMPLETION * c.max_length
    urgency = DEFAULT_PRIORITY_BASE**c.priority / _SLO_SLACK
    return (protected, urgency + DEFAULT_COST_WEIGHT * c.sequence_length, c.last_access_time)


def _slo_up_to(cs: list[EvictionCandidate], bound: Any) -> list[EvictionCandidate]:
    protected, value, t = bound
    urgency = {p: DEFAULT_PRIORITY_BASE**p / _SLO_SLACK for p in {c.priority for c in cs}}
    return [
        c
        for c in cs
        if (p := c.max_length > 0 and c.sequence_length >= DEFAULT_PROTECT_COMPLETION * c.max_length)
        < protected
        or (
            p == protected
            and (
                (v := urgency[c.priority] + DEFAULT_COST_WEIGHT * c.sequence_length) < value
                or (v == value and c.last_access_time <= t)
            )
        )
    ]


# ---- the table -----------------------------------------------------------------------------------

ORDERS: dict[str, PreemptionOrder] = {
    o.name: o
    for o in (
        PreemptionOrder("lru", _lru, _lru_up_to, ("lru", ()), "least recently accessed first"),
        PreemptionOrder("mru", _mru, _mru_up_to, ("mru", ()), "most recently accessed first"),
        PreemptionOrder("fifo", _fifo, _fifo_up_to, ("fifo", ()), "oldest (lowest sequence id) first"),
        PreemptionOrder("filo", _filo, _filo_up_to, ("filo", ()), "newest (highest sequence id) first"),
        PreemptionOrder("lfu", _lfu, _lfu_up_to, ("lfu", ()), "least accessed first, then lru"),
        PreemptionOrder(
            "priority", _priority, _priority_up_to, ("priority", ()), "lowest priority first, then lru"
        ),
        PreemptionOrder(
            "seen_once_first",
            _seen_once_first,
            _seen_once_first_up_to,
            ("seen_once_first", ()),
            "accessed at most once first, then lru (arc, sieve, slru)",
        ),
        PreemptionOrder(
            "s3fifo",
            _s3fifo,
            _s3fifo_up_to,
            ("s3fifo", (float(S3FIFO_MAX_FREQ),)),
            "accessed under twice first, then by capped frequency; oldest first within each",
        ),
        PreemptionOrder(
            "gdsf", _gdsf, _gdsf_up_to, ("gdsf", ()), "fewest (accesses+1) x tokens per block first, then lru"
        ),
        PreemptionOrder(
            "predictive",
            _predictive,
            _predictive_up_to,
            ("predictive", (DEFAULT_DECODE_TIME_PER_TOKEN, float(_BY_TOKENS))),
            "shortest predicted remaining lifetime first, then most complete, then lru",
        ),
        PreemptionOrder(
            "slo",
            _slo,
            _slo_up_to,
            ("slo", (DEFAULT_PRIORITY_BASE, _SLO_SLACK, DEFAULT_COST_WEIGHT, DEFAULT_PROTECT_COMPLETION)),
            "nearly complete last; lowest urgency + recompute cost first, then lru",
        ),
    )
}
"""Every named order: the built-ins' and any a plugin registered (`register_order`)."""


def order_names() -> list[str]:
    """The registered orders' names, sorted."""
    return sorted(ORDERS)


def get_order(name: str) -> PreemptionOrder:
    """The order called `name`.

    Raises:
        ValueError: No order has that name (the message lists those that exist).
    """
    try:
        return ORDERS[name]
    except KeyError:
        known = ", ".join([POLICY, *order_names()])
        raise ValueError(f"unknown preemption order {name!r}; known: {known}") from None


POLICY = "policy"
"""The option value (`--preemption-order`'s default) that means the policy's own default order."""


def resolve_order(name: str) -> PreemptionOrder | None:
    """What a scheduler's preemption order option means: None for `POLICY` (each policy's own
    default, which follows a hot swap), else `get_order(name)`.

    Raises:
        ValueError: No order has that name.
    """
    return None if name == POLICY else get_order(name)


def register_order(order: PreemptionOrder) -> PreemptionOrder:
    """Add a plugin's order to `ORDERS`, so a policy can name it in `preemption_order` and a user
    in `--preemption-order`. Python only: a plugin's order has no compiled copy (`compiled` must
    be None), and a name that exists already is an error, not a silent replacement.

    Raises:
        ValueError: The name is taken by another order, or `compiled` is set.
    """
    if order.compiled is not None:
        raise ValueError(f"preemption order {order.name!r}: a plugin's order has no compiled copy")
    if ORDERS.get(order.name, order) is not order:
        raise ValueError(f"preemption order {order.name!r} exists already")
    ORDERS[order.name] = order
    return order
