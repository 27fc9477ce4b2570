"""The sglang model's queue orders and sage policies against SGLang 0.5.23's own classes.

- Queue orders: SGLang's `SchedulePolicy.calc_priority` (lpm, dfs-weight, fcfs with its refresh
  of waiting prefixes) orders real `Req` objects over a real `UnifiedRadixCache` (Python
  TreeCore, CPU); the model's `QueueOrder` orders the same prompts over `SGLangRadixTree`. After
  every round both queues must be in the same order and both trees the same (shape, locks, hit
  counts); at the end both evict everything, and the victims must come in the same order (so the
  matches refreshed the same nodes at the same times). Tokens are the model's page keys at one
  token per page, so SGLang's 32-token thresholds are exercised as they are.
- sage policies: SGLang's cache with sage's own component (`sage_full_component_class`, what
  ``--radix-eviction-policy sage-<name>`` installs) against the model's tree running the same
  policy (``sage-<name>``), on the operation sequences of test_twin.py.

Run (SGLang's venv; CI does not install SGLang):
    PYTHONPATH=$PWD ~/.cache/sage-kv/integrations/sglang-0.5.23/bin/python -m pytest -q \
        tests_integration/sglang/test_twin_queue.py
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.runtime_context import get_memory
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig

from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.twins.sglang_queue import QueueOrder
from engine_adapter.sim.twins.sglang_radix import SGLangRadixTree
from engine_adapter.sim.workloads import SimRequest
from sage_eviction.integrations import sglang as sage_sglang
from tests_integration.sglang.test_twin import KV_SIZE, UnifiedPair, operations, run


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")
    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
    monkeypatch.delenv("SAGE_EVICTION_LOG", raising=False)


class QueuePair:
    """SGLang's scheduler policy and cache, and the model's, over the same waiting prompts."""

    def __init__(
        self, schedule: str, eviction: str, cached: list[list[int]], waiting: list[list[int]]
    ) -> None:
        self.pair = UnifiedPair(eviction, None, 1)
        for prompt in cached:
            self.pair.insert(prompt, 0, 0)
        self.policy = SchedulePolicy(schedule, self.pair.real, False, False, False)
        self.order = QueueOrder(self.pair.model, schedule, 1)
        self.reqs = [
            Req(f"r{i}", "", array("q", p), SamplingParams(max_new_tokens=4)) for i, p in enumerate(waiting)
        ]
        self.seqs = deque(
            SimSequence(SimRequest(i, 0.0, tuple(p), len(p), 4), i, 1, None, 0) for i, p in enumerate(waiting)
        )

    def round(self) -> None:
        self.policy.calc_priority(self.reqs)
        self.order.order(self.seqs)
        assert [r.rid for r in self.reqs] == [f"r{s.sid}" for s in self.seqs]
        self.pair.check()

    def finish(self) -> None:
        """Both evict everything, one leaf at a time: the victims' order tells the access times
        apart."""
        while self.pair.model.evictable_size:
            self.pair.evict(1)
            self.pair.check()


stem = st.lists(st.integers(0, 2), min_size=20, max_size=44)
queues = st.tuples(
    st.lists(stem, min_size=1, max_size=3),  # shared prefixes (system prompts, documents)
    st.lists(
        st.tuples(st.integers(0, 2), st.booleans(), st.lists(st.integers(0, 3), max_size=8)), max_size=6
    ),
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
        min_size=1,
        max_size=12,
    ),
)


def prompts(drawn: tuple[Any, ...]) -> tuple[list[list[int]], list[list[int]]]:
    """Cached prompts (a stem, whole or cut short, and a tail) and waiting ones (a stem and a tail)."""
    stems, cached_draws, waiting_draws = drawn
    cached = [
        (stems[i % len(stems)] if whole else stems[i % len(stems)][:10]) + tail
        for i, whole, tail in cached_draws
    ]
    waiting = [stems[i % len(stems)] + tail for i, tail in waiting_draws]
    return cached, waiting


@pytest.mark.parametrize("schedule", ["lpm", "dfs-weight", "fcfs"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=queues, rounds=st.integers(1, 3))
def test_the_queue_order_is_sglangs(schedule: str, drawn: tuple[Any, ...], rounds: int) -> None:
    cached, waiting = prompts(drawn)
    pair = QueuePair(schedule, "lru", cached, waiting)
    for _ in range(rounds):
        pair.round()
    pair.finish()


@pytest.mark.parametrize("rounds", [20, 34])
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_fcfs_refreshes_the_waiting_prefixes_every_32nd_round(eviction: str, rounds: int) -> None:
    """Two chats on an older system prompt and one on a newer are cached; the queue holds the two
    older chats' next turns; a fourth chat arrives at round 10. The refresh of rounds 1 and 33
    (last waiting request first) makes the queued chats the newest, the head newest of all, which
    the final eviction order shows (after 20 rounds the fourth chat is newer, after 34 older); a
    non-lru strategy never refreshes."""
    old, new = [1] * 30, [2] * 30
    chats = [[*old, 3], [*old, 0, 3]]
    pair = QueuePair("fcfs", eviction, [*chats, [*new, 3]], [[*chat, 5] for chat in chats])
    # SGLang's scheduler reads the strategy from the server's arguments, not from the cache
    with get_memory().override(radix_eviction_policy=eviction):
        for i in range(rounds):
            if i == 10:
                pair.pair.insert([*new, 4], 0, 0)
            pair.round()
        pair.finish()


@pytest.mark.parametrize("shared", [31, 32, 33])
def test_lpm_holds_back_a_prompt_sharing_32_tokens_with_an_earlier_waiting_one(shared: int) -> None:
    """SGLang's in-batch prefix check at its threshold: uncached prompts, the second sharing
    `shared` tokens with the first (held back, behind the third, at 32 and more), the fourth cached."""
    stem = [1] * shared
    waiting = [[*stem, 2, 2], [*stem, 3], [7] * 3, [5] * 40 + [6]]
    pair = QueuePair("lpm", "lru", [[5] * 40], waiting)
    pair.round()
    second_last = shared >= 32
    assert [r.rid for r in pair.reqs] == (
        ["r3", "r0", "r2", "r1"] if second_last else ["r3", "r0", "r1", "r2"]
    )
    pair.finish()


def test_lpm_turns_to_fcfs_past_128_waiting() -> None:
    waiting = [[i % 3] * 5 + [7, i] for i in range(130)]
    pair = QueuePair("lpm", "lru", [[1] * 5 + [7]], waiting)
    pair.round()
    assert [r.rid for r in pair.reqs] == [f"r{i}" for i in range(130)]  # arrival order kept
    pair.finish()


SAGE_SPECS = ["lru", "lfu", "fifo", "sieve", "s3fifo:capacity=24,small_ratio=0.25", "arc:capacity=24"]


class SagePair(UnifiedPair):
    """SGLang's cache with sage's component running `spec`, and the model running ``sage-spec``."""

    def __init__(self, spec: str, page_size: int) -> None:
        cfg = CacheConfig(kv_size=KV_SIZE, eviction_policy="lru", page_size=page_size)
        override = {ComponentType.FULL: sage_sglang.sage_full_component_class(spec)}
        self.real, self.allocator = fixtures.build_fixture(cfg, component_registry_override=override)[:2]
        self.model = SGLangRadixTree(page_size, f"sage-{spec}")
        self.locks = []
        self.last = []
        self.inserted = []


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("spec", SAGE_SPECS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_a_sage_policy_in_the_model_is_the_same_policy_in_sglang(
    spec: str, page_size: int, ops: list
) -> None:
    run(SagePair(spec, page_size), ops)
