# The compact set of evicted keys: `KeySet` (sage_eviction/keyset.py picks it or its reference).
# Part of sage_eviction/_core.pyx, included before _core_ops.pxi, whose base operations and the
# flat loop (_core_flat.pxi) call its C methods.
#
# Why: the two sets of evicted keys not yet requested again (a policy's `_evicted`, the cache
# accounting's `ReprefillTracker._evicted`) grow with every distinct block a trace evicts; a
# Python set costs about 45 bytes a key plus the int object (32 bytes) it keeps alive, 15 M keys
# of a 10^8-lookup trace about 2.3 GB for the two. Integer keys within int64 are held here as
# raw int64 in one open-addressing table (linear probing, backward-shift deletion, so no
# tombstones): 8 bytes a slot at a load of at most one half, 16 to 32 bytes a key, no object.
# Any other key (a tuple, a string, an int beyond int64) goes to a plain Python set beside it.
# A key compares as Python compares it for ints and bools (True is 1); a float equal to an int
# is a different key here (it is in the Python part), which no cache's keys are.

from libc.stdint cimport int64_t, uint64_t

DEF _EMPTY = -0x8000000000000000  # INT64_MIN: never stored in the table (held in `_others`)


cdef inline uint64_t _mix64(uint64_t x) nogil:
    # splitmix64's finaliser: consecutive ids (the traces' are) spread over the table
    x ^= x >> 30
    x *= 0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= 0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef class KeySet:
    """A set of hashable keys; ints within int64 held as raw int64 (16 to 32 bytes a key).

    The methods of a `set` that the re-prefill bookkeeping uses: `add`, `discard`, `in`, `len`,
    `clear`, `update`, iteration, `remove_present` (discard each key held, return how many were),
    and `==` with another `KeySet` or a set. Pickles and deep-copies as its keys."""

    cdef int64_t* _slots
    cdef Py_ssize_t _mask  # slots - 1 (a power of two minus one); -1 before the first int key
    cdef Py_ssize_t _used  # int keys in the table
    cdef set _others

    def __cinit__(self):
        self._slots = NULL
        self._mask = -1
        self._used = 0
        self._others = set()

    def __init__(self, keys=()):
        self.update(keys)

    def __dealloc__(self):
        PyMem_Free(self._slots)

    cdef inline bint _as_int(self, object key, int64_t* out) except -1:
        # True with the key's int64 when it belongs in the table
        cdef int overflow = 0
        cdef long long value
        if not PyLong_CheckExact(key) and not PyBool_Check(key):
            return False
        value = PyLong_AsLongLongAndOverflow(key, &overflow)
        if overflow or value == _EMPTY:
            return False
        out[0] = value
        return True

    cdef int _grow(self) except -1:
        cdef Py_ssize_t old_size = self._mask + 1, size = 16 if old_size == 0 else 2 * old_size
        cdef int64_t* old = self._slots
        cdef int64_t* slots = <int64_t*>PyMem_Malloc(size * sizeof(int64_t))
        cdef Py_ssize_t i, at
        if slots == NULL:
            raise MemoryError()
        for i in range(size):
            slots[i] = _EMPTY
        self._slots, self._mask = slots, size - 1
        for i in range(old_size):
            if old[i] != _EMPTY:
                at = <Py_ssize_t>(_mix64(<uint64_t>old[i]) & <uint64_t>self._mask)
                while slots[at] != _EMPTY:
                    at = (at + 1) & self._mask
                slots[at] = old[i]
        PyMem_Free(old)
        return 0

    cdef inline Py_ssize_t _find(self, int64_t value):
        # the slot holding `value`, or -1
        cdef Py_ssize_t at
        if self._mask < 0:
            return -1
        at = <Py_ssize_t>(_mix64(<uint64_t>value) & <uint64_t>self._mask)
        while self._slots[at] != _EMPTY:
            if self._slots[at] == value:
                return at
            at = (at + 1) & self._mask
        return -1

    cdef int _add_int(self, int64_t value) except -1:
        cdef Py_ssize_t at
        if 2 * (self._used + 1) > self._mask + 1:
            self._grow()
        at = <Py_ssize_t>(_mix64(<uint64_t>value) & <uint64_t>self._mask)
        while self._slots[at] != _EMPTY:
            if self._slots[at] == value:
                return 0
            at = (at + 1) & self._mask
        self._slots[at] = value
        self._used += 1
        return 0

    cdef bint _discard_int(self, int64_t value):
        # backward-shift deletion: later entries of the probe run move up, so no tombstones
        cdef Py_ssize_t hole = self._find(value), at, home
        cdef int64_t* slots = self._slots
        if hole < 0:
            return False
        at = hole
        while True:
            at = (at + 1) & self._mask
            if slots[at] == _EMPTY:
                break
            home = <Py_ssize_t>(_mix64(<uint64_t>slots[at]) & <uint64_t>self._mask)
            # move the entry at `at` into the hole unless its home lies cyclically in (hole, at]
            if (hole <= at and (home <= hole or home > at)) or (hole > at and home <= hole and home > at):
                slots[hole] = slots[at]
                hole = at
        slots[hole] = _EMPTY
        self._used -= 1
        return True

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
            return self._find(value) >= 0
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
        if self._used == 0 and not self._others:
            return 0
        for key in keys:
            if self.discard_key(key):
                count += 1
        return count

    def clear(self):
        PyMem_Free(self._slots)
        self._slots, self._mask, self._used = NULL, -1, 0
        self._others.clear()

    def __contains__(self, key):
        return self.has_key(key)

    def __len__(self):
        return self._used + len(self._others)

    def __bool__(self):
        return self._used > 0 or bool(self._others)

    def __iter__(self):
        # a snapshot: the ints in slot order, then the other keys
        cdef Py_ssize_t i
        cdef list keys = []
        for i in range(self._mask + 1):
            if self._slots[i] != _EMPTY:
                keys.append(self._slots[i])
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
        return (self._mask + 1) * sizeof(int64_t)


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
