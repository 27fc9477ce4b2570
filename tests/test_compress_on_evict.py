"""Compress-on-evict in the cache core (issue 36 item 3; docs/architecture.md, "Compress on
evict"): an evicted chain is compacted in place instead of dropped, a later prompt hits it, and
a hypothesis state machine checks the pool's accounting under every operation.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.compressed import CompressSpec, parse_compress_spec
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.request import CacheRequest

BS = 4


def _manager(num_blocks: int = 12, spec: str | None = "knorm:0.75", **kw: object) -> CacheManager:
    pool = BlockAllocator(num_blocks, BS)
    return CacheManager(pool, compress_on_evict=spec, compiled=False, **kw)  # type: ignore[arg-type]


def _fill(m: CacheManager, seq: int, prompt: list[int]) -> None:
    m.allocate(CacheRequest(seq, prompt))
    m.free_sequence(seq, prompt)


def test_spec_parses_and_refuses_in_one_line() -> None:
    assert parse_compress_spec("KNORM:0.75") == CompressSpec("knorm", 0.75)
    assert parse_compress_spec("leverage:seed=1:0.9") == CompressSpec("leverage:seed=1", 0.9)
    assert CompressSpec("knorm", 0.75).kept(32) == 8
    bad_specs = [("knorm", "PRESS:RATIO"), ("knorm:x", "number"), ("knorm:1.0", "(0, 1)"), (":0.5", "PRESS")]
    for bad, says in bad_specs:
        with pytest.raises(ValueError, match=says) as info:
            parse_compress_spec(bad)
        assert "\n" not in str(info.value)


def test_an_evicted_chain_is_compressed_and_a_returning_prompt_hits_it() -> None:
    m = _manager()
    a = list(range(100, 133))  # 8 full blocks and one token
    _fill(m, 0, a)
    assert m.num_cached_blocks == 8
    _fill(m, 1, list(range(500, 525)))  # 7 blocks: 4 free, so 3 must be found
    counters = m.compressed_counters()
    assert counters is not None
    # the whole 8-block chain of `a` keeps int(32 * 0.25) = 8 tokens in 2 blocks; 6 go back
    assert (counters["compressions"], counters["blocks_compressed"], counters["blocks_freed"]) == (1, 8, 6)
    (move,) = m.take_compress_moves()
    assert (len(move.src), move.dst, move.start, move.kept) == (8, move.src[:2], 0, 8)
    assert m.stats().total_evictions == 0  # nothing dropped: the tokens are still hittable
    alloc = m.allocate(CacheRequest(2, [*a, 7, 7, 7]))
    assert (alloc.num_compressed_tokens, alloc.num_compressed_blocks, alloc.compressed_kept) == (32, 2, 8)
    assert alloc.num_cached_tokens == 32 and alloc.block_table[:2] == list(move.dst)
    state = m.sequence(2)
    assert state.compressed and state.num_tokens == 36 - 24  # its cache is 6 blocks shorter
    m.check_invariants()
    m.free_sequence(2, [*a, 7, 7, 7])
    m.check_invariants()
    assert m.compressed_counters()["hits"] == 1  # type: ignore[index]
    assert m.num_cached_blocks == 6  # b's 6 full blocks: the compressed sequence cached nothing


def test_a_partial_hit_needs_as_many_keys_as_the_entry_holds_blocks() -> None:
    m = _manager()
    a = list(range(100, 133))
    _fill(m, 0, a)
    _fill(m, 1, list(range(500, 525)))
    m.take_compress_moves()
    short = m.lookup(CacheRequest(2, [*a[:5], 9, 9, 9, 9]))  # one key of 8: less than 2 blocks
    assert short.num_cached_tokens == 0
    partial = m.allocate(CacheRequest(3, a[:12] + [9] * 5))  # 3 keys match: a hit on 3 blocks' tokens
    assert (partial.num_compressed_tokens, partial.num_compressed_blocks) == (12, 2)
    m.check_invariants()


def test_a_running_sequence_blocks_are_never_compressed_and_compressed_entries_drop_last() -> None:
    m = _manager(num_blocks=16)
    shared = list(range(100, 117))  # 4 full blocks
    m.allocate(CacheRequest(0, shared))
    m.commit_blocks(0, shared)  # cached and locked by the running sequence 0
    _fill(m, 1, shared + list(range(200, 216)))  # its 4 own blocks hang under the shared ones
    m.allocate(CacheRequest(2, list(range(300, 333))))  # needs 9: compresses only 1's own chain
    (move,) = m.take_compress_moves()
    running = set(m.block_table(0))
    assert not running & set(move.src) and len(move.src) == 4
    m.check_invariants()
    # with nothing left in the tree to evict, the compressed entry is dropped
    m.free_sequence(2, list(range(300, 333)), cache=False)
    before = m.compressed_counters()
    assert before is not None and before["entries"] == 1
    m.reserve_blocks(99, m.num_available_blocks)
    after = m.compressed_counters()
    assert after is not None and after["entries"] == 0 and after["drops"] == 1
    m.check_invariants()


def test_compress_on_evict_refuses_kv_tiers() -> None:
    from engine_adapter.cache.tiers import TierConfig

    with pytest.raises(ValueError, match="tiers"):
        _manager(tiers=TierConfig(host_blocks=8))


def test_off_is_plain_eviction() -> None:
    m = _manager(spec=None)
    _fill(m, 0, list(range(100, 133)))
    _fill(m, 1, list(range(500, 525)))
    assert m.compressed_counters() is None and m.take_compress_moves() == []
    assert m.stats().total_evictions == 3


class CompressMachine(RuleBasedStateMachine):
    """Conversations that grow turn by turn over a small pool with compress-on-evict on."""

    def __init__(self) -> None:
        super().__init__()
        self.m: CacheManager
        self.tokens: dict[int, list[int]] = {}
        self.histories: list[list[int]] = []
        self.next_id = 0
        self.now = 0.0
        self.hits = 0
        self.freed: list[int] = []

    def _clock(self) -> float:
        self.now += 1.0
        return self.now

    @initialize(num_blocks=st.integers(12, 28), ratio=st.sampled_from([0.5, 0.75, 0.9]))
    def setup(self, num_blocks: int, ratio: float) -> None:
        self.m = CacheManager(
            BlockAllocator(num_blocks, BS), compress_on_evict=CompressSpec("knorm", ratio), clock=self._clock
        )
        system = [1] * (2 * BS)
        self.histories = [system + [10 + c] * (3 * BS) for c in range(4)]

    def _running_blocks(self) -> set[int]:
        return {b for s in self.m.sequence_ids() for b in self.m.block_table(s)}

    def _take_moves(self, running: set[int]) -> None:
        """The operation's compressions read only blocks that no sequence running before it
        read (its spare blocks may be handed out at once, to the very allocation that evicted)."""
        for move in self.m.take_compress_moves():
            assert not running & set(move.src), "a running sequence's blocks were compressed"
            assert move.dst == move.src[: len(move.dst)]
            assert move.kept <= len(move.dst) * BS < len(move.src) * BS

    @rule(conv=st.integers(0, 3), extra=st.lists(st.integers(0, 3), max_size=9))
    def turn(self, conv: int, extra: list[int]) -> None:
        prompt = self.histories[conv] + extra + [conv]
        seq = self.next_id
        self.next_id += 1
        before = self._running_blocks()
        try:
            alloc = self.m.allocate(CacheRequest(seq, prompt))
        except (NoEvictableBlocksError, RequestTooLargeError):
            return
        self._take_moves(before)
        assert not before & set(alloc.block_table[alloc.num_cached_blocks :])
        if alloc.num_compressed_tokens:
            self.hits += 1
            assert alloc.num_compressed_blocks * BS < alloc.num_compressed_tokens + BS
        self.tokens[seq] = prompt
        self.histories[conv] = prompt

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 6))
    def decode(self, data: st.DataObject, n: int) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        cache_len = self.m.sequence(seq).num_tokens
        before = self._running_blocks()
        try:
            if self.m.reserve_tokens(seq, cache_len + n) is not None:
                self.tokens[seq] = self.tokens[seq] + [3] * n
        except RequestTooLargeError:
            return
        self._take_moves(before)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), cache=st.booleans())
    def finish(self, data: st.DataObject, cache: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        toks = self.tokens.pop(seq)
        self.m.free_sequence(seq, toks, cache=cache)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        """Token-level eviction of a running sequence (it may be reading a compressed prefix)."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        n = max(1, self.m.sequence(seq).num_tokens // 2)
        before = self._running_blocks() - set(self.m.block_table(seq))  # its own: copied out first
        self.m.compact_sequence(seq, n)
        self._take_moves(before)

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        available = self.m.num_available_blocks - self.m.num_free_blocks
        free = self.m.num_free_blocks
        before = self._running_blocks()
        got = self.m.evict(n)
        self._take_moves(before)
        assert self.m.num_free_blocks == free + got
        assert got >= min(n, available)

    @invariant()
    def accounting_holds(self) -> None:
        if not hasattr(self, "m"):
            return
        self.m.check_invariants()  # capacity, one owner per block, ref counts, entries' sizes
        counters = self.m.compressed_counters()
        assert counters is not None
        squeeze = self.m.compressed
        assert squeeze is not None
        held = sum(len(e.blocks) for e in (*squeeze.entries(), *squeeze.stale()))
        assert counters["blocks"] == held
        # every compressed block is either given back, still held, or dropped with its entry
        assert counters["blocks_compressed"] == counters["blocks_freed"] + held + counters["dropped_blocks"]
        assert counters["hits"] == self.hits

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        for seq, toks in list(self.tokens.items()):
            self.m.free_sequence(seq, toks, cache=False)
        self.m.check_invariants()
        assert self.m.num_available_blocks == self.m.num_blocks


@pytest.mark.slow
def test_compress_state_machine() -> None:
    CompressMachine.TestCase.settings = settings(
        max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    CompressMachine.TestCase().runTest()
