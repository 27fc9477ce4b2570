"""Token-level eviction inside the scheduler's step (spec 002; docs/architecture.md, "Engine").

`SequenceCompressor` is the scheduler's side of `engine_adapter.token_eviction`: which policy
compresses a sequence (its request's ``kv_compression``, else the engine's), a running sequence
as a `SequenceKV` whose compaction takes its new block table from the cache manager, and the
three moments the scheduler compresses:

- `after_step`: a prompt that asked for ``kv_compression`` is compressed once, right after its
  prefill; then memory pressure compresses the longest decoding sequences
  (`TokenCacheManager.maybe_evict`, the spec's call after each generation step);
- `relieve`: the pool cannot give a decode slot, so one decoding sequence is compressed before
  any is preempted;
- `shrink`: a sequence outgrew the whole pool and compresses itself, or ends with the error.

With `--compress-on-evict`, it also runs the cache core's compress moves before each forward
(`run_prefix_moves`) and sets up a sequence admitted on a compressed prefix (`adopt_hit`;
`prefix_compression`).

A compressed sequence's cache holds fewer tokens than it has (`Sequence.evicted_tokens` fewer):
its new tokens sit at cache index ``num_computed - evicted_tokens`` with RoPE position
``num_computed``. Without a `TokenCacheManager` (and with no request asking) nothing here runs.

Imports: the cache manager, the pool, token-level eviction and the scheduler's records.
"""

from __future__ import annotations

import time
from collections.abc import Set

import structlog

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.records import Allocation
from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.layers import RotaryEmbedding
from engine_adapter.serving.prefix_compression import PrefixCompressor
from engine_adapter.serving.sequence import Sequence, SequenceStatus
from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy, kept_for_ratio
from engine_adapter.token_eviction.pressure import TokenCacheManager
from engine_adapter.token_eviction.registry import token_policy_from_spec
from engine_adapter.token_eviction.sequence_kv import CompactionRefused, SequenceKV

__all__ = ["SequenceCompressor"]

log = structlog.get_logger("sage.scheduler")


def _adopt(seq: Sequence, kv: SequenceKV) -> None:
    """`seq` takes what a compaction of its `SequenceKV` left: blocks, offset, padding mask."""
    seq.block_table, seq.evicted_tokens, seq.key_mask = kv.block_table, kv.position_offset, kv.key_mask


class SequenceCompressor:
    """Compresses running sequences' K/V in the pool for the scheduler.

    Args:
        cache: The cache manager (compaction takes the new blocks from it).
        pool: The paged KV pool the sequences' K/V live in.
        manager: Token-level eviction (its policy, memory monitor and totals); None: only a
            request's ``kv_compression`` can compress, and only after prefill.
        rotary: The decoder's rotary embedding (compress-on-evict's presses that undo RoPE).
    """

    def __init__(
        self,
        cache: CacheManager,
        pool: PagedKVPool,
        manager: TokenCacheManager | None,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        squeeze = cache.compressed
        self.prefix = None if squeeze is None else PrefixCompressor(pool, squeeze.spec, rotary)
        self.cache = cache
        self.pool = pool
        self.manager = manager
        self.cache_s = 0.0  # time in the cache manager and the policy during the current step
        self._named_policies: dict[str, TokenEvictionPolicy] = {}

    @property
    def enabled(self) -> bool:
        """Whether memory pressure may compress sequences (the engine has a manager)."""
        return self.manager is not None

    # ---- which policy ------------------------------------------------------------------------

    def _named_policy(self, name: str) -> TokenEvictionPolicy:
        policy = self._named_policies.get(name)
        if policy is None:
            window = self.manager.window if self.manager is not None else 1024
            policy = self._named_policies[name] = token_policy_from_spec(name, window=window)
        return policy

    def policy_for(self, seq: Sequence) -> TokenEvictionPolicy | None:
        """The policy that compresses `seq`: its request's, else the engine's (None: never)."""
        if seq.kv_compression is not None:
            return self._named_policy(seq.kv_compression.policy)
        manager = self.manager
        if manager is None or manager.policy.name() == "none":
            return None
        return manager.policy

    def observer_for(self, seq: Sequence) -> AttentionObserver | None:
        """What `seq`'s attention must expose to its policy while it runs (None: no policy)."""
        policy = self.policy_for(seq)
        return policy.make_observer() if policy is not None else None

    # ---- compress on evict --------------------------------------------------------------------

    def run_prefix_moves(self) -> None:
        """Compact the cached chains the cache core compressed since the last call (before the
        forward that may write their freed blocks)."""
        squeeze = self.cache.compressed
        if self.prefix is not None and squeeze is not None:
            t = time.perf_counter()
            moves = self.cache.take_compress_moves()
            if moves:
                self.prefix.run(moves)
                self.prefix.prune({e.key for e in (*squeeze.entries(), *squeeze.stale())})
            self.cache_s += time.perf_counter() - t

    def adopt_hit(self, seq: Sequence, alloc: Allocation) -> None:
        """`seq` was admitted on a compressed prefix: its cache holds that many fewer tokens than
        it stands for (RoPE continues the original count), and the prefix's padding is masked."""
        if not alloc.num_compressed_tokens or self.prefix is None:
            return
        if seq.cached_tokens is None:  # its first admission: its usage says so
            seq.compressed_cached_tokens = min(alloc.num_compressed_tokens, len(seq.prompt_ids))
        self.run_prefix_moves()  # the prefix may have been compressed by this very admission
        seq.evicted_tokens = alloc.num_compressed_tokens - alloc.num_compressed_blocks * self.pool.block_size
        mask = self.prefix.hit_mask(alloc, self.pool.num_layers, self.pool.num_kv_heads)
        seq.key_mask = mask.to(self.pool.device)

    # ---- a sequence's state ------------------------------------------------------------------

    def reset(self, seq: Sequence) -> None:
        """`seq` was preempted: its recompute starts uncompressed."""
        seq.evicted_tokens = 0
        seq.key_mask = None
        seq.observer = None
        seq.prompt_compressed = False
        self.forget(seq.seq_id)

    def forget(self, seq_id: int) -> None:
        """The sequence left the pool: drop what the manager remembers of it."""
        if self.manager is not None:
            self.manager.forget(seq_id)

    def _sequence_kv(self, seq: Sequence, *, for_room: bool = True) -> SequenceKV:
        """`seq` as a `SequenceKV` whose compaction takes its new table from the cache manager;
        `for_room`: refuse a compaction that would not give blocks back (shared prefixes)."""

        def reallocate(n: int) -> list[int]:
            if for_room and self.cache.compaction_gain(seq.seq_id, n) <= 0:
                raise CompactionRefused(f"compacting sequence {seq.seq_id} would free no block")
            table = self.cache.compact_sequence(seq.seq_id, n)
            if table is None:
                raise CompactionRefused(f"no blocks to compact sequence {seq.seq_id} into")
            # the copy writes `table` now, outside the forward: a chain compressed to make room
            # (its spare blocks may be in `table`) is compacted first
            self.run_prefix_moves()
            return table

        return SequenceKV(
            self.pool,
            seq.block_table,
            seq.cache_len,
            position_offset=seq.evicted_tokens,
            observer=seq.observer,
            reallocate=reallocate,
            key_mask=seq.key_mask,
        )

    def _manager(self) -> TokenCacheManager:
        if self.manager is None:  # a request's kv_compression on an engine without one
            raise RuntimeError("token-level eviction needs Scheduler.token_eviction")
        return self.manager

    # ---- when the scheduler compresses -------------------------------------------------------

    def _decoding(self, running: list[Sequence], exclude: Set[int]) -> list[tuple[Sequence, SequenceKV]]:
        """Running sequences past their prompt, not in `exclude`, that a policy may compress."""
        return [
            (seq, self._sequence_kv(seq))
            for seq in running
            if seq.status is SequenceStatus.RUNNING
            and seq.seq_id not in exclude
            and seq.num_computed >= len(seq.prompt_ids)
            and self.policy_for(seq) is not None
        ]

    def _pressure(self, candidates: list[tuple[Sequence, SequenceKV]], *, force: bool) -> bool:
        if not candidates:
            return False
        by_id = {seq.seq_id: seq for seq, _kv in candidates}
        t = time.perf_counter()
        try:
            result = self._manager().maybe_evict(
                [(seq.seq_id, kv) for seq, kv in candidates],
                lambda sid: self.policy_for(by_id[sid]),
                reason="preempt" if force else "pressure",
                force=force,
            )
        finally:
            for seq, kv in candidates:
                _adopt(seq, kv)
            self.cache_s += time.perf_counter() - t
        return result.evicted

    def shrink(self, seq: Sequence) -> bool:
        """`seq` outgrew the whole pool (only a token policy lets a sequence grow past it):
        compress it; whether that freed anything."""
        if self.manager is None:
            return False
        return self._pressure([(seq, self._sequence_kv(seq))] if self.policy_for(seq) else [], force=True)

    def relieve(self, running: list[Sequence], exclude: Set[int]) -> bool:
        """The pool is short: compress one decoding sequence of `running` not in `exclude`, the
        longest that frees blocks; whether one was compressed."""
        if self.manager is None:
            return False
        return self._pressure(self._decoding(running, exclude), force=True)

    def after_step(self, running: list[Sequence]) -> None:
        """Prompts that asked for ``kv_compression`` and just finished prefill are compressed;
        then memory pressure compresses the longest decoding sequences (the spec's
        ``maybe_evict`` after each generation step)."""
        for seq in running:
            request = seq.kv_compression
            if request is None or seq.prompt_compressed or seq.num_computed < len(seq.prompt_ids):
                continue
            seq.prompt_compressed = True
            if request.ratio <= 0:
                continue
            kv = self._sequence_kv(seq, for_room=False)
            t = time.perf_counter()
            try:
                self._manager().compress(
                    seq.seq_id,
                    kv,
                    kept_for_ratio(kv.length, request.ratio),
                    policy=self._named_policy(request.policy),
                    reason="prefill",
                    ratio=request.ratio,
                )
            except CompactionRefused as exc:
                log.warning("kv_compression skipped", request_id=seq.request_id, reason=str(exc))
            _adopt(seq, kv)
            self.cache_s += time.perf_counter() - t
        if self.manager is not None:
            self._pressure(self._decoding(running, set()), force=False)
