# The compact set of evicted keys: `KeySet` (sage_eviction/keyset.py picks it or its reference).
# Part of sage_eviction/_core.pyx, included before _core_ops.pxi, whose base operations and the
# flat loop (_core_flat.pxi) call its C methods.
#
# Why: the two sets of evicted keys not yet requested again (a policy's `_evicted`, the cache
# accounting's `ReprefillTracker._evicted`) grow with every distinct block a trace evicts; a
# Python set costs about 45 bytes a key plus the int object (32 bytes) it keeps alive, 15 M keys
# of a 10^8-lookup trace about 2.3 GB for the two. Integer keys within int64 are held here as
# raw int64 in the core's one open-addressing table (`I64Map` in set mode, _core_i64map.pxi:
# linear probing, backward-shift deletion, a load of at most 3/4): 8 bytes a slot, 11 to 21
# bytes a key, no object. Any other key (a tuple, a string, an int beyond int64) goes to a plain
# Python set beside it. A key compares as Python compares it for ints and bools (True is 1); a
# float equal to an int is a different key here (it is in the Python part), which no cache's
# keys are.


cdef class KeySet:
    """A set of hashable keys; ints within int64 held as raw int64 (11 to 21 bytes a key).

    The methods of a `set` that the re-prefill bookkeeping uses: `add`, `discard`, `in`, `len`,
    `clear`, `update`, iteration, `remove_present` (discard each key held, return how many were),
    and `==` with another `KeySet` or a set. Pickles and deep-copies as its keys."""

    cdef I64Map _ints  # set mode; no table (keys NULL) before the first int key
    cdef set _others

    def __cinit__(self):
        self._ints.keys = self._ints.vals = NULL
        self._ints.size = 0
        self._ints.holds_min = False
        self._others = set()

    def __init__(self, keys=()):
        self.update(keys)

    def __dealloc__(self):
        _map_free(&self._ints)

    cdef inline bint _as_int(self, object key, int64_t* out) except -1:
        # True with the key's int64 when it belongs in the table
        cdef int overflow = 0
        cdef long long value
        if not PyLong_CheckExact(key) and not PyBool_Check(key):
            return False
        value = PyLong_AsLongLongAndOverflow(key, &overflow)
        if overflow:
            return False
        out[0] = value
        return True

    cdef inline bint _find(self, int64_t value) noexcept:
        return self._ints.keys != NULL and _map_get(&self._ints, value) != _ABSENT

    cdef int _add_int(self, int64_t value) except -1:
        if self._ints.keys == NULL:
            _map_init(&self._ints, 16, False)
        return _map_put(&self._ints, value, 0)

    cdef bint _discard_int(self, int64_t value) noexcept:
        return self._ints.keys != NULL and _map_del(&self._ints, value)

    cdef int add_key(self, object key) except -1:
        cdef int64_t value
        if self._as_int(key, &value):
            return self._add_int(value)
        self._others.add(key)
        return 0

    cdef bint discard_key(self, object key) except -1:
        """Discard `key`; True when it was held."""
        cdef int64_t value
        if self._as_int(key, &value):
            return self._discard_int(value)
        if key in self._others:
            self._others.discard(key)
            return True
        return False

    cdef bint has_key(self, object key) except -1:
        cdef int64_t value
        if self._as_int(key, &value):
            return self._find(value)
        return key in self._others

    def add(self, key):
        self.add_key(key)

    def discard(self, key):
        self.discard_key(key)

    def update(self, keys):
        for key in keys:
            self.add_key(key)

    def remove_present(self, keys):
        """Discard each of `keys` that is held; returns how many were (each once)."""
        cdef Py_ssize_t count = 0
        if self._ints.size == 0 and not self._others:
            return 0
        for key in keys:
            if self.discard_key(key):
                count += 1
        return count

    def clear(self):
        _map_free(&self._ints)
        self._ints.size = 0
        self._ints.holds_min = False
        self._others.clear()

    def __contains__(self, key):
        return self.has_key(key)

    def __len__(self):
        return self._ints.size + len(self._others)

    def __bool__(self):
        return self._ints.size > 0 or bool(self._others)

    def __iter__(self):
        # a snapshot: the ints in slot order (INT64_MIN, kept aside, first), then the other keys
        cdef Py_ssize_t i
        cdef list keys = []
        if self._ints.keys != NULL:
            if self._ints.holds_min:
                keys.append(_FREE)
            for i in range(self._ints.mask + 1):
                if self._ints.keys[i] != _FREE:
                    keys.append(self._ints.keys[i])
        keys.extend(self._others)
        return iter(keys)

    def __eq__(self, other):
        if isinstance(other, (KeySet, set, frozenset)):
            return len(self) == len(other) and all(key in self for key in other)
        return NotImplemented

    def __reduce__(self):
        return (KeySet, (list(self),))

    def __repr__(self):
        return f"KeySet({len(self)} keys)"

    def table_bytes(self):
        """Bytes of the int64 table (the Python part not counted)."""
        return 0 if self._ints.keys == NULL else (self._ints.mask + 1) * sizeof(int64_t)


# The C operations that update a set of evicted keys: a compiled `KeySet` through its C methods,
# anything else (the reference `PyKeySet`, a plain set a subclass put there) through its own;
# None (a policy's after `stop_recording_evicted`) records nothing.

cdef inline bint evicted_discard(object keys, object key) except -1:
    """Discard `key` from the evicted keys; True when it was there (a re-prefill)."""
    if type(keys) is KeySet:
        return (<KeySet>keys).discard_key(key)
    if keys is None:
        return False
    if key in keys:
        keys.discard(key)
        return True
    return False


cdef inline int evicted_add(object keys, object key) except -1:
    if type(keys) is KeySet:
        return (<KeySet>keys).add_key(key)
    if keys is not None:
        keys.add(key)
    return 0
