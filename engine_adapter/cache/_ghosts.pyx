# cython: language_level=3
"""The compiled regret ghost set for int64 block keys: `IntGhostSet`, `ghosts.GhostSet` in C.

ghosts.py is the reference and the fallback: the same API (`lookup`, `stamp`, `eviction`,
`add`, `add_records`, `peek`, `clear`, `len`, `in`, `capacity`, `times.horizon`) and the same
results, step for step (tests/test_ghosts_compiled.py runs both side by side). It is used only
where every key is known to be an int64 (`ghosts.new_ghost_set(..., int_keys=True)`; the
simulator's radix model asks `workloads.int64_keys`), because then nothing per ghost needs to be
a Python object, and the ghosts and their clocks were the largest share of the cache's Python
heap per block (docs/performance.md, "Traces as arrays").

What is in C: the first-in first-out set of evicted keys (the core's `Ghosts`, a key -> slot
I64Map over linked arrays: sage_eviction/_core_flat_lists.pxi, included here, one source), per
ghost its eviction id, tenant index and eviction-call index in arrays by slot; per eviction call
its clock stamp, blocks kept and the count of its ghosts (a call's entry is reused once its last
ghost leaves), and the two clocks (_ghosts_clocks.pxi). What stays a Python object: one
`_Eviction` per eviction call (its time and policy exactly as given, int or float), one string
per tenant, and a `Ghost` built only when a lookup or `peek` finds one.
"""

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc

import array

from engine_adapter.cache.ghosts import Ghost, _Eviction

include "_core_memory.pxi"
include "_core_i64map.pxi"
include "_core_flat_lists.pxi"
include "_ghosts_clocks.pxi"


cdef int64_t[::1] _int64s(keys):
    # the keys as int64s (OverflowError past int64, TypeError for a key not an int)
    return array.array("q", keys)


cdef struct Calls:
    # the eviction calls' shared fields that C reads, by call index; `spare` holds the free ones
    int64_t* stamp
    int64_t* kept
    int32_t* ghosts  # its ghosts still held (0: free)
    int32_t* spare
    Py_ssize_t num_spare
    Py_ssize_t used  # indices handed out so far
    Py_ssize_t cap


cdef int _calls_grow(Calls* c) except -1:
    # an array that fails to grow stays as it was (the others may have grown): `cap` is kept
    cdef Py_ssize_t cap = c.cap * 2 if c.cap else 64
    c.stamp = <int64_t*>_resized(c.stamp, cap * sizeof(int64_t))
    c.kept = <int64_t*>_resized(c.kept, cap * sizeof(int64_t))
    c.ghosts = <int32_t*>_resized(c.ghosts, cap * sizeof(int32_t))
    c.spare = <int32_t*>_resized(c.spare, cap * sizeof(int32_t))
    c.cap = cap
    return 0


cdef void _calls_free(Calls* c) noexcept:
    free(c.stamp)
    free(c.kept)
    free(c.ghosts)
    free(c.spare)
    c.stamp = c.kept = NULL
    c.ghosts = c.spare = NULL


cdef class IntGhostSet:
    """`ghosts.GhostSet` for int64 keys (see the module's docstring).

    Args:
        capacity: Ghosts kept (at least 1).
        horizon: The clocks' horizon (`ghosts.GhostSet`).
        keys: The distinct keys it will see, when the caller knows them (0: not known): the
            reuse times' table is sized to them once (`IntReuseTimes`).
    """

    cdef readonly Py_ssize_t capacity
    cdef readonly IntReuseTimes times
    cdef IntReuseClock counted
    cdef Ghosts fifo
    cdef int64_t* eviction_id  # by slot of `fifo`
    cdef int32_t* tenant  # by slot: index into `tenants`
    cdef int32_t* call  # by slot: index into `calls`
    cdef Calls calls
    cdef list call_objs  # by call index: its `_Eviction` (None: free)
    cdef list tenants
    cdef dict tenant_ids
    cdef int64_t* scratch  # one lookup's keys
    cdef Py_ssize_t scratch_cap

    def __cinit__(self, Py_ssize_t capacity, Py_ssize_t horizon, Py_ssize_t keys=0):
        _ghosts_clear(&self.fifo)
        if capacity < 1:
            raise ValueError(f"ghost capacity {capacity} must be at least 1")
        self.capacity = capacity
        self.times = IntReuseTimes(horizon, keys)
        self.counted = IntReuseClock(horizon)
        _ghosts_init(&self.fifo, capacity)
        self.eviction_id = <int64_t*>malloc(capacity * sizeof(int64_t))
        self.tenant = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.call = <int32_t*>malloc(capacity * sizeof(int32_t))
        if self.eviction_id == NULL or self.tenant == NULL or self.call == NULL:
            raise MemoryError()
        _calls_grow(&self.calls)
        self.call_objs = []
        self.tenants = [None]
        self.tenant_ids = {None: 0}

    def __dealloc__(self):
        _ghosts_free(&self.fifo)
        _calls_free(&self.calls)
        free(self.eviction_id)
        free(self.tenant)
        free(self.call)
        free(self.scratch)

    def __len__(self) -> int:
        return _ghosts_len(&self.fifo)

    @property
    def calls_held(self) -> int:
        """Eviction calls with a ghost still held: the call table's entries in use (a call's
        entry is freed with its last ghost, so this never exceeds `len`)."""
        return self.calls.used - self.calls.num_spare

    def __contains__(self, key) -> bool:
        return self._slot(key) != _ABSENT

    cdef int64_t _slot(self, key) except? -2:
        # the slot of `key`, or _ABSENT (also for a key that is no int64: never stored)
        cdef int64_t k
        try:
            k = key
        except (OverflowError, TypeError):
            return _ABSENT
        return _map_get(&self.fifo.index, k)

    # ------------------------------------------------------------------ eviction calls

    cdef int32_t _new_call(self, call) except -1:
        # an entry for one eviction call's shared fields, held by no ghost yet
        cdef Calls* c = &self.calls
        cdef int32_t index
        if c.num_spare:
            c.num_spare -= 1
            index = c.spare[c.num_spare]
            self.call_objs[index] = call
        else:
            if c.used == c.cap:
                _calls_grow(c)
            index = <int32_t>c.used
            c.used += 1
            self.call_objs.append(call)
        c.stamp[index] = call.stamp
        c.kept[index] = call.kept
        c.ghosts[index] = 0
        return index

    cdef void _release(self, int32_t index):
        # one ghost (or a batch's hold) of call `index` gone; the entry is free after the last
        cdef Calls* c = &self.calls
        c.ghosts[index] -= 1
        if c.ghosts[index] == 0:
            c.spare[c.num_spare] = index
            c.num_spare += 1
            self.call_objs[index] = None

    # ------------------------------------------------------------------ the first-in first-out set

    cdef bint _drop(self, int64_t key):
        # GhostSet: records.pop(key, None); whether it was there
        cdef int64_t slot = _map_get(&self.fifo.index, key)
        if slot == _ABSENT:
            return False
        self._release(self.call[slot])
        _ghosts_pop(&self.fifo, key)
        return True

    cdef int _push(self, int64_t key, int64_t eviction_id, int32_t tenant, int32_t call) except -1:
        # `key` the newest ghost (taken out first if held), the oldest dropped while full: the
        # same set as GhostSet's insert-all-then-drop (the newest `capacity` by last insertion)
        cdef int64_t slot
        self._drop(key)
        while _ghosts_len(&self.fifo) >= self.capacity:
            self._drop(self.fifo.key[self.fifo.ends.tail])
        _ghosts_push(&self.fifo, key)
        slot = _map_get(&self.fifo.index, key)
        self.eviction_id[slot] = eviction_id
        self.tenant[slot] = tenant
        self.call[slot] = call
        self.calls.ghosts[call] += 1
        return 0

    cdef int32_t _tenant_id(self, tenant) except -1:
        index = self.tenant_ids.get(tenant)
        if index is None:
            index = self.tenant_ids[tenant] = len(self.tenants)
            self.tenants.append(tenant)
        return index

    cdef object _ghost(self, int64_t slot):
        # the Ghost of the record at `slot` (GhostSet's _ghost: the call's stamp as it is now)
        cdef int32_t c = self.call[slot]
        call = self.call_objs[c]
        return Ghost(
            self.eviction_id[slot], call.evicted_at, self.calls.stamp[c], call.kept, call.policy,
            self.tenants[self.tenant[slot]],
        )

    # ------------------------------------------------------------------ the API of GhostSet

    cdef int64_t* _keys(self, keys, Py_ssize_t n) except NULL:
        # `keys` into the scratch buffer (OverflowError / TypeError for a key that is no int64)
        cdef Py_ssize_t i
        if n + 1 > self.scratch_cap:
            self.scratch = <int64_t*>_resized(self.scratch, (n + 1) * 2 * sizeof(int64_t))
            self.scratch_cap = (n + 1) * 2
        for i in range(n):
            self.scratch[i] = keys[i]
        return self.scratch

    cdef int _room(self, Py_ssize_t n) except -1:
        # GhostSet._room: compact the counted clock when `n` accesses would not fit, and map
        # each held call's stamp onto the new numbering
        cdef Calls* c = &self.calls
        cdef Py_ssize_t i
        if self.counted.now + n <= self.counted.size:
            return 0
        self.counted._compact()
        for i in range(c.used):
            if c.ghosts[i] > 0:
                c.stamp[i] = self.counted._remap(c.stamp[i])
        return 0

    def lookup(self, keys, Py_ssize_t n_hit):
        """GhostSet.lookup: the hits' reuse times, and (index, Ghost, regret) of each missed
        key that was a ghost (removed)."""
        cdef Py_ssize_t n = len(keys)
        cdef int64_t* buf
        if n_hit < 0:
            raise ValueError(f"n_hit={n_hit} must not be negative")
        n_hit = min(n_hit, n)
        buf = self._keys(keys, n)
        ghosts = []
        self._find_ghosts(buf, n, n_hit, ghosts, NULL, NULL, False)
        return self.times._access_many(buf, n, n_hit), ghosts

    @property
    def clock_keys(self) -> int:
        """Keys the regret clock remembers (its map's entries): with a C caller, none are
        recorded while no ghost is held (`ghosts_lookup`)."""
        return self.counted.last.size + (1 if self.counted.last.holds_min else 0)

    cdef int _find_ghosts(self, const int64_t* buf, Py_ssize_t n, Py_ssize_t n_hit, list ghosts,
                          GhostFound* found, Py_ssize_t* n_found, bint while_held) except -1:
        # `lookup` but the reuse times: the hits counted, each missed ghost removed and counted,
        # given back as (index, Ghost, regret) in `ghosts`, or (a C caller) as `GhostFound`s.
        # `while_held`: record nothing while no ghost is held. Exact for the regrets: a regret
        # counts the distinct keys seen since its ghost's eviction stamp, and every lookup after
        # a held ghost's stamp is recorded (it is held until then); a key seen while none was
        # held sits before every later stamp, seen or not. The stamps' numbers (and so the
        # compactions' times) then differ from `lookup`'s, which the C caller never reads: a
        # row that never evicts (the unbounded reference) keeps no clock of every key it saw.
        cdef Py_ssize_t i
        cdef int64_t slot
        cdef int32_t c
        cdef bint regret
        if while_held and not _ghosts_len(&self.fifo):
            return 0
        self._room(n)
        if n_hit:
            self.counted._access_many(buf, n_hit)
        if n > n_hit and _ghosts_len(&self.fifo):
            for i in range(n_hit, n):
                slot = _map_get(&self.fifo.index, buf[i])
                if slot == _ABSENT:
                    continue
                c = self.call[slot]
                # counted from its eviction, before this lookup of it
                regret = self.counted._distinct_since(self.calls.stamp[c]) < self.calls.kept[c]
                if ghosts is not None:
                    ghosts.append((i, self._ghost(slot), regret))
                else:
                    found[n_found[0]].index = i
                    found[n_found[0]].regret = regret
                    found[n_found[0]].evicted_at = self.call_objs[c].evicted_at
                    found[n_found[0]].tenant = self.tenant[slot]
                    n_found[0] += 1
                self._drop(buf[i])
                self.counted._access_many(&buf[i], 1)
        return 0

    def stamp(self) -> int:
        """The counted lookups' position now."""
        return self.counted.now

    def add(self, key, ghost) -> None:
        """`key` was evicted (GhostSet.add)."""
        call = _Eviction(ghost.evicted_at, ghost.stamp, ghost.kept, ghost.policy)
        self.add_records(((key, (ghost.eviction_id, ghost.tenant, call)),))

    def add_records(self, evicted) -> None:
        """GhostSet.add_records: each (key, (eviction id, tenant, call)) in order; records of
        one call share one entry (made when the call is first seen)."""
        cdef int32_t c = -1
        last = None
        try:
            for key, (eviction_id, tenant, call) in evicted:
                if call is not last:
                    if c >= 0:
                        self._release(c)  # the hold below
                    c = self._new_call(call)
                    self.calls.ghosts[c] += 1  # held while the batch uses it
                    last = call
                self._push(key, eviction_id, self._tenant_id(tenant), c)
        finally:
            if c >= 0:
                self._release(c)

    def add_many(self, keys, eviction_ids, tenants, call) -> None:
        """GhostSet.add_many: one eviction call's victims (keys, eviction ids and tenants in the
        same order), sharing `call`; no tuple per victim."""
        cdef Py_ssize_t n = len(keys), i
        cdef int64_t* buf
        cdef int32_t c
        if len(eviction_ids) != n or len(tenants) != n:
            raise ValueError("add_many: keys, eviction ids and tenants differ in length")
        if not n:
            return
        buf = self._keys(keys, n)
        c = self._new_call(call)
        self.calls.ghosts[c] += 1  # held while the loop uses it
        try:
            for i in range(n):
                tenant = tenants[i]
                self._push(buf[i], eviction_ids[i], 0 if tenant is None else self._tenant_id(tenant), c)
        finally:
            self._release(c)

    @staticmethod
    def eviction(evicted_at, stamp, kept, policy):
        """The shared fields of one eviction call's ghosts (for `add_records`)."""
        return _Eviction(evicted_at, stamp, kept, policy)

    def peek(self, key):
        """The ghost of `key`, left in place, or None."""
        cdef int64_t slot = self._slot(key)
        return None if slot == _ABSENT else self._ghost(slot)

    def clear(self) -> None:
        """Forget every ghost (the clocks stay, as in GhostSet)."""
        while _ghosts_len(&self.fifo):
            self._drop(self.fifo.key[self.fifo.ends.tail])


# ---- the C API (_ghosts.pxd) for a compiled caller: the simulator's radix loop ---------------------


cdef IntGhostSet _checked(object ghosts):
    if type(ghosts) is not IntGhostSet:
        raise TypeError(f"expected an IntGhostSet, got {type(ghosts).__name__}")
    return <IntGhostSet>ghosts


cdef int ghosts_lookup(object ghosts, const int64_t* keys, Py_ssize_t n, Py_ssize_t n_hit,
                       int64_t* times, GhostFound* found, Py_ssize_t* n_found) except -1:
    cdef IntGhostSet g = _checked(ghosts)
    n_found[0] = 0
    g._find_ghosts(keys, n, n_hit, None, found, n_found, True)
    g.times._access_into(keys, n, n_hit, times)
    return 0


cdef int64_t ghosts_stamp(object ghosts) except -1:
    return _checked(ghosts).counted.now


cdef int32_t ghosts_tenant_id(object ghosts, object tenant) except -1:
    cdef IntGhostSet g = _checked(ghosts)
    return 0 if tenant is None else g._tenant_id(tenant)


cdef int ghosts_add_evicted(object ghosts, const int64_t* keys, Py_ssize_t n, int64_t first_id,
                            const int32_t* tenants, object call) except -1:
    cdef IntGhostSet g = _checked(ghosts)
    cdef Py_ssize_t i
    cdef int32_t c
    if not n:
        return 0
    c = g._new_call(call)
    g.calls.ghosts[c] += 1  # held while the loop uses it
    try:
        for i in range(n):
            g._push(keys[i], first_id + i, tenants[i], c)
    finally:
        g._release(c)
    return 0
