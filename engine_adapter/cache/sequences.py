"""The running sequences: each one's block table, from admission to release.

`RunningSequences` owns the `SequenceState` of every running sequence (its request, its block
table, the cached path it locks, its known block keys) and does what happens to one: admission
(lock and touch the hit, evict the deficit, take fresh blocks), decode growth, caching its full
blocks in the radix index (locked while it runs, unlocked when it stops), release, compaction
(`compaction`), and its picture as a preemption candidate. The blocks' policy records are
derived from its request in `block_meta`. As vLLM v1's `SingleTypeKVCacheManager` keeps
``req_to_blocks`` under the `KVCacheManager`, this sits under the cache manager's front and is
only called under its lock. With KV tiers, admission promotes the host/disk run of the hit
(`promotion`) and newly cached blocks are reported to the tiers (write-through copies them).
Imports `block_allocator`, `block_meta`, `cached_block`, `compaction`, `errors`, `eviction`,
`promotion`, `prompt_keys`, `queue_protection`, `radix_cache`, `records`, `request`, `tiers`
and the policy library's candidate record.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

from engine_adapter.cache import compaction
from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.block_keys import format_block_key
from engine_adapter.cache.block_meta import BlockMetaFields
from engine_adapter.cache.cached_block import CachedBlock
from engine_adapter.cache.compressed import CompressedPrefix, CompressedPrefixes
from engine_adapter.cache.errors import RequestTooLargeError, UnknownSequenceError
from engine_adapter.cache.eviction import EvictionStep
from engine_adapter.cache.promotion import load_below
from engine_adapter.cache.prompt_keys import PromptKeys
from engine_adapter.cache.queue_protection import QueueProtection
from engine_adapter.cache.quotas import SaltQuotas
from engine_adapter.cache.radix_cache import RadixCache
from engine_adapter.cache.receipts import RequestReceipts
from engine_adapter.cache.records import SequenceState
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.retention import Retention
from engine_adapter.cache.tier_level import TierEntry
from engine_adapter.cache.tiers import TierStore
from sage_eviction import EvictionCandidate

__all__ = ["RunningSequences"]


class RunningSequences:
    """The running sequences by id, in admission order, and their block operations.

    Args:
        pool: The free list fresh blocks come from.
        radix: The radix index their full blocks are cached in.
        keys: How their tokens name blocks.
        eviction: Evicts what an allocation lacks (and computes the deficit).
        protection: Waiting requests' protections (an admitted request's ends).
        clock: Time source.
        tiers: The host/disk tiers, or None.
        compressed: Compress-on-evict's prefixes, or None.
        retention: The prompt-cache lifetimes and write limits (`retention`), or None (none).
        quotas: The per-salt quotas (`quotas`): what a salt may cache and promote, or None.
    """

    def __init__(
        self,
        pool: BlockAllocator,
        radix: RadixCache,
        keys: PromptKeys,
        eviction: EvictionStep,
        protection: QueueProtection,
        clock: Callable[[], float],
        tiers: TierStore | None = None,
        compressed: CompressedPrefixes | None = None,
        retention: Retention | None = None,
        quotas: SaltQuotas | None = None,
    ) -> None:
        self._quotas = quotas
        self._compressed = compressed
        self._retention = retention
        self._pool = pool
        self._tiers = tiers
        self._radix = radix
        self._keys = keys
        self._eviction = eviction
        self._protection = protection
        self._clock = clock
        self._states: dict[int, SequenceState] = {}
        self.receipts: RequestReceipts | None = None  # told writes, grants, blocks not written

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, sequence_id: object) -> bool:
        return sequence_id in self._states

    def get(self, sequence_id: int) -> SequenceState:
        """The state of a running sequence.

        Raises:
            UnknownSequenceError: Not running.
        """
        seq = self._states.get(sequence_id)
        if seq is None:
            raise UnknownSequenceError(f"no running sequence {sequence_id}")
        return seq

    def ids(self) -> list[int]:
        """Running sequence ids, in admission order."""
        return list(self._states)

    def states(self) -> Iterable[SequenceState]:
        """The running sequences' states, in admission order (a live view)."""
        return self._states.values()

    # ---- admission and growth ---------------------------------------------------------------

    def admit(
        self,
        request: CacheRequest,
        path: list[CachedBlock],
        keys: list[Hashable],
        salt: str | None,
        n_tokens: int,
        n_blocks: int,
        below: Sequence[TierEntry] = (),
        hit: tuple[CompressedPrefix, int] | None = None,
    ) -> tuple[SequenceState, int]:
        """Run `request` on the cached `path` it hits plus fresh blocks for the rest of its
        `n_blocks`, evicting exactly the deficit; its queue protection ends. The tier entries
        `below` that continue the hit are promoted into the first fresh blocks and join `path`.
        A compressed prefix continuing `path` by `hit`'s count of keys is locked and read after
        it: the sequence is `compressed`, its cache holds fewer tokens than it stands for.

        Returns:
            Its state and the blocks evicted for it.

        Raises:
            NoEvictableBlocksError: Not enough free or reclaimable blocks; nothing changed.
        """
        sequence_id = request.sequence_id
        entry, n_hit = hit if hit is not None else (None, 0)
        n_new = n_blocks - len(path) - n_hit
        deficit = self._deficit(sequence_id, path, n_new, hit)
        self._protection.release(sequence_id)  # it leaves the queue; its protected head is in `path`
        now = self._clock()
        # how long the prefix this request extends had been idle: a feature of its new blocks
        last = below[-1].meta if below else path[-1].meta if path else None
        prefix_idle = max(now - last.last_access, 0.0) if last is not None else None
        if below:
            assert self._tiers is not None  # only a tiered cache finds entries below
            self._tiers.hold(below)  # the eviction below must not move what is being loaded
        self._radix.lock(path)
        self._radix.touch(path, now)
        evicted = 0
        if below:  # loaded back one block at a time (`promotion.load_below`), then the rest
            assert self._tiers is not None
            pool, radix = self._pool, self._radix
            evicted = load_below(
                radix, self._tiers, pool, self._eviction, path, below, sequence_id, now, "lookup"
            )
            n_new -= len(below)
            deficit = max(n_new - pool.num_free, 0)
        if deficit > 0:
            evicted += self._eviction.evict(deficit, "alloc", pending=n_new)
        held = [] if entry is None else entry.blocks  # a compressed hit's cache is shorter
        seq = SequenceState(
            request=request, block_table=[b.block_id for b in path] + held + self._pool.allocate(n_new),
            cached_path=path, keys=keys, salt=salt, num_prompt_tokens=n_tokens,
            num_tokens=n_tokens - (n_hit - len(held)) * self._keys.block_size, num_prompt_blocks=n_blocks,
            prefix_idle=prefix_idle, created_at=now, last_access=now,
            compressed=entry is not None, compressed_prefix=entry,
        )  # fmt: skip
        self._states[sequence_id] = seq
        self._admitted(seq, n_hit, now)
        return seq, evicted

    def _admitted(self, seq: SequenceState, n_hit: int, now: float) -> None:
        """Its prompt-cache contract at admission: how far it may write at finish (explicit
        writes; generated tokens not cached), where its receipt starts counting writes, and the
        retention of the path it hit (a hit refreshes it)."""
        request, retention = seq.request, self._retention
        receipt, contract = request.receipt, request.contract
        bs = self._keys.block_size
        prompt = seq.num_prompt_tokens if receipt is None else receipt.prompt_tokens
        if contract is not None and contract.write_tokens is not None:
            seq.write_limit = min(contract.write_tokens, prompt) // bs
        elif retention is not None and not retention.config.cache_generated:
            seq.write_limit = prompt // bs
        if receipt is not None and receipt.counted_upto < 0:
            receipt.counted_upto = len(seq.cached_path) + n_hit  # what it read is not a write
        if self._quotas:
            self._quotas.seen(seq.salt, seq.cached_path)  # its hit and promotions: its salt's
        ttl = None if retention is None else retention.ttl_for(contract)
        if ttl is not None:
            seq.retain_until = now + ttl  # one time for all its blocks: parents outlive children
            short = None if contract is None else contract.short_ttl
            if short is not None:  # but a shorter one past a point (never longer than the first)
                seq.short_from, seq.short_until = short[0] // bs, now + min(short[1], ttl)
            if receipt is not None and receipt.retention_ttl_s is None:
                receipt.retention_ttl_s = ttl
                if self.receipts is not None:
                    self.receipts.retention(request, granted=True)
            self._retain(seq, seq.cached_path)

    def _retain(self, seq: SequenceState, blocks: Sequence[CachedBlock]) -> None:
        """Retain `blocks` (its hit, or blocks it newly cached) until its expiry."""
        assert self._retention is not None and seq.retain_until is not None  # checked by callers
        receipt = seq.request.receipt
        owner = None if self.receipts is None else self.receipts.owner(seq.request)
        runs = [(blocks, seq.retain_until)]
        if seq.short_from is not None and seq.short_until is not None:  # root first: split by depth
            cut = next((i for i, b in enumerate(blocks) if b.depth >= seq.short_from), len(blocks))
            runs = [(blocks[:cut], seq.retain_until), (blocks[cut:], seq.short_until)]
        granted = all([self._retention.grant(run, until, owner) for run, until in runs if run])
        if not granted and receipt is not None:
            if receipt.retention_ttl_s and self.receipts is not None:
                self.receipts.retention(seq.request, granted=False)  # once per request
            receipt.retention_ttl_s = 0.0  # refused in part: the usage says so

    def _wrote(self, seq: SequenceState, start: int, blocks: Sequence[CachedBlock]) -> None:
        """`blocks`, newly cached by `seq` from position `start` on: counted on its receipt
        (prompt positions not counted before) and retained when it asked for a lifetime."""
        receipt = seq.request.receipt
        if receipt is not None:
            lo = max(start, receipt.counted_upto)
            bs = self._keys.block_size
            hi = min(start + len(blocks), receipt.prompt_tokens // bs)
            if hi > lo:
                receipt.written_tokens += (hi - lo) * bs
                if seq.short_from is not None:
                    receipt.written_short_tokens += max(hi - max(lo, seq.short_from), 0) * bs
                receipt.counted_upto = hi
                if self.receipts is not None:
                    self.receipts.wrote(seq.request, (hi - lo) * bs)
        if seq.retain_until is not None and blocks:
            self._retain(seq, blocks)

    def _deficit(
        self, sequence_id: int, path: list[CachedBlock], n_new: int, hit: tuple[CompressedPrefix, int] | None
    ) -> int:
        """`EvictionStep.deficit`, with the compressed prefix a request hits locked first (so
        that its own blocks are not counted as reclaimable for it) and its hit counted;
        unlocked again on failure."""
        if hit is None:
            return self._eviction.deficit(sequence_id, path, n_new)
        assert self._compressed is not None  # only a compressing cache finds entries
        entry, n_hit = hit
        self._compressed.lock(entry)
        try:
            deficit = self._eviction.deficit(sequence_id, path, n_new)
        except BaseException:
            self._compressed.unlock(entry)
            raise
        self._compressed.count_hit(entry, n_hit * self._keys.block_size)
        return deficit

    def extend(self, sequence_id: int, num_blocks: int) -> list[int] | None:
        """Append `num_blocks` fresh blocks to a running sequence, evicting if short; None when
        even eviction cannot free enough (nothing changed).

        Raises:
            UnknownSequenceError: Not running.
            RequestTooLargeError: The sequence would outgrow the whole pool.
        """
        seq = self.get(sequence_id)
        if num_blocks <= 0:
            if num_blocks < 0:
                raise ValueError(f"cannot extend by num_blocks={num_blocks}")
            return []
        pool_blocks = self._pool.num_blocks
        if len(seq.block_table) + num_blocks > pool_blocks:
            raise RequestTooLargeError(
                f"sequence {sequence_id} would need {len(seq.block_table) + num_blocks} blocks "
                f"but the pool has {pool_blocks}"
            )
        deficit = self._eviction.room_for((), num_blocks)
        if deficit is None:
            return None
        if deficit > 0:
            self._eviction.evict(deficit, "alloc", pending=num_blocks)
        new_ids = self._pool.allocate(num_blocks)
        seq.block_table.extend(new_ids)
        return new_ids

    def reserve_tokens(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Make the sequence's blocks cover `num_tokens` tokens in all (`extend` as needed)."""
        seq = self.get(sequence_id)
        needed = -(-num_tokens // self._keys.block_size) - len(seq.block_table)
        new_ids = self.extend(sequence_id, needed) if needed > 0 else []
        if new_ids is not None and num_tokens > seq.num_tokens:
            seq.num_tokens = num_tokens
        return new_ids

    def reserve_many(self, wants: Sequence[tuple[int, int]]) -> int:
        """`reserve_tokens` of each (sequence id, tokens) in order, stopping at the first that
        gets None (nothing changed for it or after it); returns how many got their blocks."""
        reserve = self.reserve_tokens
        for done, (sequence_id, num_tokens) in enumerate(wants):
            if reserve(sequence_id, num_tokens) is None:
                return done
        return len(wants)

    def touch(self, sequence_id: int) -> None:
        """Record that a running sequence made progress (for preemption order)."""
        seq = self.get(sequence_id)
        seq.last_access = self._clock()
        seq.access_count += 1
        self._radix.policy.update_access(sequence_id)

    # ---- caching and release ----------------------------------------------------------------

    def _meta_fields(self, seq: SequenceState) -> BlockMetaFields:
        """What the policy records of the blocks `seq` caches now are made of (`.meta(i)`)."""
        now = self._clock()
        return BlockMetaFields(
            self._keys.block_size, seq.request, now, seq.num_tokens, seq.num_prompt_blocks, seq.prefix_idle
        )

    def commit(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_computed_tokens: int | None,
    ) -> int:
        """Cache a running sequence's newly full blocks, locked by it; returns blocks newly cached."""
        seq = self.get(sequence_id)
        keys = self._keys.computed(seq, token_ids, block_keys, num_computed_tokens)
        if seq.write_limit is not None:
            keys = keys[: seq.write_limit]  # freed at its finish, so not shared meanwhile
        keys = self._within_quota(seq, keys)
        fields = self._meta_fields(seq)
        added = self._radix.commit(seq.cached_path, keys, seq.block_table, sequence_id, fields)
        if added and self._quotas:
            self._quotas.seen(seq.salt, seq.cached_path[-added:])
        if added and self._tiers is not None:
            self._tiers.cached_on_device(seq.cached_path[-added:])
        if added:
            self._announce(keys, len(seq.cached_path) - added, added, token_ids)
            self._wrote(seq, len(seq.cached_path) - added, seq.cached_path[-added:])
        return added

    def release(
        self,
        sequence_id: int,
        token_ids: Sequence[int] | None,
        block_keys: Sequence[Hashable] | None,
        num_computed_tokens: int | None,
        cache: bool,
        finish: bool = True,
    ) -> int:
        """Stop a sequence: cache its full computed blocks (unless not `cache`; at its `finish`,
        none past its write limit), free the rest; returns blocks newly cached."""
        seq = self.get(sequence_id)
        keys = self._keys.computed(seq, token_ids, block_keys, num_computed_tokens) if cache else []
        if finish and seq.write_limit is not None:
            if self.receipts is not None and len(keys) > seq.write_limit:
                self._not_written(seq, keys)
            keys = keys[: seq.write_limit]  # a preempted one keeps all: its re-prefill hits them
        keys = self._within_quota(seq, keys)
        fields = self._meta_fields(seq)
        radix = self._radix
        announce = self._eviction.events is not None and self._eviction.events.record_stores
        quota = self._quotas is not None and self._quotas.tracks(seq.salt)
        track = seq.request.receipt is not None or seq.retain_until is not None or quota
        fresh_keys = (
            [k for k in keys[len(seq.cached_path) :] if k not in radix]
            if self._tiers or announce or track
            else []
        )
        # release caches one contiguous run: after the first new block nothing below it is cached
        first_new = keys.index(fresh_keys[0], len(seq.cached_path)) if fresh_keys else 0
        table = seq.block_table
        if seq.compressed_prefix is not None:  # its blocks stay the entry's
            assert self._compressed is not None
            self._compressed.unlock(seq.compressed_prefix)
            table = table[: len(seq.cached_path)] + seq.private_blocks
        added, to_free = radix.release(seq.cached_path, keys, table, sequence_id, fields)
        new_blocks = [b for k in fresh_keys if (b := radix.get(k)) is not None] if added else []
        if added and self._tiers is not None:
            self._tiers.cached_on_device(new_blocks)
        if added and track:
            self._wrote(seq, first_new, new_blocks)
        if added and quota:
            assert self._quotas is not None
            self._quotas.seen(seq.salt, new_blocks)
        if added and announce:
            self._announce(keys, first_new, added, token_ids)
        del self._states[sequence_id]
        if to_free:
            self._pool.free(to_free)
        return added

    def _within_quota(self, seq: SequenceState, keys: list[Hashable]) -> list[Hashable]:
        """`keys` cut to what `seq`'s salt may newly cache under its device quota (`quotas`:
        its own blocks are evicted first to make room); the rest stays private, freed at finish."""
        quotas = self._quotas
        if not quotas or not quotas.tracks(seq.salt):
            return keys
        radix, start = self._radix, len(seq.cached_path)
        wanted = sum(1 for k in keys[start:] if k not in radix)
        allowed = quotas.room(seq.salt, wanted)
        # its own evictions may have made a cached key beyond its path new again: look afresh
        fresh = [i for i in range(start, len(keys)) if keys[i] not in radix]
        if len(fresh) <= allowed:
            return keys
        quotas.refused(seq.salt, len(fresh) - allowed)
        return keys[: fresh[allowed]]

    def cut_promotions(self, salt: str | None, below: list[TierEntry]) -> list[TierEntry]:
        """The tier entries a lookup of `salt` found below its device hit, cut to the room its
        device quota leaves (a promotion never evicts for a quota: the rest is recomputed)."""
        quotas = self._quotas
        if not below or not quotas or not quotas.tracks(salt):
            return below
        allowed = quotas.room(salt, len(below), evict=False)
        if allowed < len(below):
            quotas.refused(salt, len(below) - allowed, promotion=True)
        return below[:allowed]

    def _not_written(self, seq: SequenceState, keys: Sequence[Hashable]) -> None:
        """Tell the receipts the blocks `seq` frees at its finish past its write limit."""
        assert self.receipts is not None and seq.write_limit is not None  # checked by the caller
        receipt = seq.request.receipt
        prompt = seq.num_prompt_tokens if receipt is None else receipt.prompt_tokens
        self.receipts.not_written(keys[seq.write_limit :], seq.write_limit, prompt // self._keys.block_size)

    def _announce(
        self, keys: Sequence[Hashable], start: int, count: int, token_ids: Sequence[int] | None
    ) -> None:
        """A ``store`` event for blocks ``keys[start:start + count]``, newly cached (only while
        the event log records stores: a KV events publisher listens)."""
        events = self._eviction.events
        if events is None or not events.record_stores:
            return
        size = self._keys.block_size
        tokens = [] if token_ids is None else list(token_ids[start * size : (start + count) * size])
        events.store(
            blocks=[format_block_key(k) for k in keys[start : start + count]],
            parent=format_block_key(keys[start - 1]) if start > 0 else None,
            tokens=tokens,
            block_size=size,
            ts=self._clock(),
        )

    # ---- compaction (token-level eviction) ---------------------------------------------------

    def compaction_gain(self, sequence_id: int, num_tokens: int) -> int:
        """Blocks compacting the sequence to `num_tokens` would give back (`compaction`)."""
        return compaction.compaction_gain(self.get(sequence_id), num_tokens, self._keys.block_size)

    def compact(self, sequence_id: int, num_tokens: int) -> list[int] | None:
        """Give the sequence a fresh table for `num_tokens` (`compaction.compact`); None when
        even eviction cannot give the blocks (nothing changed)."""
        seq = self.get(sequence_id)
        entry = seq.compressed_prefix  # the copy has read its blocks; they stay the entry's
        table = compaction.compact(
            seq,
            num_tokens,
            block_size=self._keys.block_size,
            pool=self._pool,
            radix=self._radix,
            eviction=self._eviction,
        )
        if table is not None and entry is not None:
            assert self._compressed is not None
            self._compressed.unlock(entry)
        return table

    # ---- preemption -------------------------------------------------------------------------

    def candidates(self, exclude: Iterable[int]) -> list[EvictionCandidate]:
        """The running sequences not in `exclude` as the spec's `EvictionCandidate`s."""
        skip = set(exclude)
        return [
            EvictionCandidate(
                sequence_id=sequence_id,
                block_ids=list(s.block_table),
                last_access_time=s.last_access,
                access_count=s.access_count,
                priority=s.request.priority,
                is_pinned=s.request.non_preemptible,
                estimated_lifetime=s.request.estimated_lifetime,
                sequence_length=s.num_tokens,
                max_length=s.request.max_tokens,
            )
            for sequence_id, s in self._states.items()
            if sequence_id not in skip
        ]
