# The radix cache of the simulator's compiled radix loop: `Tree`, the tree of cached blocks and
# its policy's order, in C arrays. Part of engine_adapter/sim/_radix_run.pyx, which includes it
# after the core's int64 table (_core_i64map.pxi) and the policies' nodes (_kind_nodes.pxi).
#
# The reference is `engine_adapter.cache.radix_cache.RadixCache`: each function below mirrors the
# method of the same name there (match, lock, unlock, insert, refresh, reclaimable_in, evict).
# The policy's part is the policies' one C home (sage_eviction/_kind_nodes.pxi: `Nodes`, the
# base's bookkeeping, and a file per kind), which the flat cache runs too: the tree owns a
# `Nodes` (`Tree.nodes`) and calls its `_policy_insert`, `_policy_access`, `_set_evictable`
# and `_policy_pop`.
#
# A node is a cached block (index < capacity, the pool's blocks: every cached block holds one);
# a key maps to its node in `index`. Nodes left by evictions are reused.

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc, realloc


cdef struct Tree:
    # the policy's nodes: their key, depth, hits and evictable flags, the capacity, the clock,
    # the kind and its state (`Nodes`); a tree without an order (P_NONE, a row that never
    # evicts) keeps no key, depth, hit count or tenant (NULL)
    Nodes nodes
    int32_t* parent  # -1: a first block
    int32_t* children
    int32_t* ref  # running sequences holding it (no pins in the simulator)
    double* created  # EntryMeta.created_at
    int32_t* tenant  # its tenant, as the ghost set's id
    int32_t* spare  # nodes freed by evictions, a stack (reused first)
    Py_ssize_t n_spare
    Py_ssize_t n_fresh  # the nodes never used are n_fresh .. capacity - 1
    I64Map index  # key -> node
    Py_ssize_t num_reclaimable


cdef int _tree_init(Tree* t, Py_ssize_t capacity, int64_t block_size, int kind, int flags, object policy,
                    Py_ssize_t keys=0) except -1:
    # the nodes, empty, and the policy's state (`policy`: the Python policy the row names, whose
    # parameters the kind reads); `keys`: the distinct keys of the run when known (0: not known)
    cdef bint ordered = kind != P_NONE
    _nodes_init(&t.nodes, capacity, block_size, kind, flags, ordered)
    t.parent = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.children = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.ref = <int32_t*>malloc(capacity * sizeof(int32_t))
    t.created = <double*>malloc(capacity * sizeof(double))
    t.tenant = <int32_t*>malloc(capacity * sizeof(int32_t)) if ordered else NULL
    t.spare = <int32_t*>malloc(capacity * sizeof(int32_t))
    if (ordered and t.tenant == NULL or t.parent == NULL or t.children == NULL or t.ref == NULL
            or t.created == NULL or t.spare == NULL):
        raise MemoryError()
    # the never-used nodes are a counter above the stack of freed ones: the same nodes, in the
    # same order, as a stack of every node (node 0 first), but no page of `spare` is touched
    # until an eviction frees a node (the unbounded row's pool is every block of its trace)
    t.n_spare, t.n_fresh = 0, 0
    # sized once to what it can hold, a key per node and per distinct key of the run: no
    # doubling while it fills, which held the old table and the new one (1.5 times the final)
    _map_init(&t.index, ((min(capacity, keys) if keys > 0 else capacity) * 4) // 3 + 1, True)
    return _pol_init(&t.nodes, policy)


cdef void _tree_free(Tree* t) noexcept:
    _nodes_free(&t.nodes)
    free(t.parent)
    free(t.children)
    free(t.ref)
    free(t.created)
    free(t.tenant)
    free(t.spare)
    _map_free(&t.index)
    t.parent = NULL  # the owners' "built" mark


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
    # a hit on each block
    cdef Py_ssize_t i
    for i in range(n):
        _policy_access(&t.nodes, path[i])
    return 0


cdef int _lock(Tree* t, const int32_t* path, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    cdef int32_t node
    for i in range(n):
        node = path[i]
        if t.ref[node] == 0:
            t.num_reclaimable -= 1
        t.ref[node] += 1
        if t.nodes.evictable[node]:
            _set_evictable(&t.nodes, node, False)
    return 0


cdef int _unlock(Tree* t, const int32_t* path, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    cdef int32_t node
    for i in range(n):
        node = path[i]
        t.ref[node] -= 1
        if t.ref[node] == 0:
            t.num_reclaimable += 1
            if t.children[node] == 0:
                _set_evictable(&t.nodes, node, True)
    return 0


cdef Py_ssize_t _reclaimable_in(Tree* t, const int32_t* path, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, count = 0
    for i in range(n):
        count += t.ref[path[i]] == 0
    return count


cdef int32_t _insert(Tree* t, int32_t parent, int64_t key, int32_t depth, double now, int32_t tenant,
                     bint locked, bint leaf) except -1:
    # cache `key` under `parent` (-1: a first block), locked by its sequence or not; a non-leaf
    # (a chain's block, its child follows) enters the policy not evictable
    cdef int32_t node
    if t.n_spare == 0 and t.n_fresh == t.nodes.capacity:
        raise RuntimeError("the simulated radix cache holds more blocks than its pool")
    if parent >= 0:
        t.children[parent] += 1
        if t.nodes.evictable[parent]:
            _set_evictable(&t.nodes, parent, False)
    if t.n_spare:
        t.n_spare -= 1
        node = t.spare[t.n_spare]
    else:
        node = <int32_t>t.n_fresh
        t.n_fresh += 1
    _map_put(&t.index, key, node)
    if t.nodes.key != NULL:  # a tree with an order (see `Tree`)
        t.nodes.key[node] = key
        t.nodes.depth[node] = depth
        t.tenant[node] = tenant
    t.parent[node] = parent
    t.children[node] = 0
    t.ref[node] = 1 if locked else 0
    t.created[node] = now
    if not locked:
        t.num_reclaimable += 1
    _policy_insert(&t.nodes, node, leaf and not locked)
    return node


cdef int _refresh(Tree* t, int32_t node) except -1:
    return _set_evictable(&t.nodes, node, t.ref[node] == 0 and t.children[node] == 0)


cdef int32_t _evict_one(Tree* t) except -2:
    # the policy's next victim, out of the tree (its parent evictable when it was the last
    # child); -1: none. Its fields stay readable until the node is reused by an insert.
    cdef int32_t node = _policy_pop(&t.nodes)
    cdef int32_t parent
    if node < 0:
        return -1
    _map_del(&t.index, t.nodes.key[node])
    t.num_reclaimable -= 1
    parent = t.parent[node]
    if parent >= 0:
        t.children[parent] -= 1
        if t.children[parent] == 0 and t.ref[parent] == 0:
            _set_evictable(&t.nodes, parent, True)
    t.spare[t.n_spare] = node
    t.n_spare += 1
    return node
