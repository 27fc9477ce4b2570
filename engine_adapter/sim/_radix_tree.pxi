# The radix cache of the simulator's compiled radix loop: `Tree`, the tree of cached blocks and
# its policy's order, in C arrays. Part of engine_adapter/sim/_radix_run.pyx, which includes it
# after the core's int64 table (_core_i64map.pxi).
#
# The reference is `engine_adapter.cache.radix_cache.RadixCache` with a `RecencyPolicy`
# (sage_eviction/recency.py): each function below mirrors the method of the same name there
# (match, lock, unlock, insert, refresh, reclaimable_in, evict) and the policy's operations
# (insert, access, set_evictable, evict(1)), for the four policies whose whole order is one
# logical tick per block: lru (the tick of its insert or latest hit, oldest first), fifo (of its
# insert), mru and filo (newest first). Ticks are unique (one per insert or hit), so the policy's
# order is a heap of (score, node) over the evictable nodes: a node that stops being evictable
# leaves its entry behind (skipped when it surfaces: the node is no longer evictable, or its
# score moved on with a hit), and the heap is rebuilt from the evictable nodes when the stale
# entries outnumber the live ones.
#
# A node is a cached block (index < capacity, the pool's blocks: every cached block holds one);
# a key maps to its node in `index`. Nodes left by evictions are reused.

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc, realloc


cdef enum:
    TOUCH_ON_ACCESS = 1  # a hit gives the block the newest tick (lru, mru)
    NEWEST_FIRST = 2  # the newest tick goes first (mru, filo)


cdef struct Tree:
    int64_t* key
    int32_t* parent  # -1: a first block
    int32_t* children
    int32_t* ref  # running sequences holding it (no pins in the simulator)
    int64_t* tick
    double* created  # its EntryMeta's created_at
    int32_t* tenant  # its tenant, as the ghost set's id
    uint8_t* evictable  # ref 0, no child: the policy may choose it
    int32_t* spare  # free node indices, a stack
    Py_ssize_t n_spare, capacity
    I64Map index  # key -> node
    int64_t clock  # the policy's logical clock: one tick per insert or hit
    int flags
    int64_t* h_score  # the evictable nodes by score, a binary min-heap with stale entries
    int32_t* h_node
    Py_ssize_t h_size, h_cap
    Py_ssize_t num_evictable, num_reclaimable


cdef void* _grown(void* p, size_t size) except NULL:
    # `realloc`, or MemoryError with `p` left as it was (the owner frees it)
    cdef void* q = realloc(p, size)
    if q == NULL:
        raise MemoryError()
    return q


cdef int _tree_init(Tree* t, Py_ssize_t capacity, int flags) except -1:
    cdef Py_ssize_t i
    t.capacity = capacity
    t.key = <int64_t*>malloc(capacity * sizeof(int64_t))
    t.parent = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.children = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.ref = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.tick = <int64_t*>malloc(capacity * sizeof(int64_t))
    t.created = <double*>malloc(capacity * sizeof(double))
    t.tenant = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.evictable = <uint8_t*>malloc(capacity * sizeof(uint8_t))
    t.spare = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.h_cap = 64
    t.h_score = <int64_t*>malloc(t.h_cap * sizeof(int64_t))
    t.h_node = <int32_t*>malloc(t.h_cap * sizeof(int32_t))
    if (t.key == NULL or t.parent == NULL or t.children == NULL or t.ref == NULL or t.tick == NULL
            or t.created == NULL or t.tenant == NULL or t.evictable == NULL or t.spare == NULL
            or t.h_score == NULL or t.h_node == NULL):
        raise MemoryError()
    for i in range(capacity):
        t.evictable[i] = 0
        t.spare[i] = <int32_t>(capacity - 1 - i)  # node 0 first
    t.n_spare = capacity
    _map_init(&t.index, 16, True)
    t.flags = flags
    return 0


cdef void _tree_free(Tree* t) noexcept:
    free(t.key)
    free(t.parent)
    free(t.children)
    free(t.ref)
    free(t.tick)
    free(t.created)
    free(t.tenant)
    free(t.evictable)
    free(t.spare)
    free(t.h_score)
    free(t.h_node)
    _map_free(&t.index)


# ---- the policy's order: a heap of (score, node) ------------------------------------------------

cdef inline int64_t _score(Tree* t, int32_t node) noexcept:
    return -t.tick[node] if t.flags & NEWEST_FIRST else t.tick[node]


cdef inline bint _live(Tree* t, Py_ssize_t i) noexcept:
    # the entry still stands for its node: evictable, with the score it was pushed with
    return t.evictable[t.h_node[i]] and t.h_score[i] == _score(t, t.h_node[i])


cdef void _sift_up(Tree* t, Py_ssize_t i) noexcept:
    cdef int64_t score = t.h_score[i]
    cdef int32_t node = t.h_node[i]
    cdef Py_ssize_t up
    while i > 0:
        up = (i - 1) >> 1
        if t.h_score[up] <= score:
            break
        t.h_score[i], t.h_node[i] = t.h_score[up], t.h_node[up]
        i = up
    t.h_score[i], t.h_node[i] = score, node


cdef void _sift_down(Tree* t, Py_ssize_t i) noexcept:
    cdef int64_t score = t.h_score[i]
    cdef int32_t node = t.h_node[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= t.h_size:
            break
        if child + 1 < t.h_size and t.h_score[child + 1] < t.h_score[child]:
            child += 1
        if t.h_score[child] >= score:
            break
        t.h_score[i], t.h_node[i] = t.h_score[child], t.h_node[child]
        i = child
    t.h_score[i], t.h_node[i] = score, node


cdef int _heap_rebuild(Tree* t) noexcept:
    # only the live entries, heapified (no entry is live twice: a second entry of the same
    # node and score is dropped here as it would be when popped)
    cdef Py_ssize_t i, kept = 0
    for i in range(t.h_size):
        if _live(t, i) and t.evictable[t.h_node[i]] == 1:
            t.evictable[t.h_node[i]] = 2  # kept once: a duplicate entry of it goes
            t.h_score[kept], t.h_node[kept] = t.h_score[i], t.h_node[i]
            kept += 1
    for i in range(kept):
        t.evictable[t.h_node[i]] = 1
    t.h_size = kept
    for i in range(kept // 2 - 1, -1, -1):
        _sift_down(t, i)
    return 0


cdef int _heap_push(Tree* t, int32_t node) except -1:
    if t.h_size == t.h_cap:
        if t.h_size > 2 * t.num_evictable + 64:
            _heap_rebuild(t)
        if t.h_size == t.h_cap:
            t.h_score = <int64_t*>_grown(t.h_score, 2 * t.h_cap * sizeof(int64_t))
            t.h_node = <int32_t*>_grown(t.h_node, 2 * t.h_cap * sizeof(int32_t))
            t.h_cap *= 2
    t.h_score[t.h_size] = _score(t, node)
    t.h_node[t.h_size] = node
    t.h_size += 1
    _sift_up(t, t.h_size - 1)
    return 0


cdef int32_t _heap_pop(Tree* t) noexcept:
    # the policy's evict(1): the evictable node of least score, no longer evictable; -1: none
    cdef int32_t node
    cdef bint live
    while t.h_size:
        node = t.h_node[0]
        live = _live(t, 0)
        t.h_size -= 1
        if t.h_size:
            t.h_score[0], t.h_node[0] = t.h_score[t.h_size], t.h_node[t.h_size]
            _sift_down(t, 0)
        if live:
            t.evictable[node] = 0
            t.num_evictable -= 1
            return node
    return -1


cdef int _set_evictable(Tree* t, int32_t node, bint evictable) except -1:
    # EvictionPolicy.set_evictable (the block's flag and the policy's are one here)
    if evictable == t.evictable[node]:
        return 0
    t.evictable[node] = evictable
    if evictable:
        t.num_evictable += 1
        _heap_push(t, node)
    else:
        t.num_evictable -= 1
    return 0


cdef int _policy_insert(Tree* t, int32_t node, bint evictable) except -1:
    # EvictionPolicy.insert: the newest tick
    t.clock += 1
    t.tick[node] = t.clock
    t.evictable[node] = 0
    return _set_evictable(t, node, evictable)


# ---- the tree (RadixCache's methods of the same names) --------------------------------------------

cdef Py_ssize_t _match(Tree* t, const int64_t* keys, Py_ssize_t n, int32_t* path) noexcept:
    # the longest cached prefix of `keys` (a root path), into `path`; its length
    cdef Py_ssize_t i
    cdef int64_t node
    cdef int32_t parent = -1
    for i in range(n):
        node = _map_get(&t.index, keys[i])
        if node == _ABSENT or t.parent[node] != parent:
            return i
        path[i] = parent = <int32_t>node
    return n


cdef int _touch(Tree* t, const int32_t* path, Py_ssize_t n) except -1:
    # a hit on each block: the policy's access (a new tick for lru and mru)
    cdef Py_ssize_t i
    cdef int32_t node
    for i in range(n):
        node = path[i]
        t.clock += 1
        if t.flags & TOUCH_ON_ACCESS:
            t.tick[node] = t.clock
            if t.evictable[node]:
                _heap_push(t, node)  # the entry of its old tick is stale now
    return 0


cdef void _lock(Tree* t, const int32_t* path, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    cdef int32_t node
    for i in range(n):
        node = path[i]
        if t.ref[node] == 0:
            t.num_reclaimable -= 1
        t.ref[node] += 1
        if t.evictable[node]:
            t.evictable[node] = 0
            t.num_evictable -= 1


cdef int _unlock(Tree* t, const int32_t* path, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    cdef int32_t node
    for i in range(n):
        node = path[i]
        t.ref[node] -= 1
        if t.ref[node] == 0:
            t.num_reclaimable += 1
            if t.children[node] == 0:
                _set_evictable(t, node, True)
    return 0


cdef Py_ssize_t _reclaimable_in(Tree* t, const int32_t* path, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, count = 0
    for i in range(n):
        count += t.ref[path[i]] == 0
    return count


cdef int32_t _insert(Tree* t, int32_t parent, int64_t key, double now, int32_t tenant, bint locked,
                     bint leaf) except -1:
    # cache `key` under `parent` (-1: a first block), locked by its sequence or not; a non-leaf
    # (a chain's block, its child follows) enters the policy not evictable
    cdef int32_t node
    if t.n_spare == 0:
        raise RuntimeError("the simulated radix cache holds more blocks than its pool")
    if parent >= 0:
        t.children[parent] += 1
        if t.evictable[parent]:
            _set_evictable(t, parent, False)
    t.n_spare -= 1
    node = t.spare[t.n_spare]
    _map_put(&t.index, key, node)
    t.key[node] = key
    t.parent[node] = parent
    t.children[node] = 0
    t.ref[node] = 1 if locked else 0
    t.created[node] = now
    t.tenant[node] = tenant
    if not locked:
        t.num_reclaimable += 1
    _policy_insert(t, node, leaf and not locked)
    return node


cdef int _refresh(Tree* t, int32_t node) except -1:
    return _set_evictable(t, node, t.ref[node] == 0 and t.children[node] == 0)


cdef int32_t _evict_one(Tree* t) except -2:
    # the policy's next victim, out of the tree (its parent evictable when it was the last
    # child); -1: none. Its fields stay readable until the node is reused by an insert.
    cdef int32_t node = _heap_pop(t)
    cdef int32_t parent
    if node < 0:
        return -1
    _map_del(&t.index, t.key[node])
    t.num_reclaimable -= 1
    parent = t.parent[node]
    if parent >= 0:
        t.children[parent] -= 1
        if t.children[parent] == 0 and t.ref[parent] == 0:
            _set_evictable(t, parent, True)
    t.spare[t.n_spare] = node
    t.n_spare += 1
    return node
