"""The ghost set's compact records (engine_adapter.cache.ghosts, issue 34 item 2): one shared
record per eviction call, a tuple per victim. Held against a plain reference written from the
definition: an ordered map of whole `Ghost`s, oldest dropped first, and each ghost's distinct
count taken by brute force over the counted lookups (hits and ghost misses), capped at the
horizon. Small horizons force the clock's compactions, which remap each eviction call's stamp
once however many of its victims are still ghosts."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import astuple

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.ghosts import Ghost, GhostSet


class _Reference:
    """`GhostSet` from its definition: no clock, no compaction, no shared records."""

    def __init__(self, capacity: int, horizon: int) -> None:
        self.capacity, self.horizon = capacity, horizon
        self.ghosts: OrderedDict[int, Ghost] = OrderedDict()
        self.counted: list[int] = []  # every counted lookup's key, in order

    def distinct_since(self, position: int) -> int:
        return min(self.horizon, len(set(self.counted[position:])))

    def evict(self, keys: list[int], first_id: int, tenants: list[str | None], kept: int) -> None:
        for i, (key, tenant) in enumerate(zip(keys, tenants, strict=True)):
            self.ghosts.pop(key, None)
            self.ghosts[key] = Ghost(first_id + i, float(first_id), len(self.counted), kept, "lru", tenant)
        while len(self.ghosts) > self.capacity:
            self.ghosts.popitem(last=False)

    def lookup(self, keys: list[int], n_hit: int) -> list[tuple[int, tuple[object, ...], bool]]:
        self.counted += keys[:n_hit]
        found = []
        for i in range(n_hit, len(keys)):
            ghost = self.ghosts.pop(keys[i], None)
            if ghost is not None:
                regret = self.distinct_since(ghost.stamp) < ghost.kept
                found.append((i, astuple(ghost)[:2] + astuple(ghost)[3:], regret))
                self.counted.append(keys[i])
        return found


_OPS = st.lists(
    st.tuples(
        st.booleans(),  # an eviction call, else a lookup
        st.lists(st.integers(0, 30), min_size=1, max_size=8, unique=True),  # distinct keys
        st.integers(0, 8),  # the lookup's hits, or the call's kept blocks
        st.booleans(),  # a second tenant on the odd victims
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 12), horizon=st.integers(1, 6), ops=_OPS)
def test_compact_records_answer_as_whole_ghosts(
    capacity: int, horizon: int, ops: list[tuple[bool, list[int], int, bool]]
) -> None:
    ghosts, reference = GhostSet(capacity, horizon=horizon), _Reference(capacity, horizon)
    next_id = 1
    for evict, keys, n, two_tenants in ops:
        if evict:
            tenants = [("b" if two_tenants and i % 2 else None) for i in range(len(keys))]
            call = GhostSet.eviction(float(next_id), ghosts.stamp(), n, "lru")
            ghosts.add_records(
                [(k, (next_id + i, t, call)) for i, (k, t) in enumerate(zip(keys, tenants, strict=True))]
            )
            reference.evict(keys, next_id, tenants, n)
            next_id += len(keys)
        else:
            n_hit = min(n, len(keys))
            _, found = ghosts.lookup(keys, n_hit)
            # the stamp is a clock position (renumbered by compactions): compared through regret
            got = [(i, astuple(g)[:2] + astuple(g)[3:], regret) for i, g, regret in found]
            assert got == reference.lookup(keys, n_hit)
        assert list(ghosts._ghosts) == list(reference.ghosts)  # same keys, same order
        for key, ghost in reference.ghosts.items():
            peeked = ghosts.peek(key)
            assert peeked is not None and peeked.eviction_id == ghost.eviction_id
            assert peeked.tenant == ghost.tenant and peeked.kept == ghost.kept


def test_a_compaction_remaps_an_eviction_calls_shared_stamp_once() -> None:
    """Two victims of one call share its stamp; the clock's compaction (after 8 * 4 + 64
    positions) must renumber it once: remapped twice, the count since it would read all four
    kept keys instead of the two looked up after the eviction, and the regret would vanish."""
    ghosts = GhostSet(16, horizon=4)
    ghosts.lookup(["p", "q", "r", "s", "c", "d", "a", "b"], 8)  # positions 0..7
    call = GhostSet.eviction(0.0, ghosts.stamp(), 3, "lru")  # stamp 8; three blocks kept
    ghosts.add_records([("x", (1, None, call)), ("y", (2, None, call))])
    for i in range(100):  # only a and b again: the clock compacts, keeping c, d, a, b (p..s forgotten)
        ghosts.lookup(["a" if i % 2 else "b"], 1)
    _, found = ghosts.lookup(["x", "y"], 0)
    # x: a and b since its eviction (2 < 3 kept): a regret; y: x came back too (3): none
    assert [(i, g.eviction_id, regret) for i, g, regret in found] == [(0, 1, True), (1, 2, False)]
