# The levelled recency policies in the simulator's radix loop (sage_eviction/recency.py,
# `LevelledRecencyPolicy`): the evictable node of least (level, tick) goes first, the level read
# when the node is inserted, hit or made evictable, the tick the clock of its latest insert or
# hit. LFU's level is its hits since insert (`EntryMeta.hits`: `Tree.hits`), the kind's only
# variant so far: priority's level is the request's priority, which the loop does not keep per
# node. Part of engine_adapter/sim/_radix_run.pyx.
#
# Ticks are unique, so (level, tick) orders the evictable nodes totally, and one heap of
# (level, tick, node) with lazy deletion gives the order that the Python policy keeps in a queue
# per level and a heap of levels: an entry is live while its node is evictable and still has
# that tick (a hit pushes it again at its new level and tick; a node that stops being evictable
# leaves its entry behind). The tick alone tells: a node's level (its hits) changes only with a
# hit, which gives it a new tick; a level that could change without one (a request's priority
# raised) would have to be checked too. As in the tick kind (_kind_tick.pxi) the heap
# is rebuilt from its live entries when the stale ones outnumber them.

# Its one variant, LEVEL_HITS (generated into _kinds.pxi): the level is the node's hits since
# insert (lfu).


cdef struct LevelState:
    int64_t* tick  # by node: the clock of its latest insert or hit
    int64_t* h_level  # a binary min-heap of (level, tick, node), with stale entries
    int64_t* h_tick
    int32_t* h_node
    Py_ssize_t h_size, h_cap


cdef inline LevelState* _levels(Nodes* t) noexcept:
    return <LevelState*>t.pol


cdef int _lvl_init(Nodes* t, object policy) except -1:
    cdef LevelState* s = <LevelState*>malloc(sizeof(LevelState))
    if s == NULL:
        raise MemoryError()
    t.pol = s
    s.h_cap = 64
    s.h_size = 0
    s.tick = <int64_t*>malloc(t.capacity * sizeof(int64_t) + 8)
    s.h_level = <int64_t*>malloc(s.h_cap * sizeof(int64_t))
    s.h_tick = <int64_t*>malloc(s.h_cap * sizeof(int64_t))
    s.h_node = <int32_t*>malloc(s.h_cap * sizeof(int32_t))
    if s.tick == NULL or s.h_level == NULL or s.h_tick == NULL or s.h_node == NULL:
        raise MemoryError()
    return 0


cdef void _lvl_free(Nodes* t) noexcept:
    cdef LevelState* s = _levels(t)
    free(s.tick)
    free(s.h_level)
    free(s.h_tick)
    free(s.h_node)
    free(s)
    t.pol = NULL


cdef inline int64_t _lvl_of(Nodes* t, int32_t node) noexcept:
    # `_level(meta)`, read now (LEVEL_HITS: meta.hits, already counting a hit being made)
    return t.hits[node]


cdef inline bint _lvl_less(LevelState* s, Py_ssize_t i, int64_t level, int64_t tick) noexcept:
    # heap entry i before (level, tick); ties need no node order: ticks are unique per node
    return s.h_level[i] < level or (s.h_level[i] == level and s.h_tick[i] < tick)


cdef inline void _lvl_move(LevelState* s, Py_ssize_t to, Py_ssize_t frm) noexcept:
    s.h_level[to], s.h_tick[to], s.h_node[to] = s.h_level[frm], s.h_tick[frm], s.h_node[frm]


cdef inline bint _lvl_live(Nodes* t, Py_ssize_t i) noexcept:
    # the entry still stands for its node: evictable, with the tick it was pushed with
    cdef LevelState* s = _levels(t)
    return t.evictable[s.h_node[i]] == 1 and s.h_tick[i] == s.tick[s.h_node[i]]


cdef void _lvl_sift_up(LevelState* s, Py_ssize_t i) noexcept:
    cdef int64_t level = s.h_level[i], tick = s.h_tick[i]
    cdef int32_t node = s.h_node[i]
    cdef Py_ssize_t up
    while i > 0:
        up = (i - 1) >> 1
        if not _lvl_less(s, up, level, tick):
            _lvl_move(s, i, up)
            i = up
        else:
            break
    s.h_level[i], s.h_tick[i], s.h_node[i] = level, tick, node


cdef void _lvl_sift_down(LevelState* s, Py_ssize_t i) noexcept:
    cdef int64_t level = s.h_level[i], tick = s.h_tick[i]
    cdef int32_t node = s.h_node[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= s.h_size:
            break
        if child + 1 < s.h_size and _lvl_less(s, child + 1, s.h_level[child], s.h_tick[child]):
            child += 1
        if not _lvl_less(s, child, level, tick):
            break
        _lvl_move(s, i, child)
        i = child
    s.h_level[i], s.h_tick[i], s.h_node[i] = level, tick, node


cdef void _lvl_rebuild(Nodes* t) noexcept:
    # only the live entries, heapified; a node's second live entry (pushed again, at the same
    # level and tick, after it left and came back without a hit) is dropped, as it would be
    # when popped
    cdef LevelState* s = _levels(t)
    cdef Py_ssize_t i, kept = 0
    for i in range(s.h_size):
        if _lvl_live(t, i):
            t.evictable[s.h_node[i]] = 2  # kept once
            _lvl_move(s, kept, i)
            kept += 1
    for i in range(kept):
        t.evictable[s.h_node[i]] = 1
    s.h_size = kept
    for i in range(kept // 2 - 1, -1, -1):
        _lvl_sift_down(s, i)


cdef int _lvl_push(Nodes* t, int32_t node) except -1:
    # queue the node at its level read now and its tick
    cdef LevelState* s = _levels(t)
    if s.h_size == s.h_cap:
        if s.h_size > 2 * t.num_evictable + 64:
            _lvl_rebuild(t)
        if s.h_size == s.h_cap:
            s.h_level = <int64_t*>_resized(s.h_level, 2 * s.h_cap * sizeof(int64_t))
            s.h_tick = <int64_t*>_resized(s.h_tick, 2 * s.h_cap * sizeof(int64_t))
            s.h_node = <int32_t*>_resized(s.h_node, 2 * s.h_cap * sizeof(int32_t))
            s.h_cap *= 2
    s.h_level[s.h_size], s.h_tick[s.h_size], s.h_node[s.h_size] = _lvl_of(t, node), s.tick[node], node
    s.h_size += 1
    _lvl_sift_up(s, s.h_size - 1)
    return 0


cdef int32_t _lvl_pop(Nodes* t) except -2:
    # `_pop_victim`: the evictable node of least (level, tick) (the caller keeps one evictable)
    cdef LevelState* s = _levels(t)
    cdef int32_t node
    cdef bint live
    while s.h_size:
        node = s.h_node[0]
        live = _lvl_live(t, 0)
        s.h_size -= 1
        if s.h_size:
            _lvl_move(s, 0, s.h_size)
            _lvl_sift_down(s, 0)
        if live:
            return node
    raise RuntimeError("the levelled policy's heap has no evictable node")


cdef int _lvl_insert(Nodes* t, int32_t node, bint evictable) except -1:
    _levels(t).tick[node] = t.clock
    if evictable:
        _lvl_push(t, node)
    return 0


cdef int _lvl_access(Nodes* t, int32_t node) except -1:
    # the newest tick; an evictable node moves to its level now (its old entry is stale), one
    # in use reads its level when it is made evictable
    _levels(t).tick[node] = t.clock
    if t.evictable[node]:
        _lvl_push(t, node)
    return 0


cdef int _lvl_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # back with its old tick at its level now (`_TickQueue.add_old`); one that leaves leaves a
    # stale entry
    if evictable:
        _lvl_push(t, node)
    return 0
