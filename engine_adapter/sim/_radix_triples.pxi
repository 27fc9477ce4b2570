# A binary min-heap of int64 triples in lexicographic order: heapq's order of the (step, sequence
# id, epoch) tuples of the simulator's `finishes` and `needs` heaps (engine_adapter/sim/run_state.py).
# Part of engine_adapter/sim/_radix_run.pyx.

cdef struct Triples:
    int64_t* a
    int64_t* b
    int64_t* c
    Py_ssize_t size, cap


cdef void _triples_clear(Triples* h) noexcept:
    h.a = h.b = h.c = NULL
    h.size = h.cap = 0


cdef void _triples_free(Triples* h) noexcept:
    free(h.a)
    free(h.b)
    free(h.c)
    _triples_clear(h)


cdef inline bint _triple_before(Triples* h, Py_ssize_t i, Py_ssize_t j) noexcept:
    if h.a[i] != h.a[j]:
        return h.a[i] < h.a[j]
    if h.b[i] != h.b[j]:
        return h.b[i] < h.b[j]
    return h.c[i] < h.c[j]


cdef inline void _triple_swap(Triples* h, Py_ssize_t i, Py_ssize_t j) noexcept:
    h.a[i], h.a[j] = h.a[j], h.a[i]
    h.b[i], h.b[j] = h.b[j], h.b[i]
    h.c[i], h.c[j] = h.c[j], h.c[i]


cdef int _triples_push(Triples* h, int64_t a, int64_t b, int64_t c) except -1:
    cdef Py_ssize_t i, up, cap
    if h.size == h.cap:
        cap = 2 * h.cap if h.cap else 64
        h.a = <int64_t*>_resized(h.a, cap * sizeof(int64_t))
        h.b = <int64_t*>_resized(h.b, cap * sizeof(int64_t))
        h.c = <int64_t*>_resized(h.c, cap * sizeof(int64_t))
        h.cap = cap
    i = h.size
    h.a[i], h.b[i], h.c[i] = a, b, c
    h.size += 1
    while i > 0:
        up = (i - 1) >> 1
        if not _triple_before(h, i, up):
            break
        _triple_swap(h, i, up)
        i = up
    return 0


cdef void _triples_pop(Triples* h) noexcept:
    # drop the least triple (read it first at index 0)
    cdef Py_ssize_t i = 0, child
    h.size -= 1
    h.a[0], h.b[0], h.c[0] = h.a[h.size], h.b[h.size], h.c[h.size]
    while True:
        child = 2 * i + 1
        if child >= h.size:
            break
        if child + 1 < h.size and _triple_before(h, child + 1, child):
            child += 1
        if not _triple_before(h, child, i):
            break
        _triple_swap(h, i, child)
        i = child
