# The flat cache's lookup loop: `flat_lookup` (sage_eviction/flat.py, `FlatCache.lookup`).
# Part of sage_eviction/_core.pyx, which includes it after _core_ops.pxi (it calls the tables).
#
# `FlatCache.request` per key, line for line, in one call per request's keys: the policy through
# its C table when it has one (else its Python methods), the re-prefill tracker and the latency
# record updated over their own state (sage_eviction/metrics.py: `ReprefillTracker.on_request`
# and `on_evict`, `LatencyRecorder.record`), the cache's counters kept in C and written back
# when the loop ends or raises (what the Python loop would have left).

cdef inline int _reprefill_request(object tracker, object key) except -1:
    # ReprefillTracker.on_request
    if evicted_discard(tracker._evicted, key):
        tracker.re_prefilled += 1
    return 0


cdef inline int _reprefill_evict(object tracker, object key) except -1:
    # ReprefillTracker.on_evict
    tracker.evictions += 1
    evicted_add(tracker._evicted, key)
    return 0


cdef inline int _latency_record(object recorder, double seconds) except -1:
    # LatencyRecorder.record
    cdef list ring = recorder._ring
    cdef Py_ssize_t window = recorder.window
    cdef Py_ssize_t at
    recorder.count += 1
    recorder.total += seconds
    if len(ring) < window:
        ring.append(seconds)
    else:
        at = recorder._next
        ring[at] = seconds
        recorder._next = (at + 1) % window
    return 0


cdef class _FlatLoop:
    """One `flat_lookup` call's view of a FlatCache: its settings read once, its counters in C."""

    cdef object cache, policy, prepare, on_miss, on_evict, reprefill, latency
    cdef PolicyOps* ops
    cdef Py_ssize_t capacity, held, requests, hits, evictions

    def __init__(self, cache):
        self.cache = cache
        self.policy = cache.policy
        self.ops = ops_for(self.policy)
        self.prepare = cache._prepare
        self.on_miss = cache._on_miss
        self.on_evict = cache._on_evict
        self.reprefill = cache.reprefill
        self.latency = cache.latency
        self.capacity = cache.capacity
        self.held = cache._held
        self.requests = cache.requests
        self.hits = cache.hits
        self.evictions = cache.evictions

    cdef void write_back(self):
        cache = self.cache
        cache._held = self.held
        cache.requests = self.requests
        cache.hits = self.hits
        cache.evictions = self.evictions

    cdef bint request(self, object key) except -1:
        # FlatCache.request
        cdef object now
        self.requests += 1
        now = self.requests
        if self._holds(key):
            if self.ops != NULL:
                self.ops.access(self.ops, self.policy, key, now)
            else:
                self.policy.access(key, now)
            self.hits += 1
            return True
        if self.reprefill is not None:
            _reprefill_request(self.reprefill, key)
        if self.on_miss is not None:
            self.on_miss(key)
        if self.prepare is not None:
            self.prepare(key)
        if self.held >= self.capacity:
            self._evict_one()
        else:
            self.held += 1
        if self.ops != NULL:
            self.ops.insert(self.ops, self.policy, key, None, True)
        else:
            self.policy.insert(key)
        return False

    cdef inline bint _holds(self, object key) except -1:
        # `key in policy`: EvictionPolicy.__contains__ (its metadata) for a policy with a table
        if self.ops != NULL:
            return key in <dict>self.policy._meta
        return key in self.policy

    cdef int _evict_one(self) except -1:
        # FlatCache._evict_one
        cdef bint timed = self.on_evict is not None or self.latency is not None
        cdef double start = monotonic_seconds() if timed else 0.0
        cdef double seconds
        cdef bint found = True
        if self.ops != NULL:
            victim = self.ops.evict_one(self.ops, self.policy, &found)
        else:
            victims = self.policy.evict(1)
            found = bool(victims)
            victim = victims[0] if found else None
        seconds = monotonic_seconds() - start if timed else 0.0
        if not found:
            raise PolicyStateError(f"flat cache full ({self.capacity} blocks) and nothing evictable")
        if self.latency is not None:
            _latency_record(self.latency, seconds)
        if self.reprefill is not None:
            _reprefill_evict(self.reprefill, victim)
        if self.on_evict is not None:
            self.on_evict(victim, seconds)
        self.evictions += 1
        return 0


def flat_lookup(cache, keys):
    """`FlatCache.lookup(keys)`: `request` each key in order; (hits, whether the last key hit)."""
    cdef _FlatLoop loop = _FlatLoop(cache)
    cdef Py_ssize_t hits = 0
    cdef bint last = False
    try:
        for key in keys:
            last = loop.request(key)
            hits += last
    finally:
        loop.write_back()
    return hits, last
