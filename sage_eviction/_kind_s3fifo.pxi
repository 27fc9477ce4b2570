# S3-FIFO in the simulator's radix loop (sage_eviction/policies/s3fifo.py, `S3FIFOPolicy`, is the
# reference: each function below is its hook of the same name). Part of
# engine_adapter/sim/_radix_run.pyx, which includes the core's lists (_core_flat_lists.pxi: the
# intrusive lists `Ends` and the key FIFO `Ghosts`) before it.
#
# The small queue S and the main queue M are lists over the tree's nodes (head: the newest) that
# hold only the evictable entries, as the Python class's OrderedDicts do: a node that stops being
# evictable is unlinked but stays counted in its queue's size and keeps its frequency (hits on it
# count), and one that becomes evictable again is linked at its queue's head. The ghost queue G
# remembers evicted keys (int64) in arrival order, dropping its oldest when full.

cdef enum:
    S3_SMALL = 0  # the node's queue (`S3State.where`), the index of its list and count
    S3_MAIN = 1
    S3_MAX_FREQ = 3  # the frequency's cap (a 2-bit clock in M)


cdef struct S3State:
    uint8_t* freq  # by node: 0..S3_MAX_FREQ
    uint8_t* where  # by node: S3_SMALL or S3_MAIN
    int32_t* newer  # by node: the links of its queue's list (evictable nodes only)
    int32_t* older
    Ends q[2]  # S's and M's evictable nodes
    Py_ssize_t n[2]  # S's and M's sizes, pinned nodes included (`_n_small`, `_n_main`)
    Py_ssize_t small_size, main_size
    int64_t threshold  # `move_threshold`
    bint has_evicted  # the warm-up rule holds until the first eviction
    Ghosts ghost
    # `prepare_insert`'s key (while `has_pending`) and whether it was a ghost
    int64_t pending_key
    bint has_pending, pending_ghost


cdef inline S3State* _s3(Nodes* t) noexcept:
    return <S3State*>t.pol


cdef int _s3fifo_sizes(S3State* s, object policy) except -1:
    # the queues' sizes as `S3FIFOPolicy.__init__` computes them, with the same Python operations
    # (so the float products truncate alike); the ghost queue's is returned through `s.ghost`
    capacity = policy.capacity
    s.small_size = max(1, int(capacity * policy.small_ratio))
    s.main_size = capacity - s.small_size
    s.threshold = policy.move_threshold
    return _ghosts_init(&s.ghost, int(capacity * policy.ghost_ratio))


cdef int _s3fifo_init(Nodes* t, object policy) except -1:
    cdef S3State* s = <S3State*>malloc(sizeof(S3State))
    cdef Py_ssize_t n = t.capacity if t.capacity > 0 else 1
    if s == NULL:
        raise MemoryError()
    s.freq = s.where = NULL
    s.newer = s.older = NULL
    _ghosts_clear(&s.ghost)
    t.pol = s  # from here `_s3fifo_free` frees what was allocated, should the rest fail
    s.freq = <uint8_t*>malloc(n * sizeof(uint8_t))
    s.where = <uint8_t*>malloc(n * sizeof(uint8_t))
    s.newer = <int32_t*>malloc(n * sizeof(int32_t))
    s.older = <int32_t*>malloc(n * sizeof(int32_t))
    if s.freq == NULL or s.where == NULL or s.newer == NULL or s.older == NULL:
        raise MemoryError()
    s.q[S3_SMALL].head = s.q[S3_SMALL].tail = -1
    s.q[S3_MAIN].head = s.q[S3_MAIN].tail = -1
    s.n[S3_SMALL] = s.n[S3_MAIN] = 0
    s.has_evicted = s.has_pending = s.pending_ghost = False
    return _s3fifo_sizes(s, policy)


cdef void _s3fifo_free(Nodes* t) noexcept:
    cdef S3State* s = _s3(t)
    free(s.freq)
    free(s.where)
    free(s.newer)
    free(s.older)
    _ghosts_free(&s.ghost)
    free(s)
    t.pol = NULL


cdef inline void _s3_link(S3State* s, int queue, int32_t node) noexcept:
    # `queue[key] = None`: the node at its queue's head (the newest)
    _link_head(s.newer, s.older, &s.q[queue], node)


cdef inline void _s3_unlink(S3State* s, int queue, int32_t node) noexcept:
    _unlink(s.newer, s.older, &s.q[queue], node)


cdef int _s3fifo_prepare(Nodes* t, int64_t key) except -1:
    # `prepare_insert`: the key out of G now, so that the evictions before its insert cannot
    # push it out; the insert then puts it in M
    cdef S3State* s = _s3(t)
    s.pending_key = key
    s.has_pending = True
    s.pending_ghost = _ghosts_pop(&s.ghost, key) != 0
    return 0


cdef int _s3fifo_insert(Nodes* t, int32_t node, bint evictable) except -1:
    # `_on_insert`: a ghost hit (seen by `prepare_insert` or now) goes to M, any other key to S,
    # except that before the first eviction, once S is full, new keys go to M
    cdef S3State* s = _s3(t)
    cdef bint to_main
    cdef int queue
    if s.has_pending and s.pending_key == t.key[node]:
        to_main = s.pending_ghost
    else:
        to_main = _ghosts_pop(&s.ghost, t.key[node]) != 0
    s.has_pending = False
    queue = S3_MAIN if to_main else S3_SMALL
    if queue == S3_SMALL and not s.has_evicted and s.n[S3_SMALL] >= s.small_size:
        queue = S3_MAIN  # warm-up: S is full but the cache is not
    s.freq[node] = 0
    s.where[node] = queue
    s.n[queue] += 1
    if evictable:
        _s3_link(s, queue, node)
    return 0


cdef int _s3fifo_access(Nodes* t, int32_t node) except -1:
    # `_on_access`: evictable or not, the frequency grows to its cap; nothing moves
    cdef S3State* s = _s3(t)
    if s.freq[node] < S3_MAX_FREQ:
        s.freq[node] += 1
    return 0


cdef int _s3fifo_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # `_on_evictable`: linked at its queue's head, or unlinked (still counted in the queue)
    cdef S3State* s = _s3(t)
    if evictable:
        _s3_link(s, s.where[node], node)
    else:
        _s3_unlink(s, s.where[node], node)
    return 0


cdef int32_t _s3fifo_evict_small(Nodes* t) except -2:
    # `_evict_small`: S's tail, moved to M's head (frequency 0) when hit enough and the next
    # tail tried, else the victim, its key into G; -1 when S empties first
    cdef S3State* s = _s3(t)
    cdef int32_t node
    cdef int64_t key
    while s.q[S3_SMALL].tail != -1:
        node = s.q[S3_SMALL].tail
        _s3_unlink(s, S3_SMALL, node)
        s.n[S3_SMALL] -= 1
        if s.freq[node] >= s.threshold:
            s.freq[node] = 0
            s.where[node] = S3_MAIN
            s.n[S3_MAIN] += 1
            _s3_link(s, S3_MAIN, node)
            continue
        key = t.key[node]
        if s.ghost.capacity > 0 and _map_get(&s.ghost.index, key) == _ABSENT:
            _ghosts_push(&s.ghost, key)  # drops G's oldest keys while full
        return node
    return -1


cdef int32_t _s3fifo_evict_main(Nodes* t) noexcept:
    # `_evict_main`: M's tail, back to the head with frequency f - 1 while f >= 1 (the caller
    # has M's list non-empty, so the loop ends: each turn lowers a frequency or returns)
    cdef S3State* s = _s3(t)
    cdef int32_t node
    while True:
        node = s.q[S3_MAIN].tail
        _s3_unlink(s, S3_MAIN, node)
        if s.freq[node] >= 1:
            s.freq[node] -= 1
            _s3_link(s, S3_MAIN, node)
            continue
        s.n[S3_MAIN] -= 1
        return node


cdef int32_t _s3fifo_pop(Nodes* t) except -2:
    # `_pop_victim`: from M when it holds more than its share or S has nothing evictable, else
    # from S; when S empties without a victim (all moved to M), M is tried again
    cdef S3State* s = _s3(t)
    cdef int32_t node
    s.has_evicted = True
    while True:
        if s.q[S3_MAIN].tail != -1 and (s.n[S3_MAIN] > s.main_size or s.q[S3_SMALL].tail == -1):
            return _s3fifo_evict_main(t)
        if s.q[S3_SMALL].tail == -1:
            raise RuntimeError("the s3fifo policy has no evictable node")
        node = _s3fifo_evict_small(t)
        if node >= 0:
            return node
