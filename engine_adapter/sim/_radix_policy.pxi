# The policy kinds of the simulator's radix loop and the dispatch of the tree's policy hooks
# (_radix_tree.pxi) to each kind's state (_radix_pol_*.pxi). Part of engine_adapter/sim/_radix_run.pyx,
# included after the kinds. engine_adapter/sim/radix_run.py maps each policy class to its kind.

cdef enum:
    P_TICK = 0  # lru, fifo, mru, filo (_radix_pol_tick.pxi)
    P_SIEVE = 1  # sieve (_radix_pol_sieve.pxi)
    P_LEVELLED = 2  # lfu (_radix_pol_levelled.pxi)
    P_S3FIFO = 3  # s3fifo (_radix_pol_s3fifo.pxi)
    P_ARC = 5  # arc (_radix_pol_arc.pxi)
    P_GDSF = 10  # gdsf (_radix_pol_score.pxi)
    P_BELADY = 11  # the radix model's Belady (_radix_pol_score.pxi); `policy`: its future
    P_NONE = 12  # no order: a row that never evicts (the unbounded reference row), no state


cdef int _pol_init(Tree* t, object policy) except -1:
    if t.kind == P_NONE:
        return 0
    if t.kind == P_TICK:
        return _tick_init(t)
    if t.kind == P_SIEVE:
        return _sieve_init(t)
    if t.kind == P_LEVELLED:
        return _lvl_init(t)
    if t.kind == P_S3FIFO:
        return _s3fifo_init(t, policy)
    if t.kind == P_ARC:
        return _arc_init(t, policy)
    if t.kind == P_GDSF or t.kind == P_BELADY:
        return _score_init(t, t.kind == P_BELADY, policy)
    raise ValueError(f"no policy kind {t.kind}")


cdef void _pol_free(Tree* t) noexcept:
    if t.kind == P_TICK:
        _tick_free(t)
    elif t.kind == P_SIEVE:
        _sieve_free(t)
    elif t.kind == P_LEVELLED:
        _lvl_free(t)
    elif t.kind == P_S3FIFO:
        _s3fifo_free(t)
    elif t.kind == P_ARC:
        _arc_free(t)
    elif t.kind == P_GDSF or t.kind == P_BELADY:
        _score_free(t)


cdef inline int _pol_insert(Tree* t, int32_t node, bint evictable) except -1:
    if t.kind == P_TICK:
        return _tick_insert(t, node, evictable)
    if t.kind == P_SIEVE:
        return _sieve_insert(t, node, evictable)
    if t.kind == P_LEVELLED:
        return _lvl_insert(t, node, evictable)
    if t.kind == P_S3FIFO:
        return _s3fifo_insert(t, node, evictable)
    if t.kind == P_ARC:
        return _arc_insert(t, node, evictable)
    if t.kind == P_GDSF or t.kind == P_BELADY:
        return _score_insert(t, node, evictable)
    return 0


cdef inline int _pol_access(Tree* t, int32_t node) except -1:
    if t.kind == P_TICK:
        return _tick_access(t, node)
    if t.kind == P_SIEVE:
        return _sieve_access(t, node)
    if t.kind == P_LEVELLED:
        return _lvl_access(t, node)
    if t.kind == P_S3FIFO:
        return _s3fifo_access(t, node)
    if t.kind == P_ARC:
        return _arc_access(t, node)
    if t.kind == P_GDSF or t.kind == P_BELADY:
        return _score_access(t, node)
    return 0


cdef inline int _pol_evictable(Tree* t, int32_t node, bint evictable) except -1:
    if t.kind == P_TICK:
        return _tick_evictable(t, node, evictable)
    if t.kind == P_SIEVE:
        return _sieve_evictable(t, node, evictable)
    if t.kind == P_LEVELLED:
        return _lvl_evictable(t, node, evictable)
    if t.kind == P_S3FIFO:
        return _s3fifo_evictable(t, node, evictable)
    if t.kind == P_ARC:
        return _arc_evictable(t, node, evictable)
    if t.kind == P_GDSF or t.kind == P_BELADY:
        return _score_evictable(t, node, evictable)
    return 0


cdef inline int32_t _pol_pop(Tree* t) except -2:
    if t.kind == P_TICK:
        return _tick_pop(t)
    if t.kind == P_SIEVE:
        return _sieve_pop(t)
    if t.kind == P_LEVELLED:
        return _lvl_pop(t)
    if t.kind == P_S3FIFO:
        return _s3fifo_pop(t)
    if t.kind == P_ARC:
        return _arc_pop(t)
    if t.kind == P_GDSF or t.kind == P_BELADY:
        return _score_pop(t)
    if t.kind == P_NONE:
        raise RuntimeError("a tree without an eviction order had to evict")  # CacheCore bails first
    raise RuntimeError(f"no policy kind {t.kind}")


cdef inline int _pol_serve(Tree* t, const int64_t* keys, Py_ssize_t n, int64_t end) except -1:
    # `RadixModel.allocate`'s `belady.serve(keys, end)`: the request whose lookups end at `end`
    # is being allocated (only Belady's next uses depend on it)
    if t.kind == P_BELADY:
        return _belady_serve(t, keys, n, end)
    return 0
