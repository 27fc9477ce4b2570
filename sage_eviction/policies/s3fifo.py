"""S3-FIFO: a small FIFO that filters one-hit wonders, a main FIFO with reinsertion, a ghost FIFO.

Source: Yang, Zhang, Qiu, Yue and Vinayak, "FIFO queues are all you need for cache eviction",
SOSP 2023. The details follow libCacheSim's `S3FIFO.c` (the authors' simulator), with its
defaults, so that the flat driver reproduces its misses exactly.

- Sizes: the small queue S holds `int(capacity * small_ratio)` blocks (at least 1), the main
  queue M the rest; the ghost queue G remembers `int(capacity * ghost_ratio)` evicted keys.
- Insert: a key found in G (a ghost hit) goes to the head of M; any other key to the head of S,
  except that before the first eviction ever, once S is full, new keys go to M.
- Hit: the entry's frequency grows by one, capped at 3; nothing moves.
- Evict: from M when M holds more than its share or S has nothing evictable, else from S.
  Evicting from S takes S's tail: an entry with frequency >= `move_threshold` moves to the head
  of M with frequency 0 and the next tail is tried; otherwise it is evicted and its key enters
  G (G drops its oldest key when full). Evicting from M takes M's tail: an entry with
  frequency f >= 1 is reinserted at the head with f - 1 (a 2-bit clock); one with 0 is evicted.
  When S empties without a victim (everything moved), M is evicted from.
- `prepare_insert(key)`: optional. Called by a cache before the evictions that make room for a
  missed key, it takes the key out of G first, as libCacheSim does on the lookup, so that the
  ghost insertions of those evictions cannot push it out. The flat driver calls it.

Entries that are not evictable are unlinked from their queue but still count in its size and
keep their frequency (hits on them count); when one becomes evictable again it is linked at
the head of its queue. A queue with no evictable entry is passed over.

Difference from libCacheSim: it refuses to admit an object as large as the small queue, so with
unit-size blocks and a small queue of 0 or 1 block (capacity < 2 / small_ratio) it caches
nothing; here every block is admitted, so results agree for capacity >= 2 / small_ratio.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from itertools import compress, repeat
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import DuplicateKeyError
from sage_eviction.preemption import S3FIFO_MAX_FREQ as _MAX_FREQ  # shared with its preemption order
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["S3FIFOPolicy"]

_NO_KEY: Any = object()
_SMALL = 0
_MAIN = 1


class S3FIFOPolicy(EvictionPolicy):
    """S3-FIFO over blocks.

    Args:
        capacity: Cache size in blocks (required): it sizes the three queues.
        small_ratio: Fraction of the capacity for the small queue (0 < r < 1).
        ghost_ratio: Ghost queue length as a fraction of the capacity (>= 0; 0 disables it).
        move_threshold: Hits an entry of the small queue needs to move to the main queue.
    """

    name = "s3fifo"
    strategy = EvictionStrategy.S3FIFO
    paper = "Yang et al., FIFO queues are all you need for cache eviction, SOSP 2023"
    order_preserving = True
    needs_capacity = True

    def __init__(
        self,
        capacity: int | None = None,
        small_ratio: float = 0.1,
        ghost_ratio: float = 0.9,
        move_threshold: int = 2,
    ) -> None:
        super().__init__(capacity)
        if capacity is None:
            raise ValueError("s3fifo needs capacity")
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"small_ratio={small_ratio} must be in (0, 1)")
        if ghost_ratio < 0.0:
            raise ValueError(f"ghost_ratio={ghost_ratio} must be >= 0")
        if move_threshold < 1:
            raise ValueError(f"move_threshold={move_threshold} must be >= 1")
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.move_threshold = move_threshold
        self._small_size = max(1, int(capacity * small_ratio))
        self._main_size = capacity - self._small_size
        self._ghost_size = int(capacity * ghost_ratio)
        # Evictable entries per queue, tail (oldest) first; the head is the end.
        self._small: OrderedDict[Hashable, None] = OrderedDict()
        self._main: OrderedDict[Hashable, None] = OrderedDict()
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._queue_of: dict[Hashable, int] = {}  # resident key -> _SMALL or _MAIN
        self._freq: dict[Hashable, int] = {}
        self._n_small = 0  # pinned included
        self._n_main = 0
        self._has_evicted = False
        self._pending_key: Any = _NO_KEY
        self._pending_ghost = False

    # ---- introspection -----------------------------------------------------------------------

    def queue_of(self, key: Hashable) -> str | None:
        """Which queue holds `key`: "small", "main", "ghost", or None when none does."""
        where = self._queue_of.get(key)
        if where is not None:
            return "small" if where == _SMALL else "main"
        return "ghost" if key in self._ghost else None

    def queue_sizes(self) -> tuple[int, int, int]:
        """(|S|, |M|, |G|); S and M count pinned entries too."""
        return self._n_small, self._n_main, len(self._ghost)

    def frequency(self, key: Hashable) -> int:
        """The 0..3 frequency of a held key."""
        return self._freq[key]

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(small=self._n_small, main=self._n_main, ghost=len(self._ghost))
        return out

    explains_by = "its queue (small, then main) and frequency: the tail leaves unless hit enough"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        return {
            "queue": self.queue_of(key),
            "frequency": self._freq[key],
            "move_threshold": self.move_threshold,
            "small": self._n_small,
            "small_size": self._small_size,
            "main": self._n_main,
            "ghost": len(self._ghost),
        }

    # ---- hooks -------------------------------------------------------------------------------

    def prepare_insert(self, key: Hashable) -> None:
        """A miss on `key` will be inserted after the evictions that make room for it.

        Optional: takes the key out of the ghost queue now, so that those evictions cannot
        push it out; `insert(key)` then puts it in the main queue.

        Raises:
            DuplicateKeyError: The key is already held.
        """
        if key in self._queue_of:
            raise DuplicateKeyError(f"{self.name}: prepare_insert of key {key!r}, which is held")
        self._pending_key = key
        self._pending_ghost = self._ghost.pop(key, _NO_KEY) is not _NO_KEY

    def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        pending = self._pending_key
        if pending is not _NO_KEY:
            self._pending_key = _NO_KEY
        if pending is not _NO_KEY and pending == key:
            to_main = self._pending_ghost
        else:
            to_main = self._ghost.pop(key, _NO_KEY) is not _NO_KEY
        if not to_main and not self._has_evicted and self._n_small >= self._small_size:
            to_main = True  # warm-up: S is full but the cache is not
        self._freq[key] = 0
        if to_main:
            self._queue_of[key] = _MAIN
            self._n_main += 1
            if evictable:
                self._main[key] = None
        else:
            self._queue_of[key] = _SMALL
            self._n_small += 1
            if evictable:
                self._small[key] = None

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        # Into an empty S3-FIFO that never evicted, with an empty ghost queue, the first
        # `_small_size` inserts fill S and the rest go to M (the warm-up rule), frequency 0,
        # each linked at its queue's head when evictable.
        fresh = not (self._meta or self._ghost or self._has_evicted) and self._pending_key is _NO_KEY
        if not fresh or not self._inserts_like(S3FIFOPolicy):
            return False
        self._add_columns(keys, metas, flags)
        s = min(self._small_size, len(keys))
        self._freq.update(zip(keys, repeat(0)))
        queue_of = self._queue_of
        queue_of.update(zip(keys[:s], repeat(_SMALL)))
        queue_of.update(zip(keys[s:], repeat(_MAIN)))
        self._n_small += s
        self._n_main += len(keys) - s
        self._small.update(zip(compress(keys[:s], flags[:s]), repeat(None)))
        self._main.update(zip(compress(keys[s:], flags[s:]), repeat(None)))
        return True

    def _on_access(self, key: Hashable, meta: EntryMeta) -> None:
        freq = self._freq[key]
        if freq < _MAX_FREQ:
            self._freq[key] = freq + 1

    def _on_evictable(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None:
        queue = self._small if self._queue_of[key] == _SMALL else self._main
        if evictable:
            queue[key] = None
        else:
            del queue[key]

    def _on_remove(self, key: Hashable, meta: EntryMeta, was_evictable: bool) -> None:
        del self._freq[key]
        if self._queue_of.pop(key) == _SMALL:
            self._n_small -= 1
            if was_evictable:
                del self._small[key]
        else:
            self._n_main -= 1
            if was_evictable:
                del self._main[key]

    def _evict_small(self) -> Any:
        """Evict from S's tail, moving frequent entries to M; _NO_KEY when S empties first."""
        small, freq, threshold = self._small, self._freq, self.move_threshold
        while small:
            key, _ = small.popitem(last=False)
            self._n_small -= 1
            if freq[key] >= threshold:
                freq[key] = 0
                self._queue_of[key] = _MAIN
                self._n_main += 1
                self._main[key] = None
                continue
            del freq[key]
            del self._queue_of[key]
            ghost = self._ghost
            if self._ghost_size > 0 and key not in ghost:
                while len(ghost) >= self._ghost_size:
                    ghost.popitem(last=False)
                ghost[key] = None
            return key
        return _NO_KEY

    def _evict_main(self) -> Hashable:
        """Evict from M's tail; entries with frequency f >= 1 go back to the head with f - 1."""
        main, freq = self._main, self._freq
        while True:
            key, _ = main.popitem(last=False)
            f = freq[key]
            if f >= 1:
                freq[key] = f - 1
                main[key] = None
                continue
            del freq[key]
            del self._queue_of[key]
            self._n_main -= 1
            return key

    def _pop_victim(self) -> Hashable:
        self._has_evicted = True
        while True:
            if self._main and (self._n_main > self._main_size or not self._small):
                return self._evict_main()
            if self._small:
                key: Hashable = self._evict_small()
                if key is not _NO_KEY:
                    return key
                continue  # everything in S moved to M
            return self._evict_main()

    def _eviction_order(self) -> list[Hashable]:
        """Replays the eviction loop on copies, without ghost insertions."""
        small: deque[Hashable] = deque(self._small)
        main: deque[Hashable] = deque(self._main)
        freq = {k: self._freq[k] for k in (*small, *main)}
        n_small, n_main = self._n_small, self._n_main
        threshold = self.move_threshold
        order: list[Hashable] = []
        while small or main:
            if main and (n_main > self._main_size or not small):
                while True:
                    key = main.popleft()
                    if freq[key] >= 1:
                        freq[key] -= 1
                        main.append(key)
                        continue
                    n_main -= 1
                    order.append(key)
                    break
                continue
            while small:
                key = small.popleft()
                n_small -= 1
                if freq[key] >= threshold:
                    freq[key] = 0
                    n_main += 1
                    main.append(key)
                    continue
                order.append(key)
                break
        return order

    # ---- the module spec's interface ------------------------------------------------------

    preemption_order = "s3fifo"  # its default sequence order (preemption.ORDERS)
