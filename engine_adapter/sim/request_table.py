"""`RequestTable`: a workload's requests as columns, the keys of them all in one integer array.

A trace of 10^8 block lookups held as `SimRequest`s is a tuple of 10^8 pointers and one int
object per distinct key, and a Python object per request; held here it is the keys in ONE
array (int32 while every key fits, int64 once one does not: 4 or 8 bytes a lookup, no objects),
each request's end in it (`offsets`) and one array per scalar field (about 60 bytes a request).
Tenants and sessions are codes into a list of their labels. Keys that are not all integers
within int64 (a tuple, a string) are kept as a list of the keys themselves, so any workload a
`Workload` holds fits.

It is a read-only `Sequence[SimRequest]`: `table[i]` builds the `SimRequest` on demand (its
`block_hashes` a fresh tuple of the keys; the last one built is kept, as the event loop asks for
the same request a few times in a row), so every consumer of `Workload.requests` works on it
unchanged, and what the simulator derives from the lookup stream is computed from the arrays
(`unique_blocks`, `lookup_keys`, `next_use_positions`, `request_ends`), never from objects.
`append` adds a request (the readers fill the columns one record at a time).

Rows are the same as on the list of `SimRequest`s, field for field (tests/test_request_table.py).
Imports the workload record and numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from engine_adapter.sim.workloads import SimRequest, next_use_positions

__all__ = ["RequestTable"]

_DENSE = 4
"""Distinct keys are counted with a bitmap over [0, max key] when the largest key is at most
this many times the number of lookups (the traces' ids are: consecutive from 0), else sorted."""


_NEXT_USE_CHUNK = 1 << 20
"""Lookups per chunk of `_next_uses` (its scratch is a few arrays of this length)."""


def _next_uses(keys: np.ndarray, after: np.ndarray) -> None:
    """Fill `after[i]` with the position of `keys[i]`'s next occurrence (`after` comes filled
    with the number of keys: none).

    Chunk by chunk from the end, each sorted on its own (stable, so a key's positions stay in
    order): within a chunk a lookup's next use is the next one of its run; the last of a run
    takes the key's first position in the chunks after it (`first`, one slot per key), which the
    run's first position then replaces. Keys are slots by value where they are small
    non-negative ints (the traces' ids count from 0), else by rank among the distinct keys
    (`np.unique`: one sorted copy of the keys while it runs). A whole-array argsort instead costs
    about 37 bytes a lookup at its peak (order, sorted keys, the result and its copies)."""
    n = len(keys)
    low, high = int(keys.min()), int(keys.max())
    distinct = None if low >= 0 and high < n + (1 << 20) else np.unique(keys)
    first = np.full(high + 1 if distinct is None else len(distinct), n, dtype=np.int64)
    for start in range(((n - 1) // _NEXT_USE_CHUNK) * _NEXT_USE_CHUNK, -1, -_NEXT_USE_CHUNK):
        chunk = keys[start : start + _NEXT_USE_CHUNK]
        slots = chunk if distinct is None else np.searchsorted(distinct, chunk)
        order = np.argsort(slots, kind="stable")
        ordered = slots[order]
        positions = order + start
        same = ordered[1:] == ordered[:-1]
        after[positions[:-1][same]] = positions[1:][same]
        last = np.append(~same, True)  # the last lookup of each key's run
        after[positions[last]] = first[ordered[last]]
        head = np.insert(~same, 0, True)  # the first of each run
        first[ordered[head]] = positions[head]


class _Labels:
    """Optional string labels (tenants, sessions) as codes: -1 is None."""

    __slots__ = ("codes", "index", "names")

    def __init__(self) -> None:
        self.codes = array("i")
        self.names: list[str] = []
        self.index: dict[str, int] = {}

    def append(self, label: str | None) -> None:
        if label is None:
            self.codes.append(-1)
            return
        code = self.index.get(label)
        if code is None:
            code = self.index[label] = len(self.names)
            self.names.append(label)
        self.codes.append(code)

    def get(self, i: int) -> str | None:
        code = self.codes[i]
        return None if code < 0 else self.names[code]


class RequestTable(Sequence[SimRequest]):
    """The requests of a workload as columns (module docstring); a read-only `Sequence`."""

    def __init__(self) -> None:
        self._keys: Any = array("i")  # array("i"), array("q") or a list of other keys
        self._offsets = array("q", [0])  # request i's keys: _keys[_offsets[i]:_offsets[i + 1]]
        self._ids = array("q")
        self._arrival = array("d")
        self._input = array("q")
        self._output = array("q")
        self._priority = array("q")
        self._tenants = _Labels()
        self._sessions = _Labels()
        # prompt-cache contracts (`engine_adapter.sim.contracts`): NaN / -1 / code -1 for none;
        # empty until a request carries one (then filled for the ones before): no cost without
        self._ttl = array("d")
        self._breakpoint = array("q")
        self._salts = _Labels()
        self._contracts = False
        self._last: tuple[int, SimRequest] | None = None

    @classmethod
    def of(cls, requests: Iterable[SimRequest]) -> RequestTable:
        """The table of `requests`, in their order (their tokens, if any, are not kept)."""
        table = cls()
        for request in requests:
            table.append(request)
        return table

    # ---- filling -------------------------------------------------------------------------

    def add(
        self,
        request_id: int,
        arrival_s: float,
        keys: Sequence[Hashable],
        input_len: int,
        output_len: int,
        tenant: str | None = None,
        priority: int = 0,
        session: str | None = None,
        cache_salt: str | None = None,
        cache_ttl_s: float | None = None,
        cache_breakpoint: int | None = None,
    ) -> None:
        """Append one request: its fields, its keys in prefix order (salted already)."""
        self._extend_keys(keys)
        self._offsets.append(len(self._keys))
        self._ids.append(request_id)
        self._arrival.append(arrival_s)
        self._input.append(input_len)
        self._output.append(output_len)
        self._priority.append(priority)
        self._tenants.append(tenant)
        self._sessions.append(session)
        if (
            self._contracts
            or cache_salt is not None
            or cache_ttl_s is not None
            or cache_breakpoint is not None
        ):
            if not self._contracts:  # the first: the requests before it carry none
                before = len(self._ids) - 1
                self._ttl, self._breakpoint = array("d", [math.nan]) * before, array("q", [-1]) * before
                self._salts.codes = array("i", [-1]) * before
                self._contracts = True
            self._salts.append(cache_salt)
            self._ttl.append(math.nan if cache_ttl_s is None else cache_ttl_s)
            self._breakpoint.append(-1 if cache_breakpoint is None else cache_breakpoint)

    def _contract(self, i: int) -> tuple[str | None, float | None, int | None]:
        """Request `i`'s salt, lifetime and breakpoint (None each where not given)."""
        if not self._contracts:
            return None, None, None
        ttl, breakpoint_ = self._ttl[i], self._breakpoint[i]
        return self._salts.get(i), None if math.isnan(ttl) else ttl, None if breakpoint_ < 0 else breakpoint_

    def has_contracts(self) -> bool:
        """Whether some request carries a prompt-cache contract field."""
        return self._contracts

    def append(self, request: SimRequest) -> None:
        """Append `request` (its `token_ids`, if any, are not kept)."""
        r = request
        self.add(
            r.request_id,
            r.arrival_s,
            list(r.block_hashes),
            r.input_len,
            r.output_len,
            r.tenant,
            r.priority,
            r.session,
            r.cache_salt,
            r.cache_ttl_s,
            r.cache_breakpoint,
        )

    def _extend_keys(self, keys: Sequence[Hashable]) -> None:
        """Extend the key array, widening it (int32 -> int64 -> a list of objects) when a key
        does not fit; `array.extend` may have taken some keys before it fails: cut back first."""
        stored = self._keys
        before = len(stored)
        try:
            stored.extend(keys)
            return
        except (OverflowError, TypeError):
            del stored[before:]
        if isinstance(stored, array) and stored.typecode == "i" and all(type(k) is int for k in keys):
            self._keys = array("q", stored)
            self._extend_keys(keys)
            return
        self._keys = stored.tolist() if isinstance(stored, array) else stored
        self._keys.extend(keys)

    # ---- the Sequence --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> SimRequest: ...

    @overload
    def __getitem__(self, index: slice) -> RequestTable: ...

    def __getitem__(self, index: int | slice) -> SimRequest | RequestTable:
        if isinstance(index, slice):
            return self.take(range(len(self))[index])
        last = self._last
        if last is not None and last[0] == index:
            return last[1]
        i = range(len(self))[index]  # IndexError as a list's; a negative index counts back
        request = SimRequest(
            request_id=self._ids[i],
            arrival_s=self._arrival[i],
            block_hashes=tuple(self._keys[self._offsets[i] : self._offsets[i + 1]]),
            input_len=self._input[i],
            output_len=self._output[i],
            tenant=self._tenants.get(i),
            priority=self._priority[i],
            session=self._sessions.get(i),
        )
        if self._contracts:
            salt, ttl, breakpoint_ = self._contract(i)
            request = dataclasses.replace(
                request, cache_salt=salt, cache_ttl_s=ttl, cache_breakpoint=breakpoint_
            )
        self._last = (index, request)
        return request

    def __iter__(self) -> Iterator[SimRequest]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        """Equal to a table, list or tuple of the same requests in the same order (so that a
        consumer comparing a workload's requests with a list reads as it did)."""
        if not isinstance(other, RequestTable | list | tuple):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable (append), as a list

    def take(self, positions: Iterable[int]) -> RequestTable:
        """A new table of the requests at `positions`, in that order."""
        table = RequestTable()
        keys, offsets = self._keys, self._offsets
        for i in positions:
            table.add(
                self._ids[i],
                self._arrival[i],
                keys[offsets[i] : offsets[i + 1]],
                self._input[i],
                self._output[i],
                self._tenants.get(i),
                self._priority[i],
                self._sessions.get(i),
                *self._contract(i),
            )
        return table

    # ---- columns and what the simulator derives from them --------------------------------

    def arrival_s(self, index: int) -> float:
        """Request `index`'s arrival (s), without building the request."""
        return self._arrival[index]

    def arrivals(self) -> np.ndarray:
        """Every request's arrival (s), in table order (a view, no copy)."""
        return np.frombuffer(self._arrival, dtype=np.float64)

    def has_tenants(self) -> bool:
        return bool(self._tenants.names)

    def sorted_by_arrival(self) -> RequestTable:
        """The table itself when its requests are in arrival order, else a sorted copy (stable:
        ties keep their order)."""
        arrivals = self.arrivals()
        if len(arrivals) < 2 or bool(np.all(arrivals[1:] >= arrivals[:-1])):
            return self
        return self.take(np.argsort(arrivals, kind="stable").tolist())

    def key_array(self) -> np.ndarray | None:
        """The keys as a numpy view (no copy), or None when they are not integers."""
        keys = self._keys
        if not isinstance(keys, array):
            return None
        return np.frombuffer(keys, dtype=np.int32 if keys.typecode == "i" else np.int64)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's input and output lengths as int64 views (no copy), in table order."""
        return np.frombuffer(self._input, dtype=np.int64), np.frombuffer(self._output, dtype=np.int64)

    def label_codes(self, tenants: bool) -> tuple[np.ndarray, int]:
        """Every request's tenant (`tenants`) or session as a code (a view, no copy), -1 for
        None, and the number of distinct labels (the codes are 0 to that, less one)."""
        labels = self._tenants if tenants else self._sessions
        return np.frombuffer(labels.codes, dtype=np.intc), len(labels.names)

    def label_names(self, tenants: bool) -> list[str]:
        """The tenants (`tenants`) or sessions that `label_codes` numbers, in code order."""
        labels = self._tenants if tenants else self._sessions
        return list(labels.names)

    def int64_keys(self) -> bool:
        """Whether every key is an int within int64: the keys are an int array."""
        return isinstance(self._keys, array)

    def total_block_lookups(self) -> int:
        return len(self._keys)

    def unique_blocks(self) -> int:
        """Distinct keys: a bitmap where the keys are small non-negative ints, else a sort."""
        keys = self.key_array()
        if keys is None:
            return len(set(self._keys))
        if len(keys) == 0:
            return 0
        low, high = int(keys.min()), int(keys.max())
        if low >= 0 and high <= _DENSE * len(keys) + (1 << 20):
            seen = np.zeros(high + 1, dtype=np.bool_)
            seen[keys] = True
            return int(np.count_nonzero(seen))
        return int(np.unique(keys).size)

    def lookup_keys(self) -> list[Hashable]:
        """Every request's keys in order, as Python objects (an offline policy's future)."""
        keys = self._keys
        return keys.tolist() if isinstance(keys, array) else list(keys)

    def next_use_positions(self) -> array[int]:
        """For each lookup, the position of the same key's next lookup, else the number of
        lookups: one int64 array (`workloads.next_use_positions`), and besides it only one
        chunk's scratch and one slot per key (`_next_uses`), never a copy of the lookups."""
        keys = self.key_array()
        n = len(self._keys)
        if keys is None:
            return next_use_positions(list(self))
        result = array("q", [n]) * n  # filled in place: no bytes of 8 per lookup built first
        if n:
            _next_uses(keys, np.frombuffer(result, dtype=np.int64))
        return result

    def request_ends(self) -> array[int]:
        """Each request's end in the lookup stream (its keys' offsets after the first)."""
        return self._offsets[1:]

    def summary(self) -> dict[str, Any]:
        """`Workload.describe`'s token, duration and label figures, from the columns."""
        arrivals = self.arrivals()
        return {
            "prompt_tokens": int(np.frombuffer(self._input, dtype=np.int64).sum()),
            "output_tokens": int(np.frombuffer(self._output, dtype=np.int64).sum()),
            "duration_s": float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0,
            "tenants": len(self._tenants.names),
            "sessions": len(self._sessions.names),
        }

    def nbytes(self) -> int:
        """Bytes of the arrays (the label lists not counted)."""
        columns = (
            self._offsets, self._ids, self._arrival, self._input, self._output, self._priority,
            self._ttl, self._breakpoint,
        )  # fmt: skip
        keys = self._keys.itemsize * len(self._keys) if isinstance(self._keys, array) else 8 * len(self._keys)
        labels = (self._tenants.codes, self._sessions.codes, self._salts.codes)
        return keys + sum(c.itemsize * len(c) for c in (*columns, *labels))
