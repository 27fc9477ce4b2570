"""S3-FIFO, ARC and MQ: their C operations (sage_eviction/_core_ops_ghosts.pxi) on the paths
the generic sequences of tests/test_policy_ops.py do not reach.

There, 12 keys under a capacity of 64 blocks never fill ARC's directory (case IV), never
expire an MQ lifetime (10,000 ticks) and never trim a ghost queue. Here a cache driver
requests keys from a range larger than a small capacity, as a cache does: a hit is an access,
a miss (optionally announced by `prepare_insert`) evicts until there is room and inserts, and
keys are pinned and unpinned on the way. One twin runs through the C table
(`PolicyOpsCaller`), the other through the Python methods; their outcomes and their whole
state must agree after every request. The fixed-seed runs also check, on the reference, that
the rare paths really ran (ghost hits both ways, p moving up and down, T1's drop without a
ghost, S-to-M moves, ghost trims, MQ's lifetime demotions and its history's resumed
frequencies), so that a broken hook on one of them cannot pass unseen.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Hashable
from itertools import pairwise
from typing import Any

import pytest
from conftest import COMPILED_CORE_MISSING, compiled_core_built
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policy_ops import state

from sage_eviction import EntryMeta, EvictionPolicy, create_policy, native
from sage_eviction.errors import SageEvictionError

pytestmark = pytest.mark.skipif(not compiled_core_built(), reason=COMPILED_CORE_MISSING)

# (request key, announce the miss with prepare_insert, insert evictable, pin/unpin another key)
Request = tuple[int, bool, bool, int | None]


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except SageEvictionError as exc:
        return (type(exc).__name__, str(exc))


def _serve(policy: EvictionPolicy, through: Any, capacity: int, request: Request, now: float) -> Any:
    """One request on `policy`, its four operations called through `through`."""
    key, announce, evictable, toggle = request
    if toggle is not None and toggle in policy:
        through.set_evictable(toggle, not policy.is_evictable(toggle))
    if key in policy:
        return ("hit", _outcome(lambda: through.access(key, now)))
    if announce:
        policy.prepare_insert(key)  # Python on both: the radix core does not call it via the table
    victims: list[Hashable] = []
    while len(policy) >= capacity:
        out = through.evict(1)
        if not out:
            break
        victims.extend(out)
    return ("miss", victims, _outcome(lambda: through.insert(key, EntryMeta(), evictable=evictable)))


def picture(policy: EvictionPolicy) -> Any:
    """`policy_state` of tests/test_policy_ops.py, with the metas by their reprs (every field,
    by value): `dataclasses.asdict` per meta per step made these runs ten times slower."""
    fields = dict(vars(policy))
    fields.pop("_select_latency", None)  # wall-clock samples of select_victims (none here)
    metas = fields.pop("_meta")
    return state(fields), [(key, repr(meta)) for key, meta in metas.items()]


def drive(name: str, params: dict[str, Any], requests: list[Request], observe: Any = None) -> None:
    """Both twins serve `requests`; outcomes and state must agree after each one. `observe`
    (reference, request) runs on the reference before each request."""
    compiled, reference = create_policy(name, **params), create_policy(name, **params)
    caller = native.load(native.CORE).PolicyOpsCaller(compiled)
    capacity = params["capacity"]
    for step, request in enumerate(requests):
        if observe is not None:
            observe(reference, request)
        now = float(step)
        got = _serve(compiled, caller, capacity, request, now)
        assert got == _serve(reference, reference, capacity, request, now), (step, request)
        assert picture(compiled) == picture(reference), (step, request)
    assert compiled.entries() == reference.entries()
    assert compiled.peek(len(compiled)) == reference.peek(len(reference))


# Keys are drawn from 0..26 and folded onto the 3c + 2 keys of the drawn capacity c.
_KEY = st.integers(0, 26)
REQUESTS = st.lists(
    st.tuples(_KEY, st.booleans(), st.integers(0, 7).map(bool), st.one_of(st.none(), _KEY)),
    min_size=20,
    max_size=80,
)


POLICIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "arc": st.fixed_dictionaries({"capacity": st.integers(1, 8)}),
    "s3fifo": st.fixed_dictionaries(
        {
            "capacity": st.integers(1, 12),
            "small_ratio": st.sampled_from([0.1, 0.25, 0.5]),
            "ghost_ratio": st.sampled_from([0.0, 0.5, 0.9, 2.0]),
            "move_threshold": st.integers(1, 3),
        }
    ),
    "mq": st.fixed_dictionaries(
        {
            "capacity": st.integers(1, 8),
            "n_queues": st.integers(1, 4),
            "lifetime": st.integers(1, 6),
            "qout_ratio": st.sampled_from([0.0, 0.5, 1.0, 4.0]),
        }
    ),
}


# the quick loop keeps arc; the full run all three
@pytest.mark.parametrize(
    "name", [n if n == "arc" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(POLICIES)]
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), requests=REQUESTS)
def test_a_small_cache_under_pressure_gives_the_same_state(
    name: str, data: st.DataObject, requests: list[Request]
) -> None:
    params = data.draw(POLICIES[name])
    keys = 3 * params["capacity"] + 2
    folded = [(k % keys, a, e, None if t is None else t % keys) for k, a, e, t in requests]
    drive(name, params, folded)


def _workload(seed: int, capacity: int, n: int = 600) -> list[Request]:
    """Hot keys, a loop over twice the capacity, and one-off keys, mixed; some pins."""
    rng = random.Random(seed)
    out: list[Request] = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.4:
            key = rng.randrange(capacity // 2)
        elif pick < 0.8:
            key = 1000 + i % (2 * capacity)
        else:
            key = 10_000 + rng.randrange(4 * capacity)
        toggle = rng.randrange(capacity) if rng.random() < 0.1 else None
        out.append((key, rng.random() < 0.5, rng.random() < 0.9, toggle))
    return out


@dataclasses.dataclass
class Seen:
    """What the fixed-seed runs saw on the reference, request by request."""

    where: list[Any] = dataclasses.field(default_factory=list)  # the requested key's place
    values: list[Any] = dataclasses.field(default_factory=list)  # a policy value before it


def _arc_adaptation(arc: Any, request: Request) -> str | None:
    """How an unannounced ghost hit (adapted by `_on_insert`, in C on the compiled twin; an
    announced one adapts in Python's `prepare_insert`) moves p by more than the unit step,
    unclamped: "up" (|B2| / |B1| > 1 on a B1 hit) or "down" (|B1| / |B2| > 1 on a B2 hit)."""
    key, announce = request[0], request[1]
    if announce or key in arc:
        return None
    _, _, b1, b2 = arc.list_sizes()
    if key in arc._b1 and b2 > b1 and arc.p + b2 / b1 < arc.capacity:
        return "up"
    if key in arc._b2 and b1 > b2 and arc.p - b1 / b2 > 0:
        return "down"
    return None


def test_arc_adapts_p_both_ways_and_fills_its_directory() -> None:
    seen = Seen()

    def observe(arc: Any, request: Request) -> None:
        seen.where.append(arc.list_of(request[0]))
        seen.values.append((_arc_adaptation(arc, request), arc.list_sizes()))

    # The seed is one of the few (searched for) with both kinds of adaptation step.
    drive("arc", {"capacity": 8}, _workload(42, 8), observe)
    assert {"B1", "B2", "T1", "T2"} <= set(seen.where)  # ghost hits of both lists, hits in both
    assert {"up", "down"} <= {step for step, _ in seen.values}
    # case IV: L1 = T1 + B1 at c keys, and the whole directory at 2c
    assert any(t1 + b1 >= 8 for _, (t1, _t2, b1, _b2) in seen.values)
    assert any(sum(sizes) >= 16 for _, sizes in seen.values)
    # T1 alone full: its LRU block leaves without becoming a ghost (a scan after a cold start)
    drive("arc", {"capacity": 4}, [(k, False, True, None) for k in range(12)])
    arc = create_policy("arc", capacity=4)
    caller = native.load(native.CORE).PolicyOpsCaller(arc)
    for k in range(4):
        caller.insert(k)
    assert caller.evict(1) == [0] and arc.list_of(0) is None


def _arc_rare_replace(arc: Any, request: Request) -> set[str]:
    """Which rare REPLACE the miss `request` on a full `arc` is about to take: the B2 tie-break
    of an announced ghost hit (|T1| = p after p shrinks), or case IV.B (the directory at 2c
    while L1 is not at c: B2's LRU key is dropped before REPLACE)."""
    key, announce = request[0], request[1]
    c = arc.capacity
    if key in arc or len(arc) < c:
        return set()
    n1, n2, b1, b2 = arc.list_sizes()
    out = set()
    shrunk = max(arc.p - max(b1 / max(b2, 1), 1.0), 0.0)  # p after the B2 hit adapts it
    if announce and key in arc._b2 and arc._t1 and arc._t2 and n1 == shrunk:
        out.add("B2 tie-break")
    ghost = key in arc._b1 or key in arc._b2
    if not (announce and ghost) and n1 + b1 < c and n1 + n2 + b1 + b2 >= 2 * c and b2:
        out.add("case IV.B")
    return out


def test_arc_replace_breaks_the_b2_tie_and_trims_b2_at_2c() -> None:
    # The seed is one of the few (searched for) whose run takes both rare REPLACE paths.
    taken: set[str] = set()
    drive("arc", {"capacity": 6}, _workload(26, 6), lambda arc, r: taken.update(_arc_rare_replace(arc, r)))
    assert taken == {"B2 tie-break", "case IV.B"}


def test_s3fifo_moves_small_to_main_and_ghosts_back_to_main() -> None:
    seen = Seen()

    def observe(s3: Any, request: Request) -> None:
        seen.where.append(s3.queue_of(request[0]))
        seen.values.append(s3.queue_sizes())

    drive("s3fifo", {"capacity": 10, "small_ratio": 0.3, "ghost_ratio": 0.5}, _workload(2, 10), observe)
    assert {"ghost", "small", "main"} <= set(seen.where)
    assert max(g for _, _, g in seen.values) == 5  # the ghost queue reached its size: trimmed
    # an entry of S hit enough moves to M at the next eviction instead of leaving
    s3 = create_policy("s3fifo", capacity=10, small_ratio=0.3)
    caller = native.load(native.CORE).PolicyOpsCaller(s3)
    for k in range(3):
        caller.insert(k)
    caller.access(0)
    caller.access(0)
    assert caller.evict(1) == [1]
    assert s3.queue_of(0) == "main" and s3.queue_of(1) == "ghost" and s3.frequency(0) == 0


def test_mq_lifetimes_demote_and_the_history_resumes_frequencies() -> None:
    seen = Seen()

    def observe(mq: Any, request: Request) -> None:
        key = request[0]
        seen.where.append((key in mq, key in mq._qout, mq._qout.get(key)))
        seen.values.append(dict(mq._queue_of))

    drive("mq", {"capacity": 8, "n_queues": 4, "lifetime": 6, "qout_ratio": 1.0}, _workload(3, 8), observe)
    assert any(not held and remembered and freq >= 1 for held, remembered, freq in seen.where)
    demoted = [
        key
        for before, after in pairwise(seen.values)
        for key, queue in before.items()
        if key in after and after[key] < queue
    ]
    assert demoted, "no lifetime ever expired"
    # directly: a key hit to Q1 drops back to Q0 once its lifetime passes without a hit
    mq = create_policy("mq", capacity=8, lifetime=2)
    caller = native.load(native.CORE).PolicyOpsCaller(mq)
    caller.insert("hot")
    caller.access("hot")  # frequency 2: Q1, expires at vtime 1 + 2
    assert mq.queue_of("hot") == 1
    for k in range(3):
        caller.insert(k)
    assert mq.queue_of("hot") == 0
