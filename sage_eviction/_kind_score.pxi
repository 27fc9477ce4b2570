# The score-heap policies of the simulator's radix loop: gdsf (sage_eviction/policies/gdsf.py)
# and the radix model's Belady (`RadixBelady`, engine_adapter/sim/cache_models.py), both over
# `HeapPolicy` (sage_eviction/heap.py). Part of engine_adapter/sim/_radix_run.pyx.
#
# `HeapPolicy` keeps a heap of items with lazy deletion: `_live[key]` is the one item that
# stands for an evictable key, any other item of the key is stale and skipped when popped, and
# the heap is rebuilt from the live items when the stale ones outnumber them. Here an item is
# (score, second, id, node): `id` is a push number, unique, and the node's live item is the one
# whose id is `live[node]` while the node is evictable (the identity test of `pop_live`). Items
# order by (score, second), as the Python items (score, tick, key) and (score, push, key) do:
#
# - gdsf: score H = L + (hits + 1) * cost / size with EntryMeta's cost (depth + 1) * block_size
#   and size block_size, computed with the same float operations in the same order; second: the
#   tick of the key's latest insert or hit, unique between keys (`FlatHeapPolicy`). L becomes
#   each victim's H (`_on_victim`).
# - belady: score -(next use), exact in a double (positions < 2^53); second: the push number.
#   The next use is the key's first lookup at or after the cursor: for a key of the request
#   being served (`_belady_serve`, which the loop calls where `RadixModel.allocate` calls
#   `serve`) the next-use array at the key's last position in it, for any other key the walk of
#   `RadixBelady._next_outside` (_belady_outside).

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyObject_GetBuffer, PyBuffer_Release


cdef struct ScoreItem:
    double score
    int64_t second
    int64_t id  # its push number: the node's live item has id live[node]
    int32_t node


cdef struct ScoreState:
    ScoreItem* heap  # a binary min-heap by (score, second), with stale items
    Py_ssize_t h_size, h_cap
    int64_t* live  # by node: the id of its latest push
    int64_t* value  # by node: gdsf its tick, belady its next use
    int64_t pushes
    double inflation  # gdsf's L
    bint belady
    # belady's future: the lookup sequence's keys and each lookup's next use (Python buffers)
    Py_buffer keys_buf, after_buf
    bint has_keys, has_after
    const int64_t* after
    int64_t never, cursor
    int64_t* served  # the served request's keys (a copy: the loop's buffer is reused)
    Py_ssize_t n_served, served_cap
    I64Map serving  # its keys -> their last position
    I64Map first, memo  # _belady_outside's index, built at its first use
    bint indexed


cdef inline ScoreState* _scores(Nodes* t) noexcept:
    return <ScoreState*>t.pol


cdef int _score_init(Nodes* t, object future) except -1:
    # gdsf (`future`: the policy, not read) or belady (`future`: radix_run.RadixFuture, its keys
    # and next uses), by the kind
    cdef bint belady = t.kind == P_BELADY
    cdef ScoreState* s = <ScoreState*>malloc(sizeof(ScoreState))
    if s == NULL:
        raise MemoryError()
    s.has_keys = s.has_after = s.indexed = False
    s.heap, s.live, s.value, s.served = NULL, NULL, NULL, NULL
    t.pol = s
    s.h_cap, s.h_size, s.pushes, s.inflation, s.belady = 64, 0, 0, 0.0, belady
    s.n_served, s.served_cap, s.never, s.cursor = 0, 0, 0, 0
    _map_init(&s.serving, 16, True)
    s.heap = <ScoreItem*>malloc(s.h_cap * sizeof(ScoreItem))
    s.live = <int64_t*>malloc(t.capacity * sizeof(int64_t) + 8)
    s.value = <int64_t*>malloc(t.capacity * sizeof(int64_t) + 8)
    if s.heap == NULL or s.live == NULL or s.value == NULL:
        raise MemoryError()
    if belady:
        _belady_future(s, future)
    return 0


cdef int _belady_future(ScoreState* s, object future) except -1:
    # hold the future's two arrays (released by _score_free)
    PyObject_GetBuffer(future.keys, &s.keys_buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    s.has_keys = True
    PyObject_GetBuffer(future.next_use, &s.after_buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    s.has_after = True
    if s.keys_buf.itemsize not in (4, 8) or s.after_buf.itemsize != 8:
        raise TypeError("belady's future: int32 or int64 keys, int64 next uses")
    s.never = s.after_buf.len // 8
    if s.keys_buf.len // s.keys_buf.itemsize != s.never:
        raise ValueError("belady's future: one next use per lookup")
    s.after = <const int64_t*>s.after_buf.buf
    return 0


cdef void _score_free(Nodes* t) noexcept:
    cdef ScoreState* s = _scores(t)
    free(s.heap)
    free(s.live)
    free(s.value)
    free(s.served)
    _map_free(&s.serving)
    if s.indexed:
        _map_free(&s.first)
        _map_free(&s.memo)
    if s.has_keys:
        PyBuffer_Release(&s.keys_buf)
    if s.has_after:
        PyBuffer_Release(&s.after_buf)
    free(s)
    t.pol = NULL


# ---- the heap ------------------------------------------------------------------------------------

cdef inline bint _sc_before(const ScoreItem* a, const ScoreItem* b) noexcept:
    return a.score < b.score or (a.score == b.score and a.second < b.second)


cdef void _sc_sift_up(ScoreState* s, Py_ssize_t i) noexcept:
    cdef ScoreItem item = s.heap[i]
    cdef Py_ssize_t up
    while i > 0:
        up = (i - 1) >> 1
        if not _sc_before(&item, &s.heap[up]):
            break
        s.heap[i] = s.heap[up]
        i = up
    s.heap[i] = item


cdef void _sc_sift_down(ScoreState* s, Py_ssize_t i) noexcept:
    cdef ScoreItem item = s.heap[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= s.h_size:
            break
        if child + 1 < s.h_size and _sc_before(&s.heap[child + 1], &s.heap[child]):
            child += 1
        if not _sc_before(&s.heap[child], &item):
            break
        s.heap[i] = s.heap[child]
        i = child
    s.heap[i] = item


cdef inline bint _sc_live(Nodes* t, const ScoreItem* item) noexcept:
    # `_live[key] is item`: the node evictable and this its latest push
    return t.evictable[item.node] == 1 and _scores(t).live[item.node] == item.id


cdef void _sc_rebuild(Nodes* t) noexcept:
    # `HeapPolicy._refill`: the live items alone, heapified
    cdef ScoreState* s = _scores(t)
    cdef Py_ssize_t i, kept = 0
    for i in range(s.h_size):
        if _sc_live(t, &s.heap[i]):
            s.heap[kept] = s.heap[i]
            kept += 1
    s.h_size = kept
    for i in range(kept // 2 - 1, -1, -1):
        _sc_sift_down(s, i)


cdef inline double _gdsf_h(Nodes* t, ScoreState* s, int32_t node) noexcept:
    # GDSFPolicy._score's H: inflation + (hits + 1) * cost / max(size, 1), cost and size as
    # EntryMeta has them (block_meta.BlockMetaFields.meta), each operation a double one in order
    cdef double cost = <double>((t.depth[node] + 1) * t.block_size)
    return s.inflation + (<double>(t.hits[node] + 1) * cost) / <double>max(t.block_size, 1)


cdef int _sc_push(Nodes* t, int32_t node) except -1:
    # `HeapPolicy._push`: a new live item for `node` with its score now
    cdef ScoreState* s = _scores(t)
    cdef ScoreItem* item
    if s.h_size == s.h_cap:
        if s.h_size > 2 * t.num_evictable + 64:
            _sc_rebuild(t)
        if s.h_size == s.h_cap:
            s.heap = <ScoreItem*>_resized(s.heap, 2 * s.h_cap * sizeof(ScoreItem))
            s.h_cap *= 2
    s.pushes += 1
    item = &s.heap[s.h_size]
    item.id, item.node = s.pushes, node
    if s.belady:
        item.score, item.second = -<double>s.value[node], s.pushes
    else:
        item.score, item.second = _gdsf_h(t, s, node), s.value[node]
    s.live[node] = s.pushes
    s.h_size += 1
    _sc_sift_up(s, s.h_size - 1)
    return 0


cdef int32_t _score_pop(Nodes* t) except -2:
    # `_pop_victim`: the live item of least (score, second); gdsf's L becomes its H
    cdef ScoreState* s = _scores(t)
    cdef ScoreItem item
    while s.h_size:
        item = s.heap[0]
        s.h_size -= 1
        if s.h_size:
            s.heap[0] = s.heap[s.h_size]
            _sc_sift_down(s, 0)
        if _sc_live(t, &item):
            if not s.belady:
                s.inflation = item.score
            return item.node
    raise RuntimeError("the score heap has no evictable node")


# ---- the hooks ---------------------------------------------------------------------------------

cdef int _score_insert(Nodes* t, int32_t node, bint evictable) except -1:
    cdef ScoreState* s = _scores(t)
    s.value[node] = _belady_next(t, s, t.key[node]) if s.belady else t.clock
    if evictable:
        _sc_push(t, node)
    return 0


cdef int _score_access(Nodes* t, int32_t node) except -1:
    # a hit rescores a live key (`rescore_on_access`); one in use only takes its new value
    cdef ScoreState* s = _scores(t)
    s.value[node] = _belady_next(t, s, t.key[node]) if s.belady else t.clock
    if t.evictable[node]:
        _sc_push(t, node)
    return 0


cdef int _score_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # back with a new item scored now (its value kept); one that leaves leaves a stale item
    if evictable:
        _sc_push(t, node)
    return 0


# ---- belady's next use -------------------------------------------------------------------------

cdef int _belady_serve(Nodes* t, const int64_t* keys, Py_ssize_t n, int64_t end) except -1:
    # `RadixBelady.serve(keys, end)`: the cursor, and each key's last position in the request
    cdef ScoreState* s = _scores(t)
    cdef Py_ssize_t j
    for j in range(s.n_served):
        _map_del(&s.serving, s.served[j])
    if n > s.served_cap:
        s.served = <int64_t*>_resized(s.served, (n + 1) * sizeof(int64_t))
        s.served_cap = n
    for j in range(n):
        s.served[j] = keys[j]
        _map_put(&s.serving, keys[j], end - n + j)  # a repeated key: its last position
    s.n_served, s.cursor = n, end
    return 0


cdef int64_t _belady_next(Nodes* t, ScoreState* s, int64_t key) except -1:
    # `RadixBelady._next`
    cdef int64_t position = _map_get(&s.serving, key)
    if position == _ABSENT:
        return _belady_outside(s, key)
    return s.after[position]


cdef inline int64_t _lookup_key(ScoreState* s, Py_ssize_t i) noexcept:
    if s.keys_buf.itemsize == 8:
        return (<const int64_t*>s.keys_buf.buf)[i]
    return (<const int32_t*>s.keys_buf.buf)[i]


cdef int _belady_index(ScoreState* s) except -1:
    # each key's first lookup (the puts from the end leave the first)
    cdef Py_ssize_t i
    _map_init(&s.first, 16, True)
    _map_init(&s.memo, 16, True)
    s.indexed = True
    for i in range(s.never - 1, -1, -1):
        _map_put(&s.first, _lookup_key(s, i), i)
    return 0


cdef int64_t _belady_outside(ScoreState* s, int64_t key) except -1:
    # `RadixBelady._next_outside`: the key's first lookup at or after the cursor (the bisection
    # of its positions there), here a walk of the next-use chain from the key's latest position
    # known to lie before a cursor (`memo`), or from its first when the cursor moved back (a
    # preempted request served again)
    cdef int64_t here, before, cursor = s.cursor
    if not s.indexed:
        _belady_index(s)
    before = _map_get(&s.memo, key)
    if before == _ABSENT or before >= cursor:
        before = _map_get(&s.first, key)
        if before == _ABSENT:
            return s.never
    here = before
    while here < cursor:
        before = here
        here = s.after[here]
    if before < cursor:
        _map_put(&s.memo, key, before)
    return here
