# The flat cache with its policy's state in C: `FlatState` (sage_eviction/flat.py, `FlatCache`
# built with `int_keys=True`). Part of sage_eviction/_core.pyx, included after _core_flat.pxi and
# the policies' C home (_kinds.pxi).
#
# `flat_lookup` calls a policy through its C table, but over the policy's own Python containers,
# whose dict and set operations are most of the cost (docs/performance.md). Here the state is C:
# the keys are int64 (the simulator's block keys are ints), held in an open-addressing table
# (key -> node, _core_i64map.pxi), the policy's state is the policies' one C home over the nodes
# (`Nodes`, _kind_nodes.pxi, with a file per kind: the same C the simulator's radix loop runs,
# every block evictable here), and the re-prefill tracker's evicted keys are a `KeySet`
# (_core_keyset.pxi: a trace's dense ids as bits, other ints in a table). belady is
# `BeladyPolicy` over its whole future, by next use in a heap of its own (`FarHeap`,
# _core_flat_lists.pxi). `FlatCache.request` per key, line for line, with each policy's Python
# hooks as the reference (tests/test_flat_state.py runs both).

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc


cdef extern from "Python.h":
    long long PyLong_AsLongLong(object) except? -1
    object PyNumber_Index(object)


cdef int FLAT_BELADY = -1  # `FlatState.kind` of BeladyPolicy (not a kind of the C home)


cdef double _seconds_per_tick = 0.0


cdef double tick_seconds():
    # The time-stamp counter's period, measured once against the monotonic clock over ~5 ms: on
    # this class of machine (a VM) the clock costs ~150 ns a reading, more than the decision it
    # would time, the counter ~10 ns (constant_tsc: its rate does not follow the CPU's).
    global _seconds_per_tick
    cdef double t0, t1
    cdef unsigned long long c0, c1
    if _seconds_per_tick == 0.0:
        if not SAGE_TICKS_ARE_CYCLES:
            _seconds_per_tick = 1e-9
        else:
            t0 = monotonic_seconds()
            c0 = sage_ticks()
            t1 = t0
            while t1 - t0 < 0.005:
                t1 = monotonic_seconds()
            c1 = sage_ticks()
            _seconds_per_tick = (t1 - t0) / <double>(c1 - c0) if c1 > c0 else 1e-9
    return _seconds_per_tick


cdef inline int64_t _as_key(object key) except? -1:
    # an int key as int64, as a dict would find it (a bool or an int-like object by its index);
    # a float, a string, a tuple: TypeError; beyond int64: OverflowError
    if PyLong_CheckExact(key):
        return PyLong_AsLongLong(key)
    return PyLong_AsLongLong(PyNumber_Index(key))


cdef dict _state_kinds = None  # the policy classes whose state runs here -> (kind, variant)


cdef dict _kinds():
    # compiled_kinds' table: the flat home's policies, each with its kind and variant in the C
    # home (belady: BeladyPolicy, FLAT_BELADY)
    global _state_kinds
    if _state_kinds is None:
        from sage_eviction.compiled_kinds import c_codes, compiled_in
        from sage_eviction.policies import POLICIES

        _state_kinds = {POLICIES[name]: (FLAT_BELADY, 0) if name == "belady" else c_codes(name)
                        for name in compiled_in("flat")}
    return _state_kinds


def flat_state_policies():
    """The names of the built-in policies a `FlatState` runs with its state in C."""
    return sorted(cls.name for cls in _kinds())


def flat_state_runs(policy):
    """Whether a `FlatState` runs `policy`: its exact class is one of `flat_state_policies()`,
    built for the compiled core, and belady has its whole future set, strict, unread."""
    kind = _kinds().get(type(policy))
    if kind is None or getattr(policy, "_compiled", False) is not True:
        return False
    return kind[0] != FLAT_BELADY or (policy.has_strict_future and policy.position == 0)


cdef class FlatState:
    """A flat cache of `capacity` blocks with int64 keys, its policy's state in C.

    For an empty policy of one of `flat_state_policies()` (its exact class, built for the
    compiled core), else TypeError. `request` and `lookup` are `FlatCache`'s, the re-prefill
    tracker's counts and the latency record updated as its loop updates them; the tracker's
    evicted keys are kept here (`evicted_waiting`), not in its set. `victims`, when asked for, is
    every victim in order (the differential tests compare it).
    """

    cdef int kind  # the kind in the C home, or FLAT_BELADY
    cdef readonly Py_ssize_t capacity, held, requests, hits, evictions, re_prefilled
    cdef readonly str policy_name
    cdef readonly list victims
    cdef I64Map index  # key -> node
    cdef KeySet evicted  # the keys evicted and not requested since (a trace's dense ids as bits)
    cdef Nodes nodes  # the policy's state (the C home's; belady: only the nodes' keys)
    # belady: its future (the keys, checked as its strict mode checks them; each position's next
    # use, the policy's own array), the position the next call consumes, and the nodes by next use
    cdef object future
    cdef const long long[::1] next_pos
    cdef Py_ssize_t pos, never
    cdef int64_t pushes, incoming
    cdef FarHeap far
    cdef object tracker, latency
    cdef double tick  # seconds a tick of `sage_ticks`
    # the decision times of this call, written into `latency` when it returns (`_flush_latency`):
    # the last `window` of them, their count, and the record's sum with them added
    cdef double* lat_ring
    cdef Py_ssize_t lat_window, lat_pending
    cdef double lat_total
    cdef Py_ssize_t run_evictions, run_re_prefilled  # the counts at `flat_state_open`

    def __cinit__(self):
        self.index.keys = self.index.vals = NULL
        self.nodes.key = NULL
        self.nodes.depth = NULL
        self.nodes.hits = NULL
        self.nodes.evictable = NULL
        self.nodes.pol = NULL
        self.lat_ring = NULL
        _far_clear(&self.far)

    def __init__(self, policy, Py_ssize_t capacity, *, reprefill=None, latency=None,
                 bint record_victims=False):
        if not flat_state_runs(policy):
            raise TypeError(f"policy {type(policy).__qualname__} has no state in C (those that do: "
                            f"{', '.join(flat_state_policies())}; belady with its whole future set, "
                            f"strict, unread)")
        kind, variant = _kinds()[type(policy)]
        if len(policy):
            raise ValueError(f"the policy already holds {len(policy)} entries; a flat cache starts empty")
        if reprefill is not None and (reprefill.evictions or reprefill.re_prefilled):
            # its evicted keys would have to move here from its set: a fresh one keeps one record
            raise ValueError("a FlatState takes a fresh re-prefill tracker (this one has counted)")
        if capacity <= 0 or capacity >= 2 ** 31:
            raise ValueError(f"capacity={capacity} must be a positive number of blocks under 2**31")
        self.kind = kind
        self.policy_name = policy.name
        self.capacity = capacity
        _map_init(&self.index, capacity * 2, True)
        # the tracker's window (None: the whole run, a simulator row's), held here in its stead
        self.evicted = KeySet(window=None if reprefill is None else reprefill.window)
        # what the kinds read of a block's EntryMeta besides its key: its hits (lfu's level,
        # gdsf's frequency), and its depth 0 with a block size of 1, so that gdsf's cost and size
        # are EntryMeta's defaults (1.0 and 1), as `FlatCache.request`'s `policy.insert(key)`
        # makes them
        _nodes_init(&self.nodes, capacity, 1, kind, variant, True)
        if kind == FLAT_BELADY:
            self.future = policy._future
            self.next_pos = policy._next_pos
            self.never = policy._never
            _far_init(&self.far, capacity)
        else:
            _pol_init(&self.nodes, policy)
        self.tracker = reprefill
        self.latency = latency
        self.tick = tick_seconds() if latency is not None else 0.0
        if latency is not None:
            self.lat_window = latency.window
            self.lat_ring = <double*>malloc(self.lat_window * sizeof(double))
            if self.lat_ring == NULL:
                raise MemoryError()
        self.victims = [] if record_victims else None

    def __dealloc__(self):
        _map_free(&self.index)
        _nodes_free(&self.nodes)
        free(self.lat_ring)
        _far_free(&self.far)

    def __reduce__(self):
        raise TypeError("a FlatState's policy lives in C memory: it cannot be pickled")

    def __len__(self):
        return self.held

    def __contains__(self, key):
        return _map_get(&self.index, _as_key(key)) != _ABSENT

    @property
    def evicted_waiting(self):
        """Keys evicted and not requested since (the re-prefill tracker's set, kept here)."""
        return len(self.evicted)

    def keys(self):
        """The held keys, in node order."""
        return [self.nodes.key[node] for node in range(self.held)]

    # ---- FlatCache.request ----------------------------------------------------------------------

    cdef int _evict_into(self, int32_t* node) except -1:
        # FlatCache._evict_one: the policy's victim (the decision timed when there is a latency
        # record), out of the index
        cdef bint timed = self.latency is not None
        cdef unsigned long long start = sage_ticks() if timed else 0
        cdef int64_t victim
        node[0] = _far_pop(&self.far) if self.kind == FLAT_BELADY else _policy_pop(&self.nodes)
        victim = self.nodes.key[node[0]]
        _map_del(&self.index, victim)
        if timed:
            self._note_latency(<double>(sage_ticks() - start) * self.tick)
        if self.tracker is not None:
            self.evicted._add_int(victim)
        if self.victims is not None:
            self.victims.append(victim)
        self.evictions += 1
        return 0

    cdef int _belady_consume(self, int64_t key) except -1:
        # BeladyPolicy._consume in strict mode, then its commit: the call takes the next position
        # of the future, whose next use scores the key (`incoming`)
        cdef Py_ssize_t pos = self.pos
        if pos >= self.never:
            raise PolicyStateError(
                f"belady: call for key {key!r} past the end of the future ({self.never} lookups)")
        expected = self.future[pos]
        if _as_key(expected) != key:
            raise PolicyStateError(f"belady: the calls diverge from the future at position {pos}: "
                                   f"expected key {expected!r}, got {key!r}")
        self.incoming = self.next_pos[pos]
        self.pos = pos + 1
        return 0

    cdef int request_key(self, int64_t key) except -1:
        # 1 for a hit, 0 for a miss (admitted)
        cdef int64_t found
        cdef int32_t node
        cdef bint belady = self.kind == FLAT_BELADY
        self.requests += 1
        if belady:
            self._belady_consume(key)
        found = _map_get(&self.index, key)
        if found != _ABSENT:
            if belady:
                self.pushes += 1
                _far_set(&self.far, <int32_t>found, self.incoming, self.pushes, True)
            else:
                _policy_access(&self.nodes, <int32_t>found)
            self.hits += 1
            return 1
        if self.tracker is not None and self.evicted._discard_int(key):
            self.re_prefilled += 1
        if not belady:  # the policy's prepare_insert: before the evictions (s3fifo, arc)
            _policy_prepare(&self.nodes, key)
        if self.held >= self.capacity:
            self._evict_into(&node)
        else:
            node = <int32_t>self.held
            self.held += 1
        self.nodes.key[node] = key
        if belady:  # in the heap by its next use
            self.pushes += 1
            _far_set(&self.far, node, self.incoming, self.pushes, False)
        else:
            _policy_insert(&self.nodes, node, True)
        _map_put(&self.index, key, node)
        return 0

    cdef inline void _note_latency(self, double seconds) noexcept:
        self.lat_ring[self.lat_pending % self.lat_window] = seconds
        self.lat_pending += 1
        self.lat_total += seconds

    cdef int _flush_latency(self) except -1:
        # What `LatencyRecorder.record` of each pending time, in order, leaves: the count and the
        # sum, and its ring of the last `window` times with its next slot. The k-th time lands
        # after the ring's `room` free places are appended to, then cyclically from `_next`; only
        # the last `window` times can still be in the ring, and they fill distinct slots.
        cdef Py_ssize_t n = self.lat_pending
        cdef Py_ssize_t window = self.lat_window
        cdef Py_ssize_t k, room, start, slot
        cdef list ring
        if n == 0:
            return 0
        recorder = self.latency
        ring = recorder._ring
        room = window - len(ring)
        start = recorder._next
        if room > 0:
            ring.extend([None] * min(room, n))  # each filled below: the kept times cover them
        for k in range(max(0, n - window), n):
            slot = len(ring) - min(room, n) + k if k < room else (start + k - room) % window
            ring[slot] = self.lat_ring[k % window]
        if n > room:
            recorder._next = (start + n - room) % window
        recorder.count += n
        recorder.total = self.lat_total
        self.lat_pending = 0
        return 0

    cdef inline void _open_call(self):
        # the latency record's sum, which this call's times are added to one by one as `record`
        # adds them (the same float, not the sum of a separate sum)
        if self.latency is not None:
            self.lat_total = self.latency.total

    cdef int _tell_records(self, Py_ssize_t evictions, Py_ssize_t re_prefilled) except -1:
        # the tracker's counts move as its on_evict / on_request would have moved them; the
        # latency record gets this call's decision times
        if self.tracker is not None:
            self.tracker.evictions += self.evictions - evictions
            self.tracker.re_prefilled += self.re_prefilled - re_prefilled
        if self.latency is not None:
            self._flush_latency()
        return 0

    def replay_latency(self, times):
        """Note `times` as decision times measured in this order, then write them into the latency
        record as `lookup` does when it returns (the differential tests check that write against
        `LatencyRecorder.record`, whose ring a measured time cannot be compared in)."""
        if self.latency is None:
            raise ValueError("this FlatState has no latency record")
        self._open_call()
        for seconds in times:
            self._note_latency(seconds)
        self._flush_latency()

    def request(self, key):
        """`FlatCache.request(key)`: whether it was a hit (a miss is admitted)."""
        cdef Py_ssize_t evictions = self.evictions, re_prefilled = self.re_prefilled
        self._open_call()
        try:
            return self.request_key(_as_key(key)) == 1
        finally:
            self._tell_records(evictions, re_prefilled)

    def lookup(self, keys):
        """`FlatCache.lookup(keys)`: (hits, whether the last key hit)."""
        cdef Py_ssize_t evictions = self.evictions, re_prefilled = self.re_prefilled
        cdef Py_ssize_t hits = 0, i, n
        cdef int last = 0
        self._open_call()
        try:
            if PyTuple_CheckExact(keys):
                n = PyTuple_GET_SIZE(keys)
                for i in range(n):
                    last = self.request_key(_as_key(<object>PyTuple_GET_ITEM(keys, i)))
                    hits += last
            else:
                for key in keys:
                    last = self.request_key(_as_key(key))
                    hits += last
        finally:
            self._tell_records(evictions, re_prefilled)
        return hits, last == 1


# `FlatState.lookup` for a compiled caller, a run of calls at a time (declared in _core.pxd): the
# records are told at `flat_state_close` what each `lookup` would have told them, in the same
# order (the tracker's counts are sums; the decision times are noted in order and written once).


cdef int flat_state_open(object state) except -1:
    cdef FlatState flat = <FlatState?>state
    flat.run_evictions = flat.evictions
    flat.run_re_prefilled = flat.re_prefilled
    flat._open_call()
    return 0


cdef int flat_state_lookup(object state, const int64_t* keys, Py_ssize_t n, Py_ssize_t* hits) except -1:
    cdef FlatState flat = <FlatState?>state
    cdef Py_ssize_t i, found = 0
    cdef int last = 0
    for i in range(n):
        last = flat.request_key(keys[i])
        found += last
    hits[0] = found
    return last


cdef int flat_state_close(object state) except -1:
    cdef FlatState flat = <FlatState?>state
    return flat._tell_records(flat.run_evictions, flat.run_re_prefilled)
