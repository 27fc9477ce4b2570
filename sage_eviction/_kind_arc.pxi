# ARC in the simulator's radix loop (sage_eviction/policies/arc.py, `ARCPolicy`): T1 and T2 as
# intrusive LRU lists over the tree's nodes, the ghost lists B1 and B2 as FIFOs of int64 keys,
# the target p of |T1| a double. Part of engine_adapter/sim/_radix_run.pyx, which includes the
# core's intrusive lists (`Ends`, `_link_head`, `_unlink`: _core_flat_lists.pxi) before it.
#
# Each function below is the Python hook of the same name, line for line, with the base's part
# (clock, hits, the evictable flag and count) already done by _radix_tree.pxi. What the Python
# class does with blocks that are not evictable (the radix cache's locked blocks and inner
# nodes) is kept exactly: they count in |T1| or |T2| (`n1`, `n2`) and a hit moves one to T2, but
# only evictable nodes are linked into the lists, so REPLACE never sees the others; one that
# becomes evictable is linked at the MRU end of its list.
#
# The flat cache calls `prepare_insert` before the evictions a miss makes: a ghost hit adapts p
# then, and the next eviction is its REPLACE (`_arc_prepare`); the radix cache never does, so
# there a ghost hit is seen by the insert, after the evictions.
#
# A key is in at most one ghost list and never in one while resident (an insert takes it out of
# its ghost list; a victim is not resident), so B1 and B2 share one map key -> slot, the slot
# saying which list holds it. Slots grow on demand: the Python lists have no bound of their own
# (the directory stays within 2c only while the policy holds at most c blocks).

from libc.stdlib cimport calloc


cdef struct ArcState:
    # T1, T2: by node
    int32_t* newer  # toward the MRU end (-1: none)
    int32_t* older  # toward the LRU end
    uint8_t* lst  # 1: T1, 2: T2 (ARCPolicy._list_of)
    Ends t[3]  # t[1], t[2]: the evictable nodes of T1, T2
    Py_ssize_t n1, n2  # |T1|, |T2|, pinned included
    double p  # the target size of T1
    Py_ssize_t c
    # B1, B2: by slot
    I64Map ghost_of  # key -> slot
    int64_t* g_key
    int32_t* g_newer
    int32_t* g_older
    uint8_t* g_lst  # 1: B1, 2: B2
    int32_t* g_spare  # free slots, a stack
    Py_ssize_t g_n_spare, g_cap
    Ends b[3]  # b[1], b[2]: B1, B2
    Py_ssize_t nb[3]  # |B1|, |B2|
    # `prepare_insert`'s key (while `has_pending`), the ghost list it was in (0: none), and
    # whether the next eviction is its REPLACE
    int64_t pending_key
    bint has_pending, pending_replace
    int pending_ghost


cdef inline ArcState* _arcs(Nodes* t) noexcept:
    return <ArcState*>t.pol


cdef int _arc_grow_ghosts(ArcState* s) except -1:
    # twice the slots, the new ones spare (`_resized` keeps an array whole when it fails: the
    # state's free releases it)
    cdef Py_ssize_t i, cap = 2 * s.g_cap
    s.g_key = <int64_t*>_resized(s.g_key, cap * sizeof(int64_t))
    s.g_newer = <int32_t*>_resized(s.g_newer, cap * sizeof(int32_t))
    s.g_older = <int32_t*>_resized(s.g_older, cap * sizeof(int32_t))
    s.g_lst = <uint8_t*>_resized(s.g_lst, cap * sizeof(uint8_t))
    s.g_spare = <int32_t*>_resized(s.g_spare, cap * sizeof(int32_t))
    for i in range(cap - 1, s.g_cap - 1, -1):
        s.g_spare[s.g_n_spare] = <int32_t>i
        s.g_n_spare += 1
    s.g_cap = cap
    return 0


cdef int _arc_init(Nodes* t, object policy) except -1:
    cdef Py_ssize_t i, c = policy.capacity  # ARCPolicy's c
    cdef ArcState* s = <ArcState*>calloc(1, sizeof(ArcState))  # counts 0, p 0.0, arrays NULL
    if s == NULL:
        raise MemoryError()
    t.pol = s
    s.c = c
    s.p = 0.0
    s.t[1].head = s.t[1].tail = s.t[2].head = s.t[2].tail = -1
    s.b[1].head = s.b[1].tail = s.b[2].head = s.b[2].tail = -1
    s.newer = <int32_t*>malloc(t.capacity * sizeof(int32_t) + 4)
    s.older = <int32_t*>malloc(t.capacity * sizeof(int32_t) + 4)
    s.lst = <uint8_t*>malloc(t.capacity * sizeof(uint8_t) + 1)
    if s.newer == NULL or s.older == NULL or s.lst == NULL:
        raise MemoryError()
    # sized for the directory's 2c ghosts (their bound while the policy holds at most c blocks,
    # as in the radix loop, where c is the pool), the map at most half full: most inserts look up
    # a key that is no ghost, and an absent key's probe run grows fast with the load
    _map_init(&s.ghost_of, 4 * c + 16, True)
    s.g_cap = 2 * c + 16  # slots, doubled if the ghosts outgrow them
    s.g_key = <int64_t*>malloc(s.g_cap * sizeof(int64_t))
    s.g_newer = <int32_t*>malloc(s.g_cap * sizeof(int32_t))
    s.g_older = <int32_t*>malloc(s.g_cap * sizeof(int32_t))
    s.g_lst = <uint8_t*>malloc(s.g_cap * sizeof(uint8_t))
    s.g_spare = <int32_t*>malloc(s.g_cap * sizeof(int32_t))
    if s.g_key == NULL or s.g_newer == NULL or s.g_older == NULL or s.g_lst == NULL or s.g_spare == NULL:
        raise MemoryError()
    for i in range(s.g_cap - 1, -1, -1):
        s.g_spare[s.g_n_spare] = <int32_t>i
        s.g_n_spare += 1
    return 0


cdef void _arc_free(Nodes* t) noexcept:
    cdef ArcState* s = _arcs(t)
    free(s.newer)
    free(s.older)
    free(s.lst)
    _map_free(&s.ghost_of)
    free(s.g_key)
    free(s.g_newer)
    free(s.g_older)
    free(s.g_lst)
    free(s.g_spare)
    free(s)
    t.pol = NULL


# ---- B1 and B2 (OrderedDicts of keys in the Python class) ----------------------------------------

cdef int _arc_ghost_push(ArcState* s, int which, int64_t key) except -1:
    # `self._b1[key] = None` (which 1) or `self._b2[key] = None` (2): the MRU end
    cdef int32_t slot
    if s.g_n_spare == 0:
        _arc_grow_ghosts(s)
    s.g_n_spare -= 1
    slot = s.g_spare[s.g_n_spare]
    s.g_key[slot] = key
    s.g_lst[slot] = <uint8_t>which
    _link_head(s.g_newer, s.g_older, &s.b[which], slot)
    s.nb[which] += 1
    _map_put(&s.ghost_of, key, slot)
    return 0


cdef void _arc_ghost_del(ArcState* s, int32_t slot) noexcept:
    # `del self._b1[key]` / `del self._b2[key]`: the slot's key out of its list
    cdef int which = s.g_lst[slot]
    _map_del(&s.ghost_of, s.g_key[slot])
    _unlink(s.g_newer, s.g_older, &s.b[which], slot)
    s.nb[which] -= 1
    s.g_spare[s.g_n_spare] = slot
    s.g_n_spare += 1


cdef inline void _arc_ghost_drop_oldest(ArcState* s, int which) noexcept:
    # `self._b1.popitem(last=False)` (the list is not empty)
    _arc_ghost_del(s, s.b[which].tail)


# ---- the hooks -------------------------------------------------------------------------------------

cdef void _arc_adapt(ArcState* s, int ghost) noexcept:
    # ARCPolicy._adapt: Python's int / int is the correctly rounded quotient, as is the double
    # division of the two counts (exact in a double below 2**53); Python's max(x, y) and min(x, y)
    # give y only when it is strictly beyond x, as below
    cdef double b1 = <double>s.nb[1]
    cdef double b2 = <double>s.nb[2]
    cdef double step
    if ghost == 1:
        step = b2 / b1
        if 1.0 > step:
            step = 1.0
        s.p = s.p + step
        if <double>s.c < s.p:
            s.p = <double>s.c
    else:
        step = b1 / b2
        if 1.0 > step:
            step = 1.0
        s.p = s.p - step
        if 0.0 > s.p:
            s.p = 0.0


cdef int _arc_prepare(Nodes* t, int64_t key) except -1:
    # `prepare_insert`: on a ghost hit p adapts now and the key leaves its ghost list, and the
    # next eviction is the paper's REPLACE for it (cases II and III)
    cdef ArcState* s = _arcs(t)
    cdef int64_t slot = _map_get(&s.ghost_of, key)
    s.pending_key = key
    s.has_pending = True
    s.pending_ghost = 0
    if slot != _ABSENT:
        s.pending_ghost = s.g_lst[slot]
        _arc_adapt(s, s.pending_ghost)  # with the lengths before the key leaves its list
        _arc_ghost_del(s, <int32_t>slot)
    s.pending_replace = s.pending_ghost != 0
    return 0


cdef int _arc_insert(Nodes* t, int32_t node, bint evictable) except -1:
    # _on_insert: a ghost hit (cases II and III, seen by `prepare_insert` or now) enters T2, p
    # adapted; a new key enters T1, the ghost lists trimmed so that |L1| <= c and the
    # directory <= 2c
    cdef ArcState* s = _arcs(t)
    cdef int64_t slot
    cdef Py_ssize_t c = s.c
    cdef int ghost = 0
    cdef bint prepared = s.has_pending and s.pending_key == t.key[node]
    s.has_pending = False  # any insert ends what prepare_insert started
    s.pending_replace = False
    if prepared:
        ghost = s.pending_ghost
    else:
        slot = _map_get(&s.ghost_of, t.key[node])
        if slot != _ABSENT:
            ghost = s.g_lst[slot]
            _arc_adapt(s, ghost)  # with the lengths before the key leaves its list
            _arc_ghost_del(s, <int32_t>slot)
    if ghost:
        s.lst[node] = 2
        s.n2 += 1
        if evictable:
            _link_head(s.newer, s.older, &s.t[2], node)
        return 0
    if s.n1 + s.nb[1] >= c and s.nb[1]:
        _arc_ghost_drop_oldest(s, 1)
    elif s.n1 + s.n2 + s.nb[1] + s.nb[2] >= 2 * c and s.nb[2]:
        _arc_ghost_drop_oldest(s, 2)
    s.lst[node] = 1
    s.n1 += 1
    if evictable:
        _link_head(s.newer, s.older, &s.t[1], node)
    return 0


cdef int _arc_access(Nodes* t, int32_t node) except -1:
    # _on_access, case I: to T2 (linked at its MRU end when evictable)
    cdef ArcState* s = _arcs(t)
    if s.lst[node] == 1:
        s.lst[node] = 2
        s.n1 -= 1
        s.n2 += 1
        if t.evictable[node]:
            _unlink(s.newer, s.older, &s.t[1], node)
            _link_head(s.newer, s.older, &s.t[2], node)
    elif t.evictable[node] and s.t[2].head != node:
        _unlink(s.newer, s.older, &s.t[2], node)
        _link_head(s.newer, s.older, &s.t[2], node)
    return 0


cdef int _arc_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # _on_evictable: linked at the MRU end of its list (it was in use until now), or unlinked
    cdef ArcState* s = _arcs(t)
    if evictable:
        _link_head(s.newer, s.older, &s.t[s.lst[node]], node)
    else:
        _unlink(s.newer, s.older, &s.t[s.lst[node]], node)
    return 0


cdef int32_t _arc_lru_out(ArcState* s, int which) noexcept:
    # `self._t1.popitem(last=False)` (the list is not empty)
    cdef int32_t node = s.t[which].tail
    _unlink(s.newer, s.older, &s.t[which], node)
    return node


cdef int32_t _arc_replace(Nodes* t, bint in_b2) except -2:
    # _replace: the LRU evictable node of T1 or T2 to its ghost list (`in_b2`: a pending ghost
    # hit from B2, whose REPLACE takes T1's on a tie with p)
    cdef ArcState* s = _arcs(t)
    cdef int32_t node
    cdef double n1 = <double>s.n1
    if s.t[1].head != -1 and (n1 > s.p or (in_b2 and n1 == s.p) or s.t[2].head == -1):
        node = _arc_lru_out(s, 1)
        s.n1 -= 1
        _arc_ghost_push(s, 1, t.key[node])
    elif s.t[2].head != -1:
        node = _arc_lru_out(s, 2)
        s.n2 -= 1
        _arc_ghost_push(s, 2, t.key[node])
    else:
        raise RuntimeError("arc has no evictable node")
    return node


cdef int32_t _arc_pop(Nodes* t) except -2:
    # _pop_victim: a pending ghost hit's REPLACE; else case IV first (T1 alone full: its LRU
    # node leaves without a ghost; else the ghost lists trimmed), then REPLACE
    cdef ArcState* s = _arcs(t)
    cdef Py_ssize_t c = s.c
    cdef int32_t node
    if s.pending_replace:  # cases II and III
        s.pending_replace = False
        return _arc_replace(t, s.pending_ghost == 2)
    if s.n1 + s.nb[1] >= c:  # case IV.A: L1 holds c keys
        if s.n1 >= c and s.t[1].head != -1:
            node = _arc_lru_out(s, 1)
            s.n1 -= 1
            return node
        if s.nb[1]:
            _arc_ghost_drop_oldest(s, 1)
    elif s.n1 + s.n2 + s.nb[1] + s.nb[2] >= 2 * c and s.nb[2]:  # case IV.B
        _arc_ghost_drop_oldest(s, 2)
    return _arc_replace(t, False)
