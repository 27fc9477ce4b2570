"""The hot-swap handover of a policy's entries: `entries` / `from_entries`, their column forms and
bulk loads (docs/architecture.md, "Policy interface").

`EntryHandover` is a mixin of `sage_eviction.base.EvictionPolicy` (its only user): the state it
reads and the hooks it calls are `EvictionPolicy`'s, declared here for the type checker only.
A policy hands its entries over as `PolicyEntry(key, meta, evictable)` records or as three
columns; a new policy loads them one by one through its `_on_insert` hook (`_load_each`) or, where
it has one that applies, in one pass of C-level operations (`_load_bulk`).

Imports: the standard library and `sage_eviction.errors` / `sage_eviction.types`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable
from itertools import compress, filterfalse, repeat
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sage_eviction.errors import DuplicateKeyError
from sage_eviction.types import EntryMeta, PolicyEntry

__all__ = ["EntryHandover"]

H = TypeVar("H", bound="EntryHandover")

_new_tuple: Callable[..., PolicyEntry] = tuple.__new__  # C-level PolicyEntry construction
_KEY = operator.itemgetter(0)
_META = operator.itemgetter(1)
_FLAG = operator.itemgetter(2)


def _entries_of(keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> list[PolicyEntry]:
    """`[PolicyEntry(*e) for e in zip(keys, metas, flags)]`, built in C: a NamedTuple's own
    `__new__` is a Python function, twice as slow over a million entries."""
    return list(map(_new_tuple, repeat(PolicyEntry), zip(keys, metas, flags, strict=True)))


class EntryHandover:
    """What a policy hands to its successor in a hot swap, and how a new policy loads it.

    A mixin of `EvictionPolicy`; a subclass that keeps extra order overrides `entries()` (its
    columns follow) or `_load_bulk` (built from the columns at once).
    """

    # EvictionPolicy's, set in its __init__ (declared for the type checker).
    name: ClassVar[str]
    _meta: dict[Hashable, EntryMeta]
    _evictable: set[Hashable]
    _clock: int

    if TYPE_CHECKING:  # EvictionPolicy's hooks

        def _on_insert(self, key: Hashable, meta: EntryMeta, evictable: bool) -> None: ...

        def _eviction_order(self) -> list[Hashable]: ...

    def entries(self) -> list[PolicyEntry]:
        """Every entry, for a hot swap: non-evictable ones first, then the evictable ones in
        eviction order (the next victim first), so that inserting them in this order, each one
        newer than the last, rebuilds the same order in an order-preserving policy.

        Built with C-level iteration only (a hot swap at 1e6 blocks has 0.5 s in all)."""
        return _entries_of(*self._own_columns())

    def entry_columns(self) -> tuple[list[Hashable], list[EntryMeta], list[bool]]:
        """`entries()` as three lists in the same order: keys, metas and evictable flags.

        What `CacheManager.swap_policy` hands over: no `PolicyEntry` is built per entry (a
        third of a swap at 1e6 blocks). A subclass that overrides `entries()` gets its columns.
        """
        if type(self).entries is not EntryHandover.entries:
            items = self.entries()
            return list(map(_KEY, items)), list(map(_META, items)), list(map(_FLAG, items))
        return self._own_columns()

    def _own_columns(self) -> tuple[list[Hashable], list[EntryMeta], list[bool]]:
        meta = self._meta
        evictable = self._evictable
        if not evictable:
            return list(meta), list(meta.values()), [False] * len(meta)
        keys: list[Hashable] = (
            list(filterfalse(evictable.__contains__, meta)) if len(evictable) < len(meta) else []
        )
        flags = [False] * len(keys)
        keys.extend(self._eviction_order())
        flags.extend(repeat(True, len(keys) - len(flags)))
        return keys, list(map(meta.__getitem__, keys)), flags

    @classmethod
    def from_entries(cls: type[H], entries: Iterable[PolicyEntry], **params: Any) -> H:
        """A new policy holding `entries` (as returned by `entries()`), built with `params`."""
        policy = cls(**params)
        policy._load(entries)
        return policy

    @classmethod
    def from_entry_columns(
        cls: type[H], keys: list[Hashable], metas: list[EntryMeta], flags: list[bool], **params: Any
    ) -> H:
        """`from_entries` of the entries `entry_columns()` returned as these three lists."""
        if cls.from_entries.__func__ is not EntryHandover.from_entries.__func__:  # type: ignore[attr-defined]
            return cls.from_entries(_entries_of(keys, metas, flags), **params)
        policy = cls(**params)
        if type(policy)._load is EntryHandover._load and policy._load_bulk(keys, metas, flags):
            return policy
        policy._load(_entries_of(keys, metas, flags))
        return policy

    def _load(self, entries: Iterable[PolicyEntry]) -> None:
        """Insert `entries` in order without counting lookups or re-prefills.

        Through `_load_bulk` when the class has one that applies, else `_load_each`."""
        if type(self)._load_bulk is EntryHandover._load_bulk:
            self._load_each(entries)
            return
        items = entries if isinstance(entries, list) else list(entries)
        keys: list[Hashable] = list(map(_KEY, items))
        metas: list[EntryMeta] = list(map(_META, items))
        flags: list[bool] = list(map(_FLAG, items))
        if not self._load_bulk(keys, metas, flags):
            self._load_each(items)

    def _load_each(self, entries: Iterable[PolicyEntry]) -> None:
        """`_load` one entry at a time through `_on_insert`."""
        for key, meta, evictable in entries:
            if key in self._meta:
                raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
            self._clock += 1
            self._meta[key] = meta
            if evictable:
                self._evictable.add(key)
            self._on_insert(key, meta, evictable)

    def _load_bulk(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> bool:
        """`_load_each` of these entries built at once from C-level operations (dict and set
        `update` over `zip`, `heapify`), giving exactly the state the one-by-one inserts give
        (tests/test_bulk_load.py checks it); False, having changed nothing, when it does not
        apply (a policy that is not empty, a subclass that hooks inserts). None here."""
        return False

    def _inserts_like(self, owner: type[Any]) -> bool:
        """Whether this object's `_on_insert` is `owner`'s, so that `owner`'s `_load_bulk`
        (which does not call it) builds what the inserts would: a subclass that hooks inserts
        gets the one-by-one load."""
        return type(self)._on_insert is owner._on_insert

    def _add_columns(self, keys: list[Hashable], metas: list[EntryMeta], flags: list[bool]) -> int:
        """The bookkeeping `_load_each` does, for all entries at once, into an empty policy.

        Adds the entries to `_meta` and `_evictable` and advances the clock by one per entry.
        Returns the tick of the first: entry i gets tick `first + i`, the clock its
        `_on_insert` would have seen.

        Raises:
            DuplicateKeyError: A key appears twice (as `_load_each` raises it).
        """
        meta_of = self._meta
        meta_of.update(zip(keys, metas, strict=True))
        if len(meta_of) != len(keys):
            seen: set[Hashable] = set()
            for key in keys:
                if key in seen:
                    raise DuplicateKeyError(f"{self.name}: key {key!r} appears twice in the entries")
                seen.add(key)
        self._evictable.update(compress(keys, flags))
        first = self._clock + 1
        self._clock += len(keys)
        return first
