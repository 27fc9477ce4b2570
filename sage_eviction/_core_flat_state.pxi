# The flat cache with its policy's state in C: `FlatState` (sage_eviction/flat.py, `FlatCache`
# built with `int_keys=True`). Part of sage_eviction/_core.pyx, included after _core_flat.pxi.
#
# `flat_lookup` calls a policy through its C table, but over the policy's own Python containers,
# whose dict and set operations are most of the cost (docs/performance.md). Here the state is C
# arrays: the keys are int64 (the simulator's block keys are ints), held in an open-addressing
# table (key -> node, _core_i64map.pxi), the nodes in intrusive doubly linked lists (head:
# newest), the ghosts as FIFOs of keys (_core_flat_lists.pxi), and the re-prefill tracker's
# evicted keys in a `KeySet` (_core_keyset.pxi: a trace's dense ids as bits, other ints in a
# table). The policies whose whole decision is a place in one list (lru, fifo, mru, filo, sieve),
# the adaptive queues (s3fifo, arc) and belady run here: `FlatCache.request` per key, line for
# line, with each policy's Python hooks as the reference (tests/test_flat_state.py runs both).

from libc.stdint cimport int32_t, int64_t
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
    K_S3FIFO = 5
    K_ARC = 6
    K_BELADY = 7

cdef int _S3_SMALL = 0  # s3fifo's queues
cdef int _S3_MAIN = 1
cdef unsigned char _S3_MAX_FREQ = 3
cdef int _T1 = 0  # arc's lists
cdef int _T2 = 1



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


cdef dict _state_kinds = None  # the policy classes whose state runs here -> their kind


cdef dict _kinds():
    global _state_kinds
    if _state_kinds is None:
        from sage_eviction.policies.arc import ARCPolicy
        from sage_eviction.policies.belady import BeladyPolicy
        from sage_eviction.policies.fifo import FIFOPolicy
        from sage_eviction.policies.filo import FILOPolicy
        from sage_eviction.policies.lru import LRUPolicy
        from sage_eviction.policies.mru import MRUPolicy
        from sage_eviction.policies.s3fifo import S3FIFOPolicy
        from sage_eviction.policies.sieve import SIEVEPolicy

        _state_kinds = {LRUPolicy: K_LRU, FIFOPolicy: K_FIFO, MRUPolicy: K_MRU, FILOPolicy: K_FILO,
                        SIEVEPolicy: K_SIEVE, S3FIFOPolicy: K_S3FIFO, ARCPolicy: K_ARC,
                        BeladyPolicy: K_BELADY}
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
    return kind != K_BELADY or (policy.has_strict_future and policy.position == 0)


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
    cdef KeySet evicted  # the keys evicted and not requested since (a trace's dense ids as bits)
    cdef int64_t* node_key
    cdef int32_t* newer  # toward the head (the newest)
    cdef int32_t* older  # toward the tail (the oldest)
    cdef unsigned char* bits  # sieve's visited bit; s3fifo's frequency (0..3)
    cdef unsigned char* where  # s3fifo's queue of the node (_SMALL or _MAIN)
    cdef Ends q[2]  # the list (s3fifo: its small queue), and s3fifo's main queue
    cdef int32_t hand  # sieve's hand, -1: the next sweep starts at the tail
    # s3fifo and arc (the methods below): the sizes of the two queues (s3fifo: small and
    # main; arc: T1 and T2), s3fifo's sizes and threshold, arc's target p, a ghost hit that
    # `prepare_insert` saw (arc: from B1 = 1 or B2 = 2), the ghosts (s3fifo's G; arc's B1, B2)
    cdef Py_ssize_t n_small, n_main, small_size, main_size
    cdef int move_threshold, pending_ghost
    cdef bint has_evicted, pending_replace
    cdef double p
    cdef Ghosts ghosts, ghosts2
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
        self.node_key = NULL
        self.newer = self.older = NULL
        self.bits = self.where = NULL
        self.lat_ring = NULL
        _ghosts_clear(&self.ghosts)
        _ghosts_clear(&self.ghosts2)
        _far_clear(&self.far)

    def __init__(self, policy, Py_ssize_t capacity, *, reprefill=None, latency=None,
                 bint record_victims=False):
        if not flat_state_runs(policy):
            raise TypeError(f"policy {type(policy).__qualname__} has no state in C (those that do: "
                            f"{', '.join(flat_state_policies())}; belady with its whole future set, "
                            f"strict, unread)")
        kind = _kinds()[type(policy)]
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
        self.node_key = <int64_t*>malloc(capacity * sizeof(int64_t))
        self.newer = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.older = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.bits = <unsigned char*>calloc(capacity, 1)
        self.where = <unsigned char*>calloc(capacity, 1)
        if (self.node_key == NULL or self.newer == NULL or self.older == NULL or self.bits == NULL
                or self.where == NULL):
            raise MemoryError()
        self.q[0].head = self.q[0].tail = self.q[1].head = self.q[1].tail = self.hand = -1
        if kind == K_S3FIFO:
            self.small_size = policy._small_size
            self.main_size = policy._main_size
            self.move_threshold = policy.move_threshold
            _ghosts_init(&self.ghosts, policy._ghost_size)
        elif kind == K_ARC:  # the directory keeps |B1| <= c and |B1| + |B2| <= 2c: never full
            _ghosts_init(&self.ghosts, 2 * capacity + 1)
            _ghosts_init(&self.ghosts2, 2 * capacity + 1)
        elif kind == K_BELADY:
            self.future = policy._future
            self.next_pos = policy._next_pos
            self.never = policy._never
            _far_init(&self.far, capacity)
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
        free(self.node_key)
        free(self.newer)
        free(self.older)
        free(self.bits)
        free(self.where)
        free(self.lat_ring)
        _ghosts_free(&self.ghosts)
        _ghosts_free(&self.ghosts2)
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
        """The held keys from the tail (the oldest place in the list) to the head (s3fifo: its
        small queue's, then its main queue's)."""
        cdef list out = []
        cdef int32_t node
        if self.kind == K_BELADY:  # no list: the heap's nodes, in heap order
            return [self.node_key[self.far.heap[i]] for i in range(self.far.size)]
        for queue in range(2):
            node = self.q[queue].tail
            while node != -1:
                out.append(self.node_key[node])
                node = self.newer[node]
        return out

    # ---- the list ---------------------------------------------------------------------------------

    cdef inline void _link(self, int queue, int32_t node) noexcept:
        _link_head(self.newer, self.older, &self.q[queue], node)

    cdef inline void _unlink_from(self, int queue, int32_t node) noexcept:
        if self.hand == node:  # sieve: a hand resting on a leaving entry moves to its newer one
            self.hand = self.newer[node]
        _unlink(self.newer, self.older, &self.q[queue], node)

    # ---- the policies ---------------------------------------------------------------------------

    cdef inline void _hit(self, int32_t node) noexcept:
        # the policy's access: lru and mru move the entry to the head (newest tick), sieve sets
        # its bit, s3fifo counts up to 3, fifo and filo change nothing
        if self.kind == K_LRU or self.kind == K_MRU:
            if node != self.q[0].head:
                self._unlink_from(0, node)
                self._link(0, node)
        elif self.kind == K_SIEVE:
            self.bits[node] = 1
        elif self.kind == K_S3FIFO:
            self._s3fifo_hit(node)
        elif self.kind == K_ARC:
            self._arc_hit(node)
        elif self.kind == K_BELADY:
            self.pushes += 1
            _far_set(&self.far, node, self.incoming, self.pushes, True)

    cdef int32_t _pop_victim(self) except -1:
        # the policy's `_pop_victim` (the cache is full, so a queue is not empty): the victim's
        # node, out of its queue and of the index
        cdef int32_t node
        if self.kind == K_S3FIFO:
            node = self._s3fifo_victim()
        elif self.kind == K_ARC:
            node = self._arc_victim()
        elif self.kind == K_BELADY:
            node = _far_pop(&self.far)
        else:
            if self.kind == K_MRU or self.kind == K_FILO:
                node = self.q[0].head
            elif self.kind == K_SIEVE:
                node = self.hand if self.hand != -1 else self.q[0].tail
                while self.bits[node]:
                    self.bits[node] = 0
                    node = self.newer[node] if self.newer[node] != -1 else self.q[0].tail
                self.hand = self.newer[node]
            else:
                node = self.q[0].tail
            self._unlink_from(0, node)
        _map_del(&self.index, self.node_key[node])
        return node

    cdef int _admit(self, int32_t node) except -1:
        # the policy's `_on_insert` for a new node (its key set); s3fifo picks its queue
        cdef int queue = 0
        self.bits[node] = 0
        if self.kind == K_S3FIFO:
            queue = self._s3fifo_queue_for_new()
        elif self.kind == K_ARC:
            queue = self._arc_queue_for_new()
        elif self.kind == K_BELADY:  # in the heap by its next use, in no list
            self.pushes += 1
            _far_set(&self.far, node, self.incoming, self.pushes, False)
            return 0
        self.where[node] = queue
        self._link(queue, node)
        return 0

    # ---- S3-FIFO (s3fifo.py: _on_insert, _pop_victim, _evict_small, _evict_main) -------------

    cdef inline void _s3fifo_hit(self, int32_t node) noexcept:
        if self.bits[node] < _S3_MAX_FREQ:
            self.bits[node] += 1

    cdef int _s3fifo_queue_for_new(self) except -1:
        # the ghost hit that `prepare_insert` saw, or the warm-up rule, sends it to main
        cdef bint to_main = self.pending_ghost != 0
        self.pending_ghost = 0
        if not to_main and not self.has_evicted and self.n_small >= self.small_size:
            to_main = True
        if to_main:
            self.n_main += 1
            return _S3_MAIN
        self.n_small += 1
        return _S3_SMALL

    cdef int32_t _s3fifo_evict_small(self) except -2:
        # the small queue's tail, moving the frequent ones to main; -1 when it empties first
        cdef int32_t node
        cdef int64_t key
        while self.q[_S3_SMALL].tail != -1:
            node = self.q[_S3_SMALL].tail
            self._unlink_from(_S3_SMALL, node)
            self.n_small -= 1
            if self.bits[node] >= self.move_threshold:
                self.bits[node] = 0
                self.where[node] = _S3_MAIN
                self.n_main += 1
                self._link(_S3_MAIN, node)
                continue
            key = self.node_key[node]
            if self.ghosts.capacity > 0 and _map_get(&self.ghosts.index, key) == _ABSENT:
                _ghosts_push(&self.ghosts, key)
            return node
        return -1

    cdef int32_t _s3fifo_evict_main(self) noexcept:
        # the main queue's tail; one hit or more goes back to the head with one fewer
        cdef int32_t node
        while True:
            node = self.q[_S3_MAIN].tail
            self._unlink_from(_S3_MAIN, node)
            if self.bits[node] >= 1:
                self.bits[node] -= 1
                self._link(_S3_MAIN, node)
                continue
            self.n_main -= 1
            return node

    cdef int32_t _s3fifo_victim(self) except -1:
        cdef int32_t node
        self.has_evicted = True
        while True:
            if self.q[_S3_MAIN].head != -1 and (self.n_main > self.main_size or self.q[_S3_SMALL].head == -1):
                return self._s3fifo_evict_main()
            if self.q[_S3_SMALL].head != -1:
                node = self._s3fifo_evict_small()
                if node != -1:
                    return node
                continue  # everything in the small queue moved to main
            return self._s3fifo_evict_main()

    # ---- ARC (sage_eviction/policies/arc.py: prepare_insert, _on_insert, _on_access, _pop_victim,
    # _replace): T1 and T2 are the two lists (head: MRU), B1 and B2 the two ghost FIFOs

    cdef inline void _arc_hit(self, int32_t node) noexcept:
        # case I: to the MRU end of T2
        if self.where[node] == _T1:
            self.where[node] = _T2
            self.n_small -= 1
            self.n_main += 1
            self._unlink_from(_T1, node)
            self._link(_T2, node)
        elif node != self.q[_T2].head:
            self._unlink_from(_T2, node)
            self._link(_T2, node)

    cdef void _arc_adapt(self, int ghost) noexcept:
        cdef double b1 = <double>_ghosts_len(&self.ghosts)
        cdef double b2 = <double>_ghosts_len(&self.ghosts2)
        if ghost == 1:
            self.p = min(self.p + max(b2 / b1, 1.0), <double>self.capacity)
        else:
            self.p = max(self.p - max(b1 / b2, 1.0), 0.0)

    cdef int _arc_prepare(self, int64_t key) except -1:
        # cases II and III seen before the evictions: p adapts, the ghost leaves its list, and the
        # next eviction is the hit's REPLACE
        if _map_get(&self.ghosts.index, key) != _ABSENT:
            self._arc_adapt(1)
            _ghosts_pop(&self.ghosts, key)
            self.pending_ghost = 1
        elif _map_get(&self.ghosts2.index, key) != _ABSENT:
            self._arc_adapt(2)
            _ghosts_pop(&self.ghosts2, key)
            self.pending_ghost = 2
        else:
            self.pending_ghost = 0
        self.pending_replace = self.pending_ghost != 0
        return 0

    cdef int _arc_queue_for_new(self) except -1:
        # a ghost hit enters T2; a new key T1, the ghost lists trimmed to the directory's bounds
        cdef int ghost = self.pending_ghost
        cdef Py_ssize_t c = self.capacity
        cdef Py_ssize_t b1 = _ghosts_len(&self.ghosts)
        cdef Py_ssize_t b2 = _ghosts_len(&self.ghosts2)
        self.pending_ghost = 0
        self.pending_replace = False
        if ghost:
            self.n_main += 1
            return _T2
        if self.n_small + b1 >= c and b1:
            _ghosts_pop(&self.ghosts, self.ghosts.key[self.ghosts.ends.tail])
        elif self.n_small + self.n_main + b1 + b2 >= 2 * c and b2:
            _ghosts_pop(&self.ghosts2, self.ghosts2.key[self.ghosts2.ends.tail])
        self.n_small += 1
        return _T1

    cdef int32_t _arc_replace(self, bint in_b2) except -1:
        # REPLACE: the LRU entry of T1 or T2 leaves for its ghost list
        cdef int32_t node
        cdef double n1 = <double>self.n_small
        if self.q[_T1].head != -1 and (n1 > self.p or (in_b2 and n1 == self.p) or self.q[_T2].head == -1):
            node = self.q[_T1].tail
            self._unlink_from(_T1, node)
            self.n_small -= 1
            _ghosts_push(&self.ghosts, self.node_key[node])
        else:
            node = self.q[_T2].tail
            self._unlink_from(_T2, node)
            self.n_main -= 1
            _ghosts_push(&self.ghosts2, self.node_key[node])
        return node

    cdef int32_t _arc_victim(self) except -1:
        cdef int32_t node
        cdef Py_ssize_t c = self.capacity
        cdef Py_ssize_t b1 = _ghosts_len(&self.ghosts)
        cdef Py_ssize_t b2 = _ghosts_len(&self.ghosts2)
        if self.pending_replace:  # cases II and III: the ghost hit's REPLACE
            self.pending_replace = False
            return self._arc_replace(self.pending_ghost == 2)
        if self.n_small + b1 >= c:  # case IV.A: L1 holds c keys
            if self.n_small >= c and self.q[_T1].head != -1:
                node = self.q[_T1].tail  # T1 alone is full: its LRU block leaves without a ghost
                self._unlink_from(_T1, node)
                self.n_small -= 1
                return node
            if b1:
                _ghosts_pop(&self.ghosts, self.ghosts.key[self.ghosts.ends.tail])
        elif self.n_small + self.n_main + b1 + b2 >= 2 * c and b2:  # case IV.B
            _ghosts_pop(&self.ghosts2, self.ghosts2.key[self.ghosts2.ends.tail])
        return self._arc_replace(False)

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
        self.requests += 1
        if self.kind == K_BELADY:
            self._belady_consume(key)
        found = _map_get(&self.index, key)
        if found != _ABSENT:
            self._hit(<int32_t>found)
            self.hits += 1
            return 1
        if self.tracker is not None and self.evicted._discard_int(key):
            self.re_prefilled += 1
        if self.kind == K_S3FIFO:  # its prepare_insert: out of the ghosts before the evictions
            self.pending_ghost = _ghosts_pop(&self.ghosts, key)
        elif self.kind == K_ARC:
            self._arc_prepare(key)
        if self.held >= self.capacity:
            self._evict_into(&node)
        else:
            node = <int32_t>self.held
            self.held += 1
        self.node_key[node] = key
        self._admit(node)
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
