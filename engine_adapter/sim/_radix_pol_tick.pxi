# The tick policies of the simulator's radix loop: lru, fifo, mru and filo
# (sage_eviction/recency.py, `RecencyPolicy`), whose whole order is one logical tick per block:
# the clock of its insert, and of each hit where hits count (lru, mru), the oldest first (the
# newest for mru and filo). Part of engine_adapter/sim/_radix_run.pyx.
#
# Ticks are unique, so the order is a heap of (score, node) over the evictable nodes: a node that
# stops being evictable leaves its entry behind (skipped when it surfaces: the node is no longer
# evictable, or its score moved on with a hit), and the heap is rebuilt from its live entries when
# the stale ones outnumber them. `RecencyPolicy` keeps the same order in an OrderedDict with a
# side heap for keys that come back with an older tick.

cdef enum:
    TOUCH_ON_ACCESS = 1  # a hit gives the block the newest tick (lru, mru)
    NEWEST_FIRST = 2  # the newest tick goes first (mru, filo)


cdef struct TickState:
    int64_t* tick  # by node
    int64_t* h_score  # a binary min-heap of (score, node), with stale entries
    int32_t* h_node
    Py_ssize_t h_size, h_cap


cdef inline TickState* _ticks(Tree* t) noexcept:
    return <TickState*>t.pol


cdef int _tick_init(Tree* t) except -1:
    cdef TickState* s = <TickState*>malloc(sizeof(TickState))
    if s == NULL:
        raise MemoryError()
    t.pol = s
    s.h_cap = 64
    s.tick = <int64_t*>malloc(t.capacity * sizeof(int64_t) + 8)
    s.h_score = <int64_t*>malloc(s.h_cap * sizeof(int64_t))
    s.h_node = <int32_t*>malloc(s.h_cap * sizeof(int32_t))
    s.h_size = 0
    if s.tick == NULL or s.h_score == NULL or s.h_node == NULL:
        raise MemoryError()
    return 0


cdef void _tick_free(Tree* t) noexcept:
    cdef TickState* s = _ticks(t)
    free(s.tick)
    free(s.h_score)
    free(s.h_node)
    free(s)
    t.pol = NULL


cdef inline int64_t _score(Tree* t, int32_t node) noexcept:
    cdef int64_t tick = _ticks(t).tick[node]
    return -tick if t.flags & NEWEST_FIRST else tick


cdef inline bint _live(Tree* t, Py_ssize_t i) noexcept:
    # the entry still stands for its node: evictable, with the score it was pushed with
    cdef TickState* s = _ticks(t)
    return t.evictable[s.h_node[i]] == 1 and s.h_score[i] == _score(t, s.h_node[i])
cdef void _sift_up(TickState* s, Py_ssize_t i) noexcept:
    cdef int64_t score = s.h_score[i]
    cdef int32_t node = s.h_node[i]
    cdef Py_ssize_t up
    while i > 0:
        up = (i - 1) >> 1
        if s.h_score[up] <= score:
            break
        s.h_score[i], s.h_node[i] = s.h_score[up], s.h_node[up]
        i = up
    s.h_score[i], s.h_node[i] = score, node


cdef void _sift_down(TickState* s, Py_ssize_t i) noexcept:
    cdef int64_t score = s.h_score[i]
    cdef int32_t node = s.h_node[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= s.h_size:
            break
        if child + 1 < s.h_size and s.h_score[child + 1] < s.h_score[child]:
            child += 1
        if s.h_score[child] >= score:
            break
        s.h_score[i], s.h_node[i] = s.h_score[child], s.h_node[child]
        i = child
    s.h_score[i], s.h_node[i] = score, node


cdef void _heap_rebuild(Tree* t) noexcept:
    # only the live entries, heapified; a node's second live entry (the same score pushed again
    # after it left and came back without a hit) is dropped, as it would be when popped
    cdef TickState* s = _ticks(t)
    cdef Py_ssize_t i, kept = 0
    for i in range(s.h_size):
        if _live(t, i):
            t.evictable[s.h_node[i]] = 2  # kept once
            s.h_score[kept], s.h_node[kept] = s.h_score[i], s.h_node[i]
            kept += 1
    for i in range(kept):
        t.evictable[s.h_node[i]] = 1
    s.h_size = kept
    for i in range(kept // 2 - 1, -1, -1):
        _sift_down(s, i)


cdef int _heap_push(Tree* t, int32_t node) except -1:
    cdef TickState* s = _ticks(t)
    if s.h_size == s.h_cap:
        if s.h_size > 2 * t.num_evictable + 64:
            _heap_rebuild(t)
        if s.h_size == s.h_cap:
            s.h_score = <int64_t*>_resized(s.h_score, 2 * s.h_cap * sizeof(int64_t))
            s.h_node = <int32_t*>_resized(s.h_node, 2 * s.h_cap * sizeof(int32_t))
            s.h_cap *= 2
    s.h_score[s.h_size] = _score(t, node)
    s.h_node[s.h_size] = node
    s.h_size += 1
    _sift_up(s, s.h_size - 1)
    return 0


cdef int32_t _tick_pop(Tree* t) except -2:
    # `_pop_victim`: the evictable node of least score (the caller keeps one evictable)
    cdef TickState* s = _ticks(t)
    cdef int32_t node
    cdef bint live
    while s.h_size:
        node = s.h_node[0]
        live = _live(t, 0)
        s.h_size -= 1
        if s.h_size:
            s.h_score[0], s.h_node[0] = s.h_score[s.h_size], s.h_node[s.h_size]
            _sift_down(s, 0)
        if live:
            return node
    raise RuntimeError("the tick policy's heap has no evictable node")


cdef int _tick_insert(Tree* t, int32_t node, bint evictable) except -1:
    _ticks(t).tick[node] = t.clock
    if evictable:
        _heap_push(t, node)
    return 0


cdef int _tick_access(Tree* t, int32_t node) except -1:
    if t.flags & TOUCH_ON_ACCESS:
        _ticks(t).tick[node] = t.clock
        if t.evictable[node]:
            _heap_push(t, node)  # the entry of its old tick is stale now
    return 0


cdef int _tick_evictable(Tree* t, int32_t node, bint evictable) except -1:
    # back with its old tick (`_TickQueue.add_old`); one that leaves leaves a stale entry
    if evictable:
        _heap_push(t, node)
    return 0
