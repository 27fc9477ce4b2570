# The tick policies: lru, fifo, mru and filo (sage_eviction/recency.py, `RecencyPolicy` and its
# `_TickQueue`, the reference), whose whole order is one logical tick per block: the clock of
# its insert, and of each hit where hits count (lru, mru), the oldest first (the newest for mru
# and filo). A kind of the policies' C home (_kind_nodes.pxi; dispatched by _kinds.pxi).
#
# As in `_TickQueue`: the evictable nodes that got their tick last (an insert, or a hit) sit in
# a list in tick order (head: the newest), so an insert, a hit and a pop cost O(1); a node made
# evictable again with an older tick than the list's newest (it was in use: the radix cache's
# locked blocks) goes into a side heap of (score, node) instead, with lazy deletion, and the
# next victim is the better of the list's end and the heap's top. A node is in the list or the
# heap (`where`), never both; a heap entry whose node is no longer there, or whose tick moved on
# with a hit, is stale and skipped when it surfaces, and the heap is rebuilt from its live
# entries when the stale ones outnumber them (`_TickQueue.add_old`'s rule). A flat cache's
# blocks are always evictable, so its heap stays empty.

# The variants (`Nodes.flags`, generated into _kinds.pxi from compiled_kinds.VARIANTS):
# TOUCH_ON_ACCESS, a hit gives the block the newest tick (lru, mru); NEWEST_FIRST, the newest
# tick goes first (mru, filo).

cdef enum:
    TICK_OUT = 0  # `TickState.where`: in neither (not evictable)
    TICK_LIST = 1  # in the list
    TICK_SIDE = 2  # in the side heap


cdef struct TickState:
    int64_t* tick  # by node
    int32_t* newer  # by node: the list's links (head: the newest tick)
    int32_t* older
    uint8_t* where  # by node: TICK_OUT, TICK_LIST or TICK_SIDE
    Ends q
    int64_t* h_score  # the side heap: a binary min-heap of (score, node), with stale entries
    int32_t* h_node
    Py_ssize_t h_size, h_cap, n_side  # n_side: the nodes in it (`side_live`)


cdef inline TickState* _ticks(Nodes* t) noexcept:
    return <TickState*>t.pol


cdef int _tick_init(Nodes* t, object policy) except -1:
    cdef TickState* s = <TickState*>calloc(1, sizeof(TickState))
    if s == NULL:
        raise MemoryError()
    t.pol = s  # from here `_tick_free` frees what was allocated, should the rest fail
    s.q.head = s.q.tail = -1
    s.h_cap = 64
    s.tick = <int64_t*>malloc(t.capacity * sizeof(int64_t) + 8)
    s.newer = <int32_t*>malloc(t.capacity * sizeof(int32_t) + 4)
    s.older = <int32_t*>malloc(t.capacity * sizeof(int32_t) + 4)
    s.where = <uint8_t*>calloc(t.capacity + 1, sizeof(uint8_t))
    s.h_score = <int64_t*>malloc(s.h_cap * sizeof(int64_t))
    s.h_node = <int32_t*>malloc(s.h_cap * sizeof(int32_t))
    if (s.tick == NULL or s.newer == NULL or s.older == NULL or s.where == NULL or s.h_score == NULL
            or s.h_node == NULL):
        raise MemoryError()
    return 0


cdef void _tick_free(Nodes* t) noexcept:
    cdef TickState* s = _ticks(t)
    free(s.tick)
    free(s.newer)
    free(s.older)
    free(s.where)
    free(s.h_score)
    free(s.h_node)
    free(s)
    t.pol = NULL


cdef inline int64_t _score(Nodes* t, int32_t node) noexcept:
    # the heap's order: the least score goes first
    cdef int64_t tick = _ticks(t).tick[node]
    return -tick if t.flags & NEWEST_FIRST else tick


cdef inline bint _live(Nodes* t, Py_ssize_t i) noexcept:
    # the entry still stands for its node: in the heap, with the score it was pushed with
    cdef TickState* s = _ticks(t)
    return s.where[s.h_node[i]] == TICK_SIDE and s.h_score[i] == _score(t, s.h_node[i])


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


cdef void _heap_rebuild(Nodes* t) noexcept:
    # only the live entries, one per node, heapified: a node's second live entry (the same score
    # pushed again after it left and came back without a hit) is dropped, as it would be when
    # popped; `where` marks the ones kept (TICK_SIDE + 1) for the length of the pass
    cdef TickState* s = _ticks(t)
    cdef Py_ssize_t i, kept = 0
    for i in range(s.h_size):
        if _live(t, i):
            s.where[s.h_node[i]] = TICK_SIDE + 1
            s.h_score[kept], s.h_node[kept] = s.h_score[i], s.h_node[i]
            kept += 1
    for i in range(kept):
        s.where[s.h_node[i]] = TICK_SIDE
    s.h_size = kept
    for i in range(kept // 2 - 1, -1, -1):
        _sift_down(s, i)


cdef int _side_push(Nodes* t, int32_t node) except -1:
    cdef TickState* s = _ticks(t)
    if s.h_size == s.h_cap:
        s.h_score = <int64_t*>_resized(s.h_score, 2 * s.h_cap * sizeof(int64_t))
        s.h_node = <int32_t*>_resized(s.h_node, 2 * s.h_cap * sizeof(int32_t))
        s.h_cap *= 2
    s.where[node] = TICK_SIDE
    s.n_side += 1
    s.h_score[s.h_size] = _score(t, node)
    s.h_node[s.h_size] = node
    s.h_size += 1
    _sift_up(s, s.h_size - 1)
    if s.h_size > 2 * s.n_side + 64:
        _heap_rebuild(t)
    return 0


cdef inline void _tick_to_head(TickState* s, int32_t node) noexcept:
    # `order[key] = None`: the newest end of the list
    s.where[node] = TICK_LIST
    _link_head(s.newer, s.older, &s.q, node)


cdef inline void _tick_leave(TickState* s, int32_t node) noexcept:
    # `_TickQueue.discard`: out of the list, or out of the heap (its entry left stale)
    if s.where[node] == TICK_LIST:
        _unlink(s.newer, s.older, &s.q, node)
    elif s.where[node] == TICK_SIDE:
        s.n_side -= 1
    s.where[node] = TICK_OUT


cdef int32_t _tick_pop(Nodes* t) except -2:
    # `_TickQueue.pop`: the list's oldest (newest first: its newest) or the heap's top live
    # entry, whichever goes first (the caller keeps one node evictable)
    cdef TickState* s = _ticks(t)
    cdef int32_t node = -1
    cdef int32_t end
    cdef Py_ssize_t last
    while s.h_size and not _live(t, 0):  # stale tops out
        s.h_size -= 1
        if s.h_size:
            s.h_score[0], s.h_node[0] = s.h_score[s.h_size], s.h_node[s.h_size]
            _sift_down(s, 0)
    end = s.q.head if t.flags & NEWEST_FIRST else s.q.tail
    if s.h_size and (end == -1 or s.h_score[0] < _score(t, end)):
        node = s.h_node[0]
        last = s.h_size - 1
        s.h_size = last
        if last:
            s.h_score[0], s.h_node[0] = s.h_score[last], s.h_node[last]
            _sift_down(s, 0)
    elif end != -1:
        node = end
    else:
        raise RuntimeError("the tick policy has no evictable node")
    _tick_leave(s, node)
    return node


cdef int _tick_insert(Nodes* t, int32_t node, bint evictable) except -1:
    cdef TickState* s = _ticks(t)
    s.tick[node] = t.clock
    s.where[node] = TICK_OUT
    if evictable:
        _tick_to_head(s, node)
    return 0


cdef int _tick_access(Nodes* t, int32_t node) except -1:
    # `_TickQueue.touch`: the newest tick, to the list's head (out of the heap if there)
    cdef TickState* s = _ticks(t)
    if t.flags & TOUCH_ON_ACCESS:
        s.tick[node] = t.clock
        if t.evictable[node] and node != s.q.head:
            _tick_leave(s, node)
            _tick_to_head(s, node)
    return 0


cdef int _tick_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # `_TickQueue.add_old`: back at the list's head when its tick is newer than the list's
    # newest, else into the heap; or `discard`
    cdef TickState* s = _ticks(t)
    if not evictable:
        _tick_leave(s, node)
    elif s.q.head == -1 or s.tick[node] > s.tick[s.q.head]:
        _tick_to_head(s, node)
    else:
        _side_push(t, node)
    return 0
