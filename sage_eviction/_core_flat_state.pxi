# The flat cache with its policy's state in C: `FlatState` (sage_eviction/flat.py, `FlatCache`
# built with `int_keys=True`). Part of sage_eviction/_core.pyx, included after _core_flat.pxi.
#
# `flat_lookup` calls a policy through its C table, but over the policy's own Python containers,
# whose dict and set operations are most of the cost (docs/performance.md). Here the state is C
# arrays: the keys are int64 (the simulator's block keys are ints), held in an open-addressing
# table (key -> node), the nodes in an intrusive doubly linked list (head: newest), and the
# re-prefill tracker's evicted keys in a second table. The policies whose whole decision is a
# place in that list (lru, fifo, mru, filo, sieve) run here; `FlatCache.request` per key, line for
# line, with each policy's Python hooks as the reference (tests/test_flat_state.py runs both).

from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc


cdef extern from "Python.h":
    long long PyLong_AsLongLong(object) except? -1
    object PyNumber_Index(object)


cdef enum _Kind:
    K_LRU = 0
    K_FIFO = 1
    K_MRU = 2
    K_FILO = 3
    K_SIEVE = 4

cdef int64_t _FREE = INT64_MIN  # a free slot's key; the key INT64_MIN itself is kept aside
cdef int64_t _ABSENT = -1  # what a lookup of a missing key gives (every value is >= 0)


cdef extern from *:
    """
    #if defined(__x86_64__) || defined(__i386__)
    #include <x86intrin.h>
    static inline unsigned long long sage_ticks(void) { return __rdtsc(); }
    #define SAGE_TICKS_ARE_CYCLES 1
    #else
    #include <time.h>
    static inline unsigned long long sage_ticks(void) {
        struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
        return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
    }
    #define SAGE_TICKS_ARE_CYCLES 0
    #endif
    """
    unsigned long long sage_ticks() noexcept nogil
    int SAGE_TICKS_ARE_CYCLES


cdef double _seconds_per_tick = 0.0


cdef double _tick_seconds():
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


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: block ids are often consecutive, and linear probing needs spread
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef struct I64Map:
    # int64 keys (-> int64 values >= 0 when `vals` is not NULL; a set without), open addressing
    # with linear probing and backward-shift deletion (no tombstones: a long run of inserts and
    # deletes keeps its probe lengths). A set costs 8 bytes a slot, a map 16.
    int64_t* keys  # _FREE: a free slot
    int64_t* vals
    Py_ssize_t mask
    Py_ssize_t size
    bint holds_min  # the key INT64_MIN (which marks free slots) is held
    int64_t min_val


cdef int _map_init(I64Map* m, Py_ssize_t slots, bint with_values) except -1:
    cdef Py_ssize_t n = 16
    cdef Py_ssize_t i
    while n < slots:
        n <<= 1
    m.keys = <int64_t*>malloc(n * sizeof(int64_t))
    m.vals = <int64_t*>malloc(n * sizeof(int64_t)) if with_values else NULL
    if m.keys == NULL or (with_values and m.vals == NULL):
        _map_free(m)
        raise MemoryError()
    for i in range(n):
        m.keys[i] = _FREE
    m.mask = n - 1
    m.size = 0
    m.holds_min = False
    m.min_val = _ABSENT
    return 0


cdef void _map_free(I64Map* m) noexcept:
    free(m.keys)
    free(m.vals)
    m.keys = m.vals = NULL


cdef inline Py_ssize_t _map_slot(I64Map* m, int64_t key) noexcept nogil:
    # the slot holding `key` (not INT64_MIN), or the free slot where it would go
    cdef Py_ssize_t i = <Py_ssize_t>(_mix(<uint64_t>key) & <uint64_t>m.mask)
    while m.keys[i] != _FREE and m.keys[i] != key:
        i = (i + 1) & m.mask
    return i


cdef inline int64_t _map_get(I64Map* m, int64_t key) noexcept nogil:
    # the value of `key` (0 for a key of a set), or _ABSENT
    cdef Py_ssize_t i
    if key == _FREE:
        return m.min_val if m.holds_min else _ABSENT
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        return _ABSENT
    return m.vals[i] if m.vals != NULL else 0


cdef int _map_grow(I64Map* m) except -1:
    cdef I64Map old = m[0]
    cdef Py_ssize_t i, j
    _map_init(m, (old.mask + 1) * 2, old.vals != NULL)
    for i in range(old.mask + 1):
        if old.keys[i] != _FREE:
            j = _map_slot(m, old.keys[i])
            m.keys[j] = old.keys[i]
            if m.vals != NULL:
                m.vals[j] = old.vals[i]
    m.size = old.size
    m.holds_min = old.holds_min
    m.min_val = old.min_val
    _map_free(&old)
    return 0


cdef int _map_put(I64Map* m, int64_t key, int64_t val) except -1:
    cdef Py_ssize_t i
    if key == _FREE:
        m.size += not m.holds_min
        m.holds_min = True
        m.min_val = val
        return 0
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        if (m.size + 1) * 4 > (m.mask + 1) * 3:  # keep the load under 3/4
            _map_grow(m)
            i = _map_slot(m, key)
        m.size += 1
        m.keys[i] = key
    if m.vals != NULL:
        m.vals[i] = val
    return 0


cdef bint _map_del(I64Map* m, int64_t key) noexcept nogil:
    # remove `key`; whether it was there. The entries after it in its run move back into the
    # hole when their home slot is not cyclically between the hole and where they sit.
    cdef Py_ssize_t i, j, home
    if key == _FREE:
        if not m.holds_min:
            return False
        m.holds_min = False
        m.size -= 1
        return True
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        return False
    j = i
    while True:
        j = (j + 1) & m.mask
        if m.keys[j] == _FREE:
            break
        home = <Py_ssize_t>(_mix(<uint64_t>m.keys[j]) & <uint64_t>m.mask)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            m.keys[i] = m.keys[j]
            if m.vals != NULL:
                m.vals[i] = m.vals[j]
            i = j
    m.keys[i] = _FREE
    m.size -= 1
    return True


cdef inline int64_t _as_key(object key) except? -1:
    # an int key as int64, as a dict would find it (a bool or an int-like object by its index);
    # a float, a string, a tuple: TypeError; beyond int64: OverflowError
    if PyLong_CheckExact(key):
        return PyLong_AsLongLong(key)
    return PyLong_AsLongLong(PyNumber_Index(key))


cdef dict _state_kinds = None  # the policy classes whose state runs here -> their kind


cdef dict _kinds():
    global _state_kinds
    if _state_kinds is None:
        from sage_eviction.policies.fifo import FIFOPolicy
        from sage_eviction.policies.filo import FILOPolicy
        from sage_eviction.policies.lru import LRUPolicy
        from sage_eviction.policies.mru import MRUPolicy
        from sage_eviction.policies.sieve import SIEVEPolicy

        _state_kinds = {LRUPolicy: K_LRU, FIFOPolicy: K_FIFO, MRUPolicy: K_MRU, FILOPolicy: K_FILO,
                        SIEVEPolicy: K_SIEVE}
    return _state_kinds


def flat_state_policies():
    """The names of the built-in policies a `FlatState` runs with its state in C."""
    return sorted(cls.name for cls in _kinds())


cdef class FlatState:
    """A flat cache of `capacity` blocks with int64 keys, its policy's state in C.

    For an empty policy of one of `flat_state_policies()` (its exact class, built for the
    compiled core), else TypeError. `request` and `lookup` are `FlatCache`'s, the re-prefill
    tracker's counts and the latency record updated as its loop updates them; the tracker's
    evicted keys are kept here (`evicted_waiting`), not in its set. `victims`, when asked for, is
    every victim in order (the differential tests compare it).
    """

    cdef int kind
    cdef readonly Py_ssize_t capacity, held, requests, hits, evictions, re_prefilled
    cdef readonly str policy_name
    cdef readonly list victims
    cdef I64Map index  # key -> node
    cdef I64Map evicted  # the keys evicted and not requested since -> 0
    cdef int64_t* node_key
    cdef int32_t* newer  # toward the head (the newest)
    cdef int32_t* older  # toward the tail (the oldest)
    cdef unsigned char* visited  # sieve's bits
    cdef int32_t head, tail, hand  # -1: none (hand: the next sweep starts at the tail)
    cdef object tracker, latency
    cdef double tick  # seconds a tick of `sage_ticks`
    # the decision times of this call, written into `latency` when it returns (`_flush_latency`):
    # the last `window` of them, their count, and the record's sum with them added
    cdef double* lat_ring
    cdef Py_ssize_t lat_window, lat_pending
    cdef double lat_total

    def __cinit__(self):
        self.index.keys = self.index.vals = NULL
        self.evicted.keys = self.evicted.vals = NULL
        self.node_key = NULL
        self.newer = self.older = NULL
        self.visited = NULL
        self.lat_ring = NULL

    def __init__(self, policy, Py_ssize_t capacity, *, reprefill=None, latency=None,
                 bint record_victims=False):
        kind = _kinds().get(type(policy))
        if kind is None or getattr(policy, "_compiled", False) is not True:
            raise TypeError(f"policy {type(policy).__qualname__} has no state in C "
                            f"(those that do: {', '.join(flat_state_policies())})")
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
        _map_init(&self.evicted, 1024, False)
        self.node_key = <int64_t*>malloc(capacity * sizeof(int64_t))
        self.newer = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.older = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.visited = <unsigned char*>calloc(capacity, 1)
        if self.node_key == NULL or self.newer == NULL or self.older == NULL or self.visited == NULL:
            raise MemoryError()
        self.head = self.tail = self.hand = -1
        self.tracker = reprefill
        self.latency = latency
        self.tick = _tick_seconds() if latency is not None else 0.0
        if latency is not None:
            self.lat_window = latency.window
            self.lat_ring = <double*>malloc(self.lat_window * sizeof(double))
            if self.lat_ring == NULL:
                raise MemoryError()
        self.victims = [] if record_victims else None

    def __dealloc__(self):
        _map_free(&self.index)
        _map_free(&self.evicted)
        free(self.node_key)
        free(self.newer)
        free(self.older)
        free(self.visited)
        free(self.lat_ring)

    def __reduce__(self):
        raise TypeError("a FlatState's policy lives in C memory: it cannot be pickled")

    def __len__(self):
        return self.held

    def __contains__(self, key):
        return _map_get(&self.index, _as_key(key)) != _ABSENT

    @property
    def evicted_waiting(self):
        """Keys evicted and not requested since (the re-prefill tracker's set, kept here)."""
        return self.evicted.size

    def keys(self):
        """The held keys from the tail (the oldest place in the list) to the head."""
        cdef list out = []
        cdef int32_t node = self.tail
        while node != -1:
            out.append(self.node_key[node])
            node = self.newer[node]
        return out

    # ---- the list -------------------------------------------------------------------------------

    cdef inline void _link_head(self, int32_t node) noexcept:
        self.newer[node] = -1
        self.older[node] = self.head
        if self.head == -1:
            self.tail = node
        else:
            self.newer[self.head] = node
        self.head = node

    cdef inline void _unlink(self, int32_t node) noexcept:
        cdef int32_t newer = self.newer[node]
        cdef int32_t older = self.older[node]
        if self.hand == node:
            self.hand = newer
        if newer == -1:
            self.head = older
        else:
            self.older[newer] = older
        if older == -1:
            self.tail = newer
        else:
            self.newer[older] = newer

    # ---- the policies ---------------------------------------------------------------------------

    cdef inline void _hit(self, int32_t node) noexcept:
        # the policy's access: lru and mru move the entry to the head (newest tick), sieve sets
        # its bit, fifo and filo change nothing
        if self.kind == K_LRU or self.kind == K_MRU:
            if node != self.head:
                self._unlink(node)
                self._link_head(node)
        elif self.kind == K_SIEVE:
            self.visited[node] = 1

    cdef inline int32_t _pop_victim(self) noexcept:
        # the policy's `_pop_victim` (the cache is full, so the list is not empty)
        cdef int32_t node
        if self.kind == K_MRU or self.kind == K_FILO:
            node = self.head
        elif self.kind == K_SIEVE:
            node = self.hand if self.hand != -1 else self.tail
            while self.visited[node]:
                self.visited[node] = 0
                node = self.newer[node] if self.newer[node] != -1 else self.tail
            self.hand = self.newer[node]
        else:
            node = self.tail
        self._unlink(node)
        _map_del(&self.index, self.node_key[node])
        return node

    # ---- FlatCache.request ----------------------------------------------------------------------

    cdef int _evict_into(self, int32_t* node) except -1:
        # FlatCache._evict_one: the decision timed when there is a latency record
        cdef bint timed = self.latency is not None
        cdef unsigned long long start = sage_ticks() if timed else 0
        cdef int64_t victim
        node[0] = self._pop_victim()
        victim = self.node_key[node[0]]
        if timed:
            self._note_latency(<double>(sage_ticks() - start) * self.tick)
        if self.tracker is not None:
            _map_put(&self.evicted, victim, 0)
        if self.victims is not None:
            self.victims.append(victim)
        self.evictions += 1
        return 0

    cdef int request_key(self, int64_t key) except -1:
        # 1 for a hit, 0 for a miss (admitted)
        cdef int64_t found
        cdef int32_t node
        self.requests += 1
        found = _map_get(&self.index, key)
        if found != _ABSENT:
            self._hit(<int32_t>found)
            self.hits += 1
            return 1
        if self.tracker is not None and _map_del(&self.evicted, key):
            self.re_prefilled += 1
        if self.held >= self.capacity:
            self._evict_into(&node)
        else:
            node = <int32_t>self.held
            self.held += 1
        self.node_key[node] = key
        self.visited[node] = 0
        self._link_head(node)
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
