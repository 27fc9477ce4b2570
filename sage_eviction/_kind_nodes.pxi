# The node-indexed state every built-in policy's C reads, and `EvictionPolicy`'s own bookkeeping
# over it: the one C home of the policies (issue 50, item 1). Included by the policies' core
# (sage_eviction/_core.pyx: the flat cache, `FlatState`) and by the simulator's radix loop
# (engine_adapter/sim/_radix_run.pyx: its tree), each of which owns a `Nodes` and calls the
# functions below; `_kinds.pxi` dispatches each hook to the policy's kind, one file per kind
# (`_kind_*.pxi`, each mirroring its Python class hook for hook).
#
# A node is a slot for one cached block (0 .. capacity - 1); its owner maps keys to nodes and
# reuses the nodes of victims. `_policy_insert`, `_policy_access`, `_set_evictable` and
# `_policy_pop` mirror `EvictionPolicy.insert`, `access`, `set_evictable` and `evict(1)`
# (sage_eviction/base.py): the base's part (its logical clock, the block's hits, the evictable
# flag and count) here, then the kind's hook (`_on_insert`, `_on_access`, `_on_evictable`,
# `_pop_victim`). `_policy_prepare` is `prepare_insert`: the flat cache calls it before the
# evictions a miss makes (FlatCache.request), the radix cache never does (RadixCache).

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc


cdef struct Nodes:
    # key, depth and hits are read by the kinds only (a radix tree that never evicts keeps none
    # of them: NULL); evictable by every kind, whose state skips or unlinks the others
    int64_t* key
    int32_t* depth  # its place in its prefix (EntryMeta.depth; gdsf's cost (depth + 1) * block_size)
    int64_t* hits  # EntryMeta.hits
    uint8_t* evictable  # the policy may choose it (capacity + 1 bytes)
    Py_ssize_t capacity, num_evictable
    int64_t clock  # the policy's logical clock: one tick per insert or hit (EvictionPolicy._clock)
    int64_t block_size
    int kind  # the policy's kind (_kinds.pxi)
    int flags  # the kind's variant (the tick kind's: TOUCH_ON_ACCESS, NEWEST_FIRST)
    void* pol  # the kind's state


cdef int _nodes_init(Nodes* t, Py_ssize_t capacity, int64_t block_size, int kind, int flags,
                     bint keyed) except -1:
    # the owner's nodes, empty: their arrays (`keyed` False: the evictable flags alone, for a
    # radix tree that never evicts) and the kind's fields; the owner calls `_pol_init` after.
    # Depth and hits start at 0 (the flat cache's blocks keep EntryMeta's depth 0); the flags'
    # pages are zero and touched as used. `_nodes_free` frees what was allocated, should it fail.
    t.capacity, t.block_size, t.kind, t.flags = capacity, block_size, kind, flags
    t.pol, t.num_evictable, t.clock = NULL, 0, 0
    t.key = <int64_t*>malloc(capacity * sizeof(int64_t) + 8) if keyed else NULL
    t.depth = <int32_t*>calloc(capacity + 1, sizeof(int32_t)) if keyed else NULL
    t.hits = <int64_t*>calloc(capacity + 1, sizeof(int64_t)) if keyed else NULL
    t.evictable = <uint8_t*>calloc(capacity + 1, sizeof(uint8_t))
    if keyed and (t.key == NULL or t.depth == NULL or t.hits == NULL) or t.evictable == NULL:
        raise MemoryError()
    return 0


cdef void _nodes_free(Nodes* t) noexcept:
    # the kind's state and the nodes' arrays
    if t.pol != NULL:
        _pol_free(t)
    free(t.key)
    free(t.depth)
    free(t.hits)
    free(t.evictable)
    t.key = t.hits = NULL
    t.depth = NULL
    t.evictable = NULL


cdef int _set_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # EvictionPolicy.set_evictable (the block's flag and the policy's are one here)
    if evictable == t.evictable[node]:
        return 0
    t.evictable[node] = evictable
    t.num_evictable += 1 if evictable else -1
    return _pol_evictable(t, node, evictable)


cdef inline int _policy_prepare(Nodes* t, int64_t key) except -1:
    # EvictionPolicy.prepare_insert: a miss on `key` will be inserted after the evictions
    return _pol_prepare(t, key)


cdef int _policy_insert(Nodes* t, int32_t node, bint evictable) except -1:
    # EvictionPolicy.insert (the owner has set `key[node]`)
    t.clock += 1
    if t.hits != NULL:
        t.hits[node] = 0
    t.evictable[node] = evictable
    if evictable:
        t.num_evictable += 1
    return _pol_insert(t, node, evictable)


cdef inline int _policy_access(Nodes* t, int32_t node) except -1:
    # EvictionPolicy.access
    t.clock += 1
    if t.hits != NULL:
        t.hits[node] += 1
    return _pol_access(t, node)


cdef int32_t _policy_pop(Nodes* t) except -2:
    # EvictionPolicy.evict(1): the kind's victim, no longer evictable; -1: none evictable
    cdef int32_t node
    if t.num_evictable == 0:
        return -1
    node = _pol_pop(t)
    t.evictable[node] = 0
    t.num_evictable -= 1
    return node
