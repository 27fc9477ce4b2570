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
# Python set beside it. Ints in [0, KEYSET_DENSE_LIMIT) are bits of a bitmap instead, grown to
# the largest such key held: a trace's block ids (Mooncake's hash ids, the generated traces') are
# dense from 0, so 15 M of them take 2 MB of bits where the table would take 256 MB; the limit
# bounds what a few sparse small keys can cost (16 MiB). Hashed keys (the engine's chained block
# hashes, the synthetic workloads') are spread over int64 and land in the table. A key compares as Python compares it for ints and bools (True is 1); a
# float equal to an int is a different key here (it is in the Python part), which no cache's
# keys are.
#
# A window (`KeySet(window)`, a positive int) bounds it, with the semantics of the reference
# `EvictedWindow` (sage_eviction/keyset.py), line for line: a ring of the last `window` keys added,
# in order, and each held key's slot in the ring (its latest add: the int keys in the same table
# in map mode, the others in a dict); when the ring is full, an add takes the oldest slot and
# drops that slot's key from the set unless it was discarded or added again since. No bitmap
# then (it cannot say which slot a key sits in): at most `window` ring slots (8 bytes each) and
# `window` keys in the table, whatever the keys seen. A long-lived cache's re-prefill record
# (the engine's, the policies' own, the bridges') is windowed; a simulator row, whose trace bounds
# its keys, keeps the whole run (no window).


from libc.stdlib cimport realloc
from libc.string cimport memset

cdef int64_t _DENSE_LIMIT = 1 << 27  # keys in [0, this) are bits (a bitmap of at most 16 MiB)
KEYSET_DENSE_LIMIT = _DENSE_LIMIT


cdef class KeySet:
    """A set of hashable keys; ints in [0, 2^27) as bits, other ints within int64 as raw int64
    (11 to 21 bytes a key).

    The methods of a `set` that the re-prefill bookkeeping uses: `add`, `discard`, `in`, `len`,
    `clear`, `update`, iteration, `remove_present` (discard each key held, return how many were),
    and `==` with another `KeySet` or a set. Pickles and deep-copies as its keys."""

    cdef I64Map _ints  # set mode; no table (keys NULL) before the first int key
    cdef uint64_t* _bits  # the keys in [0, _DENSE_LIMIT): bit k of word k >> 6; NULL: none yet
    cdef Py_ssize_t _words  # words of _bits (a power of two)
    cdef Py_ssize_t _bit_count  # bits set
    cdef set _others
    # the window (0: none): the ring of the latest adds, their int keys (`_ring`) or, for the
    # other keys, the key in `_ring_objs` (None until the first such key) and its slot in `_at`
    cdef readonly Py_ssize_t window
    cdef int64_t* _ring
    cdef Py_ssize_t _ring_len, _ring_cap, _next
    cdef list _ring_objs
    cdef dict _at

    def __cinit__(self):
        self._ints.keys = self._ints.vals = NULL
        self._ints.size = 0
        self._ints.holds_min = False
        self._bits = NULL
        self._words = self._bit_count = 0
        self._others = set()
        self.window = 0
        self._ring = NULL
        self._ring_len = self._ring_cap = self._next = 0
        self._ring_objs = None
        self._at = {}

    def __init__(self, keys=(), window=None):
        if window is not None:
            if window <= 0:
                raise ValueError(f"window={window} must be a positive number of keys")
            self.window = window
        self.update(keys)

    def __dealloc__(self):
        _map_free(&self._ints)
        free(self._bits)
        free(self._ring)

    cdef Py_ssize_t _take_slot(self) except -1:
        # the ring slot of a new add: the next free one while the ring fills, else the oldest,
        # whose key leaves the set when that slot is still its latest add
        cdef Py_ssize_t slot, cap
        cdef int64_t* ring
        cdef object old
        if self._ring_len < self.window:
            if self._ring_len == self._ring_cap:  # grown by doubling up to the window
                cap = min(self.window, max(16, 2 * self._ring_cap))
                ring = <int64_t*>realloc(self._ring, cap * sizeof(int64_t))
                if ring == NULL:
                    raise MemoryError()
                self._ring, self._ring_cap = ring, cap
            self._ring_len += 1
            if self._ring_objs is not None:
                self._ring_objs.append(None)
            return self._ring_len - 1
        slot = self._next
        self._next = slot + 1 if slot + 1 < self.window else 0
        old = None if self._ring_objs is None else self._ring_objs[slot]
        if old is not None:
            if self._at.get(old) == slot:
                del self._at[old]
            self._ring_objs[slot] = None
        elif _map_get(&self._ints, self._ring[slot]) == slot:
            _map_del(&self._ints, self._ring[slot])
        return slot

    cdef int _window_add_int(self, int64_t value) except -1:
        cdef Py_ssize_t slot = self._take_slot()
        self._ring[slot] = value
        if self._ints.keys == NULL:
            _map_init(&self._ints, 16, True)
        return _map_put(&self._ints, value, slot)

    cdef int _window_add_other(self, object key) except -1:
        cdef Py_ssize_t slot
        if self._ring_objs is None:
            self._ring_objs = [None] * self._ring_len
        slot = self._take_slot()
        self._ring_objs[slot] = key
        self._at[key] = slot
        return 0

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
        if self.window:
            return self._ints.keys != NULL and _map_get(&self._ints, value) != _ABSENT
        if 0 <= value < _DENSE_LIMIT:
            return (value >> 6) < self._words and (self._bits[value >> 6] >> (value & 63)) & 1
        return self._ints.keys != NULL and _map_get(&self._ints, value) != _ABSENT

    cdef int _grow_bits(self, int64_t value) except -1:
        # words for keys up to `value`, doubling (the new words zero)
        cdef Py_ssize_t words = self._words or 16
        cdef uint64_t* bits
        while words <= (value >> 6):
            words <<= 1
        bits = <uint64_t*>realloc(self._bits, words * sizeof(uint64_t))
        if bits == NULL:
            raise MemoryError()
        memset(bits + self._words, 0, (words - self._words) * sizeof(uint64_t))
        self._bits, self._words = bits, words
        return 0

    cdef int _add_int(self, int64_t value) except -1:
        cdef uint64_t bit
        if self.window:
            return self._window_add_int(value)
        if 0 <= value < _DENSE_LIMIT:
            if (value >> 6) >= self._words:
                self._grow_bits(value)
            bit = (<uint64_t>1) << (value & 63)
            if not self._bits[value >> 6] & bit:
                self._bits[value >> 6] |= bit
                self._bit_count += 1
            return 0
        if self._ints.keys == NULL:
            _map_init(&self._ints, 16, False)
        return _map_put(&self._ints, value, 0)

    cdef bint _discard_int(self, int64_t value) noexcept:
        cdef uint64_t bit
        if self.window:  # its ring slot stays: it goes stale (no longer the key's latest add)
            return self._ints.keys != NULL and _map_del(&self._ints, value)
        if 0 <= value < _DENSE_LIMIT:
            if (value >> 6) >= self._words:
                return False
            bit = (<uint64_t>1) << (value & 63)
            if not self._bits[value >> 6] & bit:
                return False
            self._bits[value >> 6] &= ~bit
            self._bit_count -= 1
            return True
        return self._ints.keys != NULL and _map_del(&self._ints, value)

    cdef int add_key(self, object key) except -1:
        cdef int64_t value
        if self._as_int(key, &value):
            return self._add_int(value)
        if self.window:
            return self._window_add_other(key)
        self._others.add(key)
        return 0

    cdef bint discard_key(self, object key) except -1:
        """Discard `key`; True when it was held."""
        cdef int64_t value
        if self._as_int(key, &value):
            return self._discard_int(value)
        if self.window:
            return self._at.pop(key, None) is not None
        if key in self._others:
            self._others.discard(key)
            return True
        return False

    cdef bint has_key(self, object key) except -1:
        cdef int64_t value
        if self._as_int(key, &value):
            return self._find(value)
        return key in (self._at if self.window else self._others)

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
        if not self:
            return 0
        for key in keys:
            if self.discard_key(key):
                count += 1
        return count

    def clear(self):
        _map_free(&self._ints)
        self._ints.size = 0
        self._ints.holds_min = False
        free(self._bits)
        self._bits = NULL
        self._words = self._bit_count = 0
        self._others.clear()
        free(self._ring)
        self._ring = NULL
        self._ring_len = self._ring_cap = self._next = 0
        self._ring_objs = None
        self._at = {}

    @property
    def held(self):
        """Ring slots in use (at most `window`; 0 without a window): the bound's witness."""
        return self._ring_len

    def __contains__(self, key):
        return self.has_key(key)

    def __len__(self):
        return self._ints.size + self._bit_count + len(self._others) + len(self._at)

    def __bool__(self):
        return self._ints.size > 0 or self._bit_count > 0 or bool(self._others) or bool(self._at)

    def __iter__(self):
        # a snapshot: the bitmap's keys ascending, the table's ints in slot order (INT64_MIN,
        # kept aside, first), then the other keys
        cdef Py_ssize_t i, b
        cdef list keys = []
        for i in range(self._words if self._bit_count else 0):
            if self._bits[i]:
                for b in range(64):
                    if (self._bits[i] >> b) & 1:
                        keys.append(i * 64 + b)
        if self._ints.keys != NULL:
            if self._ints.holds_min:
                keys.append(_FREE)
            for i in range(self._ints.mask + 1):
                if self._ints.keys[i] != _FREE:
                    keys.append(self._ints.keys[i])
        keys.extend(self._others)
        keys.extend(self._at)
        return iter(keys)

    def __eq__(self, other):
        if isinstance(other, (KeySet, set, frozenset)):
            return len(self) == len(other) and all(key in self for key in other)
        return NotImplemented

    def __reduce__(self):
        # windowed: the whole ring, oldest slot first, each slot's key and whether that slot is
        # still its latest add: a copy keeps the stale slots too, so it drops what this would
        if not self.window:
            return (KeySet, (list(self), None))
        return (_window_from_ring, (self.window, self._ring_entries()))

    cdef list _ring_entries(self):
        cdef Py_ssize_t i, slot
        cdef list entries = []
        cdef object key
        for i in range(self._ring_len):
            slot = (self._next + i) % self._ring_len
            key = None if self._ring_objs is None else self._ring_objs[slot]
            if key is not None:
                entries.append((key, self._at.get(key) == slot))
            else:
                entries.append((self._ring[slot], _map_get(&self._ints, self._ring[slot]) == slot))
        return entries

    def __repr__(self):
        window = f", window {self.window}" if self.window else ""
        return f"KeySet({len(self)} keys{window})"

    def table_bytes(self):
        """Bytes of the int64 table, the bitmap and the window's ring (the Python part not counted)."""
        cdef Py_ssize_t per_slot = sizeof(int64_t) * (2 if self._ints.vals != NULL else 1)
        table = 0 if self._ints.keys == NULL else (self._ints.mask + 1) * per_slot
        return table + self._words * sizeof(uint64_t) + self._ring_cap * sizeof(int64_t)


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


# The C API of `KeySet` for int64 keys (declared in _core.pxd) for another compiled module: the
# simulator's radix loop keeps its re-prefill tracker's evicted keys in the tracker's own KeySet.

cdef int keyset_add_int(object keys, int64_t key) except -1:
    if type(keys) is not KeySet:
        raise TypeError(f"expected a KeySet, got {type(keys).__name__}")
    return (<KeySet>keys)._add_int(key)


cdef int keyset_discard_int(object keys, int64_t key) except -1:
    """1 when `key` was there (and is no more), else 0."""
    if type(keys) is not KeySet:
        raise TypeError(f"expected a KeySet, got {type(keys).__name__}")
    return 1 if (<KeySet>keys)._discard_int(key) else 0


def _window_from_ring(window, entries):
    """A windowed `KeySet` from its ring (`KeySet.__reduce__`): the adds replayed oldest first,
    then the keys none of whose slots is live discarded (their slots stay, as stale ones do)."""
    held = KeySet(window=window)
    for key, _ in entries:
        held.add(key)
    for key in {key for key, _ in entries} - {key for key, live in entries if live}:
        held.discard(key)
    return held
