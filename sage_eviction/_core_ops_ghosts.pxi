# The C hooks of the policies with ghost lists: S3-FIFO (policies/s3fifo.py), ARC (policies/arc.py)
# and MQ (policies/mq.py). Part of sage_eviction/_core.pyx, after _core_ops.pxi, whose table,
# `hooked`, `register` and `_pop_end` they use.
#
# Each function mirrors the Python method named in its comment line for line, over the policy's
# own attributes (the same OrderedDicts, dicts and counters), so that the class's other methods
# (explain, entries, queue_of, ...) read what these wrote. `prepare_insert` stays a Python method
# (the radix core does not call it through the table); `_on_insert` here also takes the ghost hit
# itself when it was not called, as the Python hook does. Where the Python code calls
# `od.popitem(last=False)`, these call `_pop_end(od, False)`: the same key leaves the same
# ordered dict. The private helpers (`_adapt`, `_replace`, `_evict_small`, `_adjust`, ...) are
# mirrored here too, not called: the table is registered for the exact classes only, so no
# subclass override of them can be bypassed.

# The modules' "no pending key" sentinels (None is a valid key), read at registration.
cdef object _s3fifo_no_key = None
cdef object _arc_no_key = None
cdef object _mq_no_key = None

# ---- S3-FIFO (S3FIFOPolicy) -----------------------------------------------------------------------

DEF _S3_SMALL = 0
DEF _S3_MAIN = 1
DEF _S3_MAX_FREQ = 3


cdef int _s3fifo_on_insert(object policy, object key, object meta, bint evictable) except -1:
    # S3FIFOPolicy._on_insert
    cdef object pending = policy._pending_key
    cdef bint to_main
    if pending is not _s3fifo_no_key:
        policy._pending_key = _s3fifo_no_key
    if pending is not _s3fifo_no_key and pending == key:
        to_main = policy._pending_ghost
    else:
        to_main = policy._ghost.pop(key, _s3fifo_no_key) is not _s3fifo_no_key
    if not to_main and not policy._has_evicted and policy._n_small >= policy._small_size:
        to_main = True  # warm-up: S is full but the cache is not
    (<dict>policy._freq)[key] = 0
    if to_main:
        (<dict>policy._queue_of)[key] = _S3_MAIN
        policy._n_main += 1
        if evictable:
            policy._main[key] = None
    else:
        (<dict>policy._queue_of)[key] = _S3_SMALL
        policy._n_small += 1
        if evictable:
            policy._small[key] = None
    return 0


cdef int _s3fifo_on_access(object policy, object key, object meta) except -1:
    # S3FIFOPolicy._on_access
    cdef dict freqs = policy._freq
    freq = freqs[key]
    if freq < _S3_MAX_FREQ:
        freqs[key] = freq + 1
    return 0


cdef int _s3fifo_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    # S3FIFOPolicy._on_evictable
    queue = policy._small if (<dict>policy._queue_of)[key] == _S3_SMALL else policy._main
    if evictable:
        queue[key] = None
    else:
        del queue[key]
    return 0


cdef object _ops_s3fifo_evict_small(object policy):
    # S3FIFOPolicy._evict_small: S's tail, moving frequent entries to M; the sentinel when S
    # empties first
    small = policy._small
    cdef dict freq = policy._freq
    threshold = policy.move_threshold
    while small:
        key = _pop_end(small, False)
        policy._n_small -= 1
        if freq[key] >= threshold:
            freq[key] = 0
            (<dict>policy._queue_of)[key] = _S3_MAIN
            policy._n_main += 1
            policy._main[key] = None
            continue
        del freq[key]
        del (<dict>policy._queue_of)[key]
        ghost = policy._ghost
        if policy._ghost_size > 0 and key not in ghost:
            while len(ghost) >= policy._ghost_size:
                _pop_end(ghost, False)
            ghost[key] = None
        return key
    return _s3fifo_no_key


cdef object _ops_s3fifo_evict_main(object policy):
    # S3FIFOPolicy._evict_main: M's tail; an entry with frequency f >= 1 goes back to the head
    # with f - 1
    main = policy._main
    cdef dict freq = policy._freq
    while True:
        key = _pop_end(main, False)
        f = freq[key]
        if f >= 1:
            freq[key] = f - 1
            main[key] = None
            continue
        del freq[key]
        del (<dict>policy._queue_of)[key]
        policy._n_main -= 1
        return key


cdef object _s3fifo_pop_victim(object policy):
    # S3FIFOPolicy._pop_victim
    policy._has_evicted = True
    while True:
        if policy._main and (policy._n_main > policy._main_size or not policy._small):
            return _ops_s3fifo_evict_main(policy)
        if policy._small:
            key = _ops_s3fifo_evict_small(policy)
            if key is not _s3fifo_no_key:
                return key
            continue  # everything in S moved to M
        return _ops_s3fifo_evict_main(policy)


# ---- ARC (ARCPolicy) ------------------------------------------------------------------------------

cdef int _ops_arc_adapt(object policy, int ghost) except -1:
    # ARCPolicy._adapt. Python's `max(x, y)` keeps x unless y > x and `min(x, y)` keeps x unless
    # y < x: the same choices on the same doubles (b2 / b1 of two ints below 2**53 is the one
    # correctly rounded double Python's true division gives).
    cdef double b1 = len(policy._b1)
    cdef double b2 = len(policy._b2)
    cdef double p = policy._p
    cdef double step
    cdef double c
    if ghost == 1:
        step = b2 / b1
        if 1.0 > step:
            step = 1.0
        c = float(policy._c)
        p = p + step
        if c < p:
            p = c
    else:
        step = b1 / b2
        if 1.0 > step:
            step = 1.0
        p = p - step
        if 0.0 > p:
            p = 0.0
    policy._p = p
    return 0


cdef int _arc_on_insert(object policy, object key, object meta, bint evictable) except -1:
    # ARCPolicy._on_insert
    cdef object pending = policy._pending_key
    cdef int ghost
    if pending is not _arc_no_key:  # any insert ends what prepare_insert started
        policy._pending_key = _arc_no_key
        policy._pending_replace = False
    if pending is not _arc_no_key and pending == key:
        ghost = policy._pending_ghost
    elif key in policy._b1:
        _ops_arc_adapt(policy, 1)
        del policy._b1[key]
        ghost = 1
    elif key in policy._b2:
        _ops_arc_adapt(policy, 2)
        del policy._b2[key]
        ghost = 2
    else:
        ghost = 0
    if ghost:
        (<dict>policy._list_of)[key] = 2
        policy._n2 += 1
        if evictable:
            policy._t2[key] = None
        return 0
    # A new key enters L1 = T1 + B1: keep |L1| <= c and the directory <= 2c.
    c = policy._c
    b1 = policy._b1
    b2 = policy._b2
    if policy._n1 + len(b1) >= c and b1:
        _pop_end(b1, False)
    elif policy._n1 + policy._n2 + len(b1) + len(b2) >= 2 * c and b2:
        _pop_end(b2, False)
    (<dict>policy._list_of)[key] = 1
    policy._n1 += 1
    if evictable:
        policy._t1[key] = None
    return 0


cdef int _arc_on_access(object policy, object key, object meta) except -1:
    # ARCPolicy._on_access
    cdef dict list_of = policy._list_of
    if list_of[key] == 1:
        list_of[key] = 2
        policy._n1 -= 1
        policy._n2 += 1
        t1 = policy._t1
        if key in t1:
            del t1[key]
            policy._t2[key] = None
    else:
        t2 = policy._t2
        if key in t2:
            t2.move_to_end(key)
    return 0


cdef int _arc_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    # ARCPolicy._on_evictable
    lru = policy._t1 if (<dict>policy._list_of)[key] == 1 else policy._t2
    if evictable:
        lru[key] = None  # MRU end: it was in use until now
    else:
        del lru[key]
    return 0


cdef object _ops_arc_replace(object policy, bint in_b2):
    # ARCPolicy._replace: the paper's REPLACE
    t1 = policy._t1
    n1 = policy._n1
    if t1 and (n1 > policy._p or (in_b2 and n1 == policy._p) or not policy._t2):
        key = _pop_end(t1, False)
        policy._n1 = n1 - 1
        policy._b1[key] = None
    else:
        key = _pop_end(policy._t2, False)
        policy._n2 -= 1
        policy._b2[key] = None
    del (<dict>policy._list_of)[key]
    return key


cdef object _arc_pop_victim(object policy):
    # ARCPolicy._pop_victim
    if policy._pending_replace:  # cases II and III: the ghost hit's REPLACE
        policy._pending_replace = False
        return _ops_arc_replace(policy, policy._pending_ghost == 2)
    c = policy._c
    n1 = policy._n1
    b1 = policy._b1
    if n1 + len(b1) >= c:  # case IV.A: L1 holds c keys
        t1 = policy._t1
        if n1 >= c and t1:
            # T1 alone is full: its LRU block leaves without a ghost.
            key = _pop_end(t1, False)
            policy._n1 = n1 - 1
            del (<dict>policy._list_of)[key]
            return key
        if b1:
            _pop_end(b1, False)
    elif n1 + policy._n2 + len(b1) + len(policy._b2) >= 2 * c and policy._b2:  # case IV.B
        _pop_end(policy._b2, False)
    return _ops_arc_replace(policy, False)


# ---- MQ (MQPolicy) --------------------------------------------------------------------------------

cdef inline Py_ssize_t _mq_queue_num(object policy, object freq) except -1:
    # MQPolicy._queue_num: min(freq.bit_length() - 1, n_queues - 1), freq >= 1
    cdef Py_ssize_t top = policy._n_queues - 1
    cdef Py_ssize_t bits = freq.bit_length()
    return bits - 1 if bits - 1 < top else top


cdef int _mq_link(object policy, object key, Py_ssize_t queue, bint evictable) except -1:
    # MQPolicy._link
    (<dict>policy._queue_of)[key] = queue
    (<dict>policy._expire)[key] = policy._vtime + policy._lifetime
    if evictable:
        (<list>policy._queues)[queue][key] = None
    return 0


cdef int _mq_adjust(object policy) except -1:
    # MQPolicy._adjust: the paper's Adjust, at each tick of the virtual clock
    vtime = policy._vtime + 1
    policy._vtime = vtime
    cdef list queues = policy._queues
    cdef dict expire = policy._expire
    cdef Py_ssize_t k
    for k in range(1, policy._n_queues):
        queue = queues[k]
        if not queue:
            continue
        key = next(iter(queue))
        if expire[key] < vtime:
            del queue[key]
            queues[k - 1][key] = None
            (<dict>policy._queue_of)[key] = k - 1
            expire[key] = vtime + policy._lifetime
    return 0


cdef int _mq_on_insert(object policy, object key, object meta, bint evictable) except -1:
    # MQPolicy._on_insert
    pending = policy._pending_key
    if pending is not _mq_no_key and pending == key:
        remembered = policy._pending_freq
    else:
        remembered = policy._qout.pop(key, 0)
    policy._pending_key = _mq_no_key
    policy._pending_freq = 0
    freq = remembered + 1
    (<dict>policy._freq)[key] = freq
    _mq_link(policy, key, _mq_queue_num(policy, freq), evictable)
    return _mq_adjust(policy)


cdef int _mq_on_access(object policy, object key, object meta) except -1:
    # MQPolicy._on_access
    cdef dict freqs = policy._freq
    old = (<dict>policy._queue_of)[key]
    freq = freqs[key] + 1
    freqs[key] = freq
    cdef bint evictable = key in <set>policy._evictable
    if evictable:
        del (<list>policy._queues)[old][key]
    _mq_link(policy, key, _mq_queue_num(policy, freq), evictable)
    return _mq_adjust(policy)


cdef int _mq_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    # MQPolicy._on_evictable
    queue = (<list>policy._queues)[(<dict>policy._queue_of)[key]]
    if evictable:
        queue[key] = None  # MRU end: it was in use until now
    else:
        del queue[key]
    return 0


cdef object _mq_pop_victim(object policy):
    # MQPolicy._pop_victim, with _forget and _remember
    for queue in <list>policy._queues:
        if queue:
            key = _pop_end(queue, False)
            del (<dict>policy._queue_of)[key]
            del (<dict>policy._expire)[key]
            freq = (<dict>policy._freq).pop(key)
            if policy._qout_size > 0:
                qout = policy._qout
                if len(qout) >= policy._qout_size:
                    _pop_end(qout, False)
                qout[key] = freq
            return key
    raise AssertionError("unreachable: the base calls _pop_victim only with evictable entries")


cdef int _register_ghosts() except -1:
    global _s3fifo_no_key, _arc_no_key, _mq_no_key
    from sage_eviction.policies import arc, mq, s3fifo

    _s3fifo_no_key = s3fifo._NO_KEY
    _arc_no_key = arc._NO_KEY
    _mq_no_key = mq._NO_KEY
    register(s3fifo.S3FIFOPolicy, hooked(
        _s3fifo_on_insert, _s3fifo_on_access, _s3fifo_on_evictable, _s3fifo_pop_victim
    ))
    register(arc.ARCPolicy, hooked(_arc_on_insert, _arc_on_access, _arc_on_evictable, _arc_pop_victim))
    register(mq.MQPolicy, hooked(_mq_on_insert, _mq_on_access, _mq_on_evictable, _mq_pop_victim))
    return 0
