"""A model of the engine's side of the KV tiers for the cache-core tests: slots that hold the key of
the block whose K/V they contain, the moves run in the order given, prefill writing computed
blocks. Whatever the core decides, a request must then read in each cached block exactly the
K/V of its key; that is what `check` verifies (a move run out of order, a slot reused before it
was copied out, or a promotion to the wrong block shows as a wrong key)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.records import Allocation
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.tier_moves import Tier, TierMove

Slot = tuple[Tier, int]


class SlotEngine:
    """The slots' contents, driven through a `CacheManager` as the engine drives it."""

    def __init__(self, manager: CacheManager, fail: Callable[[TierMove], bool] | None = None) -> None:
        self.m = manager
        self.content: dict[Slot, Hashable] = {}
        self.fail = fail or (lambda move: False)
        self.moves_run = 0
        self.moves_failed = 0

    def run_moves(self) -> dict[int, int]:
        """Run the pending moves in order; report the failed ones; recompute what they cost."""
        failed: list[TierMove] = []
        for move in self.m.take_moves():
            src = self.content.get((move.src_tier, move.src))
            assert src == move.key, f"{move} reads {src!r}: the source was overwritten first"
            if self.fail(move):
                self.content[(move.dst_tier, move.dst)] = ("garbage", move.key)
                failed.append(move)
                continue
            self.content[(move.dst_tier, move.dst)] = src
            self.moves_run += 1
        if not failed:
            return {}
        self.moves_failed += len(failed)
        kept = self.m.moves_failed(failed)
        for sid, start in kept.items():  # the engine recomputes from the first lost block
            self.prefill(sid, start)
        return kept

    def prefill(self, sequence_id: int, start: int) -> None:
        """Compute the sequence's full blocks from `start` on into its block table."""
        seq = self.m.sequence(sequence_id)
        for i in range(start, len(seq.keys)):
            self.content[(Tier.DEVICE, seq.block_table[i])] = seq.keys[i]

    def allocate(self, request: CacheRequest) -> Allocation:
        """Admit a request: the moves run before its prefill reads its cached blocks."""
        alloc = self.m.allocate(request)
        kept = self.run_moves()
        cached = kept.get(request.sequence_id, alloc.num_cached_blocks)
        seq = self.m.sequence(request.sequence_id)
        for i in range(cached):
            got = self.content.get((Tier.DEVICE, seq.block_table[i]))
            assert got == seq.keys[i], f"sequence {request.sequence_id} reads {got!r} as block {i}"
        self.prefill(request.sequence_id, cached)
        return alloc

    def free(self, sequence_id: int, token_ids: Sequence[int]) -> None:
        self.m.free_sequence(sequence_id, token_ids)
        self.run_moves()

    def check(self) -> None:
        """Every device block of the tree and every tier slot holds its key's K/V."""
        for block in self.m.radix.blocks():
            got = self.content.get((Tier.DEVICE, block.block_id))
            assert got == block.key, f"device block {block.block_id} holds {got!r}, not {block!r}"
        tiers = self.m.tiers
        if tiers is None:
            return
        for level in tiers.levels:
            for key, entry in level.entries.items():
                got = self.content.get((level.tier, entry.slot))
                assert got == key, f"{entry!r} holds {got!r}"
