# `PolicyProbe`: one policy kind of the radix loop driven operation by operation, for the tests
# (tests/test_radix_policies.py holds each kind to its Python policy, victim for victim). Part of
# engine_adapter/sim/_radix_run.pyx.


cdef class PolicyProbe:
    """A `Tree` of independent blocks (no parents) under one policy kind, addressed by key: the
    operations of `EvictionPolicy` (insert, access, set_evictable, evict(1)) as the radix loop
    makes them. `policy` is the Python policy whose parameters the kind reads."""

    cdef Tree tree

    def __init__(self, policy, int kind, int flags, Py_ssize_t capacity, int64_t block_size=16):
        _tree_init(&self.tree, capacity, block_size, kind, flags, policy)

    def __dealloc__(self):
        if self.tree.parent != NULL:  # built (`_tree_free` clears it)
            _tree_free(&self.tree)

    cdef int32_t _node(self, int64_t key) except -1:
        cdef int64_t node = _map_get(&self.tree.index, key)
        if node == _ABSENT:
            raise KeyError(key)
        return <int32_t>node

    def insert(self, int64_t key, bint evictable=True, int32_t depth=0):
        """A block cached unlocked: evictable (a leaf) or not (a chain's inner block)."""
        if _map_get(&self.tree.index, key) != _ABSENT:
            raise KeyError(f"{key} is held")
        _insert(&self.tree, -1, key, depth, 0.0, 0, False, evictable)

    def access(self, int64_t key):
        _policy_access(&self.tree.nodes, self._node(key))

    def set_evictable(self, int64_t key, bint evictable):
        _set_evictable(&self.tree.nodes, self._node(key), evictable)

    def evict(self):
        """The next victim's key, gone; None when nothing is evictable."""
        cdef int32_t node = _evict_one(&self.tree)
        return None if node < 0 else self.tree.nodes.key[node]

    @property
    def num_evictable(self):
        return self.tree.nodes.num_evictable

    def __len__(self):
        return self.tree.index.size

    def serve(self, const int64_t[::1] keys, int64_t end):
        """`RadixBelady.serve(keys, end)` on a probe of the belady kind (the others ignore it):
        the request whose lookups are `keys`, ending at `end` in the lookup sequence, is being
        allocated."""
        _pol_serve(&self.tree.nodes, &keys[0] if keys.shape[0] else NULL, keys.shape[0], end)
