# Intrusive doubly linked lists over arrays of node indices, and a FIFO of keys with O(1) removal
# (the ghosts). Part of sage_eviction/_core.pyx, included after _core_i64map.pxi, before the flat
# cache's state (_core_flat_state.pxi), whose queues these are.

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc


cdef struct Ends:
    # one list's ends over shared `newer` / `older` arrays (-1: none); head is the newest
    int32_t head
    int32_t tail


cdef inline void _link_head(int32_t* newer, int32_t* older, Ends* q, int32_t node) noexcept nogil:
    newer[node] = -1
    older[node] = q.head
    if q.head == -1:
        q.tail = node
    else:
        newer[q.head] = node
    q.head = node


cdef inline void _unlink(int32_t* newer, int32_t* older, Ends* q, int32_t node) noexcept nogil:
    cdef int32_t n = newer[node]
    cdef int32_t o = older[node]
    if n == -1:
        q.head = o
    else:
        older[n] = o
    if o == -1:
        q.tail = n
    else:
        newer[o] = n


cdef struct Ghosts:
    # at most `capacity` keys in arrival order (an OrderedDict of keys: pop any, drop the oldest)
    I64Map index  # key -> slot
    int64_t* key
    int32_t* newer
    int32_t* older
    int32_t* spare  # free slots, a stack
    Py_ssize_t num_spare
    Ends ends
    Py_ssize_t capacity


cdef void _ghosts_clear(Ghosts* g) noexcept:
    # no memory yet (what _ghosts_free may be given before _ghosts_init)
    g.key = NULL
    g.newer = g.older = g.spare = NULL
    g.index.keys = g.index.vals = NULL


cdef int _ghosts_init(Ghosts* g, Py_ssize_t capacity) except -1:
    cdef Py_ssize_t n = capacity if capacity > 0 else 1
    cdef Py_ssize_t i
    g.key = <int64_t*>malloc(n * sizeof(int64_t))
    g.newer = <int32_t*>malloc(n * sizeof(int32_t))
    g.older = <int32_t*>malloc(n * sizeof(int32_t))
    g.spare = <int32_t*>malloc(n * sizeof(int32_t))
    _map_init(&g.index, n * 2, True)
    if g.key == NULL or g.newer == NULL or g.older == NULL or g.spare == NULL:
        raise MemoryError()
    for i in range(n):
        g.spare[i] = <int32_t>(n - 1 - i)
    g.num_spare = n
    g.ends.head = g.ends.tail = -1
    g.capacity = capacity
    return 0


cdef void _ghosts_free(Ghosts* g) noexcept:
    _map_free(&g.index)
    free(g.key)
    free(g.newer)
    free(g.older)
    free(g.spare)
    g.key = NULL
    g.newer = g.older = g.spare = NULL


cdef inline bint _ghosts_pop(Ghosts* g, int64_t key) noexcept nogil:
    # take `key` out; whether it was there
    cdef int64_t slot = _map_get(&g.index, key)
    if slot == _ABSENT:
        return False
    _map_del(&g.index, key)
    _unlink(g.newer, g.older, &g.ends, <int32_t>slot)
    g.spare[g.num_spare] = <int32_t>slot
    g.num_spare += 1
    return True


cdef inline Py_ssize_t _ghosts_len(Ghosts* g) noexcept nogil:
    return g.index.size


cdef int _ghosts_push(Ghosts* g, int64_t key) except -1:
    # `key` (not held) as the newest, the oldest dropped first while full
    cdef int32_t slot
    if g.capacity <= 0:
        return 0
    while _ghosts_len(g) >= g.capacity:
        _ghosts_pop(g, g.key[g.ends.tail])
    g.num_spare -= 1
    slot = g.spare[g.num_spare]
    g.key[slot] = key
    _link_head(g.newer, g.older, &g.ends, slot)
    _map_put(&g.index, key, slot)
    return 0


cdef struct FarHeap:
    # nodes by (next use, push), the farthest next use on top and, among equal ones (never used
    # again), the earliest push: the order of Belady's lazy heap of (-next use, push, key) items,
    # held here as one entry per node whose priority is updated in place
    int32_t* heap  # node indices, a binary heap
    int32_t* at  # node -> its index in `heap`
    int64_t* next_use
    int64_t* push
    Py_ssize_t size


cdef int _far_init(FarHeap* h, Py_ssize_t nodes) except -1:
    h.heap = <int32_t*>malloc(nodes * sizeof(int32_t))
    h.at = <int32_t*>malloc(nodes * sizeof(int32_t))
    h.next_use = <int64_t*>malloc(nodes * sizeof(int64_t))
    h.push = <int64_t*>malloc(nodes * sizeof(int64_t))
    h.size = 0
    if h.heap == NULL or h.at == NULL or h.next_use == NULL or h.push == NULL:
        raise MemoryError()
    return 0


cdef void _far_clear(FarHeap* h) noexcept:
    h.heap = h.at = NULL
    h.next_use = h.push = NULL
    h.size = 0


cdef void _far_free(FarHeap* h) noexcept:
    free(h.heap)
    free(h.at)
    free(h.next_use)
    free(h.push)
    _far_clear(h)


cdef inline bint _far_before(FarHeap* h, int32_t a, int32_t b) noexcept nogil:
    # whether node `a` leaves before node `b`
    return h.next_use[a] > h.next_use[b] or (h.next_use[a] == h.next_use[b] and h.push[a] < h.push[b])


cdef inline void _far_place(FarHeap* h, Py_ssize_t i, int32_t node) noexcept nogil:
    h.heap[i] = node
    h.at[node] = <int32_t>i


cdef void _far_up(FarHeap* h, Py_ssize_t i) noexcept nogil:
    cdef int32_t node = h.heap[i]
    cdef Py_ssize_t parent
    while i > 0:
        parent = (i - 1) >> 1
        if not _far_before(h, node, h.heap[parent]):
            break
        _far_place(h, i, h.heap[parent])
        i = parent
    _far_place(h, i, node)


cdef void _far_down(FarHeap* h, Py_ssize_t i) noexcept nogil:
    cdef int32_t node = h.heap[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= h.size:
            break
        if child + 1 < h.size and _far_before(h, h.heap[child + 1], h.heap[child]):
            child += 1
        if not _far_before(h, h.heap[child], node):
            break
        _far_place(h, i, h.heap[child])
        i = child
    _far_place(h, i, node)


cdef void _far_set(FarHeap* h, int32_t node, int64_t next_use, int64_t push, bint held) noexcept nogil:
    # a new node (held False) or a held one's new priority (its next use only grows, its push too)
    h.next_use[node] = next_use
    h.push[node] = push
    if not held:
        _far_place(h, h.size, node)
        h.size += 1
        _far_up(h, h.size - 1)
    else:
        _far_up(h, h.at[node])
        _far_down(h, h.at[node])


cdef int32_t _far_pop(FarHeap* h) noexcept nogil:
    # the top node, out of the heap (the heap is not empty)
    cdef int32_t top = h.heap[0]
    h.size -= 1
    if h.size > 0:
        _far_place(h, 0, h.heap[h.size])
        _far_down(h, 0)
    return top
