"""Compress, don't drop (issue 36, `--compress-on-evict PRESS:RATIO`): cached prefixes the block
policy evicts are compacted in place by a query-agnostic press instead of dropped.

When the policy picks a leaf of the radix tree, the leaf and the run of ancestors that only it
kept alive (unreferenced, unpinned, no other child) form a chain of ``c`` full blocks. The chain
leaves the tree and becomes one `CompressedPrefix`: its tokens still match by their block keys,
but its K/V keep ``kept = max(1, int(c * block_size * (1 - ratio)))`` tokens per layer and KV
head (kvpress's count), packed into the chain's first ``m = ceil(kept / block_size)`` blocks;
the other ``c - m`` go back to the pool at once. A chain too short to give a block back is
dropped as plain eviction would. An entry already compressed is never compressed again: it is
dropped (least recently used first) only when the tree has nothing left to evict, or when the
tree block it hangs under leaves (an orphan, useless past the gap).

The copy is the engine's (torch has one owner): each compression appends a `CompressMove` that
the engine runs before the forward pass of the step that decided it, as it runs tier moves. A
request whose prompt continues its cached tree path with the first keys of an entry (at least
as many as the entry holds blocks) hits it; its cache then holds all of the entry's blocks
read-only, shared with other hits, and the engine masks the kept tokens past the matched keys
(a kept token may come from any block of the chain) and the padding after the kept count. The
sequence is `compressed`: never committed to the prefix cache. An entry that leaves while a
sequence reads it (its anchor left, or the same chain was compressed again) goes stale: out of
the index, its blocks freed when its last reader stops. Called under the cache manager's lock;
imports `block_allocator` and `cached_block` only (docs/architecture.md, "Compress on evict").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cached_block import CachedBlock

__all__ = ["CompressMove", "CompressSpec", "CompressedPrefix", "CompressedPrefixes", "parse_compress_spec"]


@dataclass(frozen=True, slots=True)
class CompressSpec:
    """``PRESS:RATIO``: the token press (a token policy spec, built by the engine) and the
    fraction of a chain's tokens it removes."""

    press: str
    ratio: float

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"compress-on-evict ratio {self.ratio!r} must be in (0, 1)")
        if not self.press:
            raise ValueError("compress-on-evict names no press")

    def kept(self, num_tokens: int) -> int:
        """Tokens kept per layer and KV head of `num_tokens` (kvpress's ``int(L * (1 - r))``)."""
        return max(1, int(num_tokens * (1 - self.ratio)))

    def __str__(self) -> str:
        return f"{self.press}:{self.ratio:g}"


def parse_compress_spec(text: str) -> CompressSpec:
    """``PRESS:RATIO`` (the press may carry its params: ``leverage:seed=1:0.9``).

    Raises:
        ValueError: One line saying what is wrong.
    """
    press, sep, ratio_text = text.strip().rpartition(":")
    if not sep or not press.strip():
        raise ValueError(f"compress-on-evict {text!r} is not PRESS:RATIO (e.g. knorm:0.75)")
    try:
        ratio = float(ratio_text)
    except ValueError:
        raise ValueError(f"compress-on-evict {text!r}: ratio {ratio_text!r} is not a number") from None
    return CompressSpec(press.strip().lower(), ratio)


@dataclass(frozen=True, slots=True)
class CompressMove:
    """Compact the K/V of the chain `src` (full blocks in token order, ``len(src) * block_size``
    tokens from RoPE position `start`) into its first blocks `dst`, keeping `kept` tokens per
    layer and KV head by the press. The blocks of `src` past `dst` are free already and may be
    written by the forward pass that follows: the engine runs the move before it."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    start: int
    kept: int
    key: Hashable  # the chain's first block key: the entry's name


class CompressedPrefix:
    """One compressed chain.

    Attributes:
        keys: The chain's block keys in order (what a prompt must continue with to hit it).
        anchor: The key of the tree block it hangs under (None: it starts at the root).
        blocks: The ``m`` pool blocks holding its kept K/V.
        kept: Tokens kept per layer and KV head (cache indices ``kept..m*block_size-1`` of its
            blocks are padding, masked from attention).
        start: Its first token's position (its depth in the tree times the block size).
        ref_count: Running sequences reading it.
        last_access: When it was compressed or last hit (its drop order).
        hits: Admissions that hit it.
    """

    __slots__ = ("anchor", "blocks", "hits", "kept", "keys", "last_access", "ref_count", "start")

    def __init__(
        self,
        keys: tuple[Hashable, ...],
        anchor: Hashable | None,
        blocks: list[int],
        kept: int,
        start: int,
        now: float,
    ) -> None:
        self.keys = keys
        self.anchor = anchor
        self.blocks = blocks
        self.kept = kept
        self.start = start
        self.ref_count = 0
        self.last_access = now
        self.hits = 0

    @property
    def key(self) -> Hashable:
        """Its name: the first block's key."""
        return self.keys[0]


class CompressedPrefixes:
    """The compressed chains of one cache, their moves and counters.

    Args:
        spec: The press and ratio.
        block_size: Tokens per block.
        pool: The free list the chains' spare blocks go back to.
        clock: Time source (drop order).

    Attributes:
        compressions: Chains compressed.
        blocks_compressed: Blocks those chains held before.
        blocks_freed: Blocks compression gave back.
        drops: Entries dropped (least recently used, or orphaned), with the blocks they held in
            `dropped_blocks`.
        hits: Admissions that hit an entry; `hit_tokens` the original tokens they reused.
    """

    def __init__(
        self, spec: CompressSpec, block_size: int, pool: BlockAllocator, clock: Callable[[], float]
    ) -> None:
        self.spec = spec
        self.block_size = block_size
        self._pool = pool
        self._clock = clock
        self._entries: dict[Hashable, CompressedPrefix] = {}
        self._stale: dict[int, CompressedPrefix] = {}  # id -> dropped while read
        self._under: dict[Hashable | None, set[Hashable]] = {}  # anchor -> entry keys
        self._moves: list[CompressMove] = []
        self.compressions = 0
        self.blocks_compressed = 0
        self.blocks_freed = 0
        self.drops = 0
        self.dropped_blocks = 0
        self.hits = 0
        self.hit_tokens = 0

    @classmethod
    def from_spec(
        cls,
        spec: CompressSpec | str | None,
        block_size: int,
        pool: BlockAllocator,
        clock: Callable[[], float],
    ) -> CompressedPrefixes | None:
        """Compression for `spec` (``PRESS:RATIO`` or parsed), or None when it is None (off)."""
        if spec is None:
            return None
        parsed = parse_compress_spec(spec) if isinstance(spec, str) else spec
        return cls(parsed, block_size, pool, clock)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[CompressedPrefix]:
        """Every entry a prompt can hit (stats, the engine's pruning)."""
        return list(self._entries.values())

    def stale(self) -> list[CompressedPrefix]:
        """Entries dropped while sequences read them: their blocks go when the last stops."""
        return list(self._stale.values())

    @property
    def num_blocks(self) -> int:
        """Pool blocks the entries hold, stale ones included."""
        return sum(len(e.blocks) for e in (*self._entries.values(), *self._stale.values()))

    @property
    def num_reclaimable(self) -> int:
        """Blocks dropping every unreferenced entry would free."""
        return sum(len(e.blocks) for e in self._entries.values() if e.ref_count == 0)

    def blocks_kept(self, num_blocks: int) -> int:
        """Blocks a chain of `num_blocks` keeps once compressed."""
        return -(-self.spec.kept(num_blocks * self.block_size) // self.block_size)

    # ---- compression ---------------------------------------------------------------------------

    def chain_above(self, leaf: CachedBlock) -> list[CachedBlock]:
        """The ancestors that `leaf` alone kept alive, nearest first: each has no reference, no
        pin and no child but the one below (the leaf itself has just left the tree)."""
        chain: list[CachedBlock] = []
        below, block = leaf, leaf.parent
        while block is not None and block.ref_count == 0 and block.pin_count == 0:
            if block.num_children != (0 if below is leaf else 1):
                break
            chain.append(block)
            below, block = block, block.parent
        return chain

    def compress(self, chain: Sequence[CachedBlock]) -> tuple[CompressedPrefix, list[int]]:
        """Turn `chain` (head first, out of the tree already) into an entry; returns it and the
        block ids it gave back to the pool (already freed)."""
        bs = self.block_size
        m = self.blocks_kept(len(chain))
        ids = [b.block_id for b in chain]
        head = chain[0]
        entry = CompressedPrefix(
            tuple(b.key for b in chain),
            None if head.parent is None else head.parent.key,
            ids[:m],
            self.spec.kept(len(chain) * bs),
            head.depth * bs,
            max(b.meta.last_access for b in chain),
        )
        assert entry.key not in self._entries  # the caller ran `drop_named` first
        self._entries[entry.key] = entry
        self._under.setdefault(entry.anchor, set()).add(entry.key)
        self._moves.append(CompressMove(tuple(ids), tuple(ids[:m]), entry.start, entry.kept, entry.key))
        spare = ids[m:]
        self._pool.free(spare)
        self.compressions += 1
        self.blocks_compressed += len(chain)
        self.blocks_freed += len(spare)
        return entry, spare

    def take_moves(self) -> list[CompressMove]:
        """The compactions decided since the last call, in order (the engine runs them)."""
        moves, self._moves = self._moves, []
        return moves

    # ---- hits ------------------------------------------------------------------------------

    def match(self, keys: Sequence[Hashable], start: int) -> tuple[CompressedPrefix, int] | None:
        """The entry that `keys[start:]` continues with and how many of its keys match, or None
        when none does by at least as many keys as it holds blocks (a shorter hit would hold
        more cache slots than it saves)."""
        if start >= len(keys):
            return None
        entry = self._entries.get(keys[start])
        if entry is None:
            return None
        n = 0
        for mine, theirs in zip(entry.keys, keys[start:], strict=False):
            if mine != theirs:
                break
            n += 1
        return (entry, n) if n >= len(entry.blocks) else None

    def lock(self, entry: CompressedPrefix) -> None:
        """A sequence reads `entry`'s blocks until `unlock`."""
        entry.ref_count += 1

    def count_hit(self, entry: CompressedPrefix, num_tokens: int) -> None:
        """A sequence was admitted on `entry`, serving `num_tokens` of its prompt from it."""
        entry.hits += 1
        entry.last_access = self._clock()
        self.hits += 1
        self.hit_tokens += num_tokens

    def unlock(self, entry: CompressedPrefix) -> None:
        """A sequence stopped reading `entry` (a stale entry's blocks go with its last reader)."""
        if entry.ref_count <= 0:
            raise ValueError(f"compressed prefix {entry.key!r} is not locked")
        entry.ref_count -= 1
        if entry.ref_count == 0 and self._stale.pop(id(entry), None) is not None:
            self._free(entry)

    # ---- drops -----------------------------------------------------------------------------

    def drop_under(self, anchor: Hashable) -> list[CompressedPrefix]:
        """Drop the entries hanging under the tree block `anchor`, which is leaving the tree;
        returns those whose blocks were freed (the others are read: stale until they stop)."""
        entries = [self._entries[k] for k in list(self._under.get(anchor, ()))]
        return [e for e in entries if self._drop(e)]

    def drop_named(self, key: Hashable) -> list[CompressedPrefix]:
        """Drop the entry named `key` (its chain was cached again and is being compressed
        again); returns it when its blocks were freed."""
        entry = self._entries.get(key)
        return [entry] if entry is not None and self._drop(entry) else []

    def drop_lru(self, n: int) -> list[CompressedPrefix]:
        """Drop unreferenced entries, least recently used first, until `n` blocks are freed or
        none is left; returns the dropped entries."""
        dropped: list[CompressedPrefix] = []
        freed = 0
        for entry in sorted(self._entries.values(), key=lambda e: e.last_access):
            if freed >= n:
                break
            if entry.ref_count == 0:
                self._drop(entry)
                dropped.append(entry)
                freed += len(entry.blocks)
        return dropped

    def drop_all(self) -> int:
        """Drop every unreferenced entry (a prefix-cache reset); returns blocks freed."""
        return sum(len(e.blocks) for e in self.drop_lru(self.num_blocks))

    def _drop(self, entry: CompressedPrefix) -> bool:
        """Take `entry` out of the index; free its blocks now (True) or, while it is read, when
        its last reader stops (False)."""
        del self._entries[entry.key]
        under = self._under[entry.anchor]
        under.discard(entry.key)
        if not under:
            del self._under[entry.anchor]
        if entry.ref_count:
            self._stale[id(entry)] = entry
            return False
        self._free(entry)
        return True

    def _free(self, entry: CompressedPrefix) -> None:
        self._pool.free(entry.blocks)
        self.drops += 1
        self.dropped_blocks += len(entry.blocks)

    def counters(self) -> dict[str, int]:
        """The counters and the blocks held now (stats, /metrics)."""
        return {
            "entries": len(self._entries),
            "blocks": self.num_blocks,
            "compressions": self.compressions,
            "blocks_compressed": self.blocks_compressed,
            "blocks_freed": self.blocks_freed,
            "drops": self.drops,
            "dropped_blocks": self.dropped_blocks,
            "hits": self.hits,
            "hit_tokens": self.hit_tokens,
        }
