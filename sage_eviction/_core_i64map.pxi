# int64 keys in open-addressing tables: `I64Map` (a map to int64 values >= 0, or a set).
# Part of sage_eviction/_core.pyx, included before the compact key set (_core_keyset.pxi, the
# evicted keys of the policies and the re-prefill tracker) and the flat cache's state
# (_core_flat_state.pxi: its keys, its ghosts and its evicted keys): the core's one hash table.

from libc.stdint cimport INT64_MIN, int64_t, uint64_t
from libc.stdlib cimport free, malloc

cdef int64_t _FREE = INT64_MIN  # a free slot's key; the key INT64_MIN itself is kept aside
cdef int64_t _ABSENT = -1  # what a lookup of a missing key gives (every value is >= 0)


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    # splitmix64's finaliser: block ids are often consecutive, and linear probing needs spread
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef struct I64Map:
    # int64 keys (-> int64 values >= 0 when `vals` is not NULL; a set without), open addressing
    # with linear probing and backward-shift deletion (no tombstones: a long run of inserts and
    # deletes keeps its probe lengths). A set costs 8 bytes a slot, a map 16.
    int64_t* keys  # _FREE: a free slot
    int64_t* vals
    Py_ssize_t mask
    Py_ssize_t size
    bint holds_min  # the key INT64_MIN (which marks free slots) is held
    int64_t min_val


cdef int _map_init(I64Map* m, Py_ssize_t slots, bint with_values) except -1:
    cdef Py_ssize_t n = 16
    cdef Py_ssize_t i
    while n < slots:
        n <<= 1
    m.keys = <int64_t*>malloc(n * sizeof(int64_t))
    m.vals = <int64_t*>malloc(n * sizeof(int64_t)) if with_values else NULL
    if m.keys == NULL or (with_values and m.vals == NULL):
        _map_free(m)
        raise MemoryError()
    for i in range(n):
        m.keys[i] = _FREE
    m.mask = n - 1
    m.size = 0
    m.holds_min = False
    m.min_val = _ABSENT
    return 0


cdef void _map_free(I64Map* m) noexcept:
    free(m.keys)
    free(m.vals)
    m.keys = m.vals = NULL


cdef inline Py_ssize_t _map_slot(I64Map* m, int64_t key) noexcept nogil:
    # the slot holding `key` (not INT64_MIN), or the free slot where it would go
    cdef Py_ssize_t i = <Py_ssize_t>(_mix(<uint64_t>key) & <uint64_t>m.mask)
    while m.keys[i] != _FREE and m.keys[i] != key:
        i = (i + 1) & m.mask
    return i


cdef inline int64_t _map_get(I64Map* m, int64_t key) noexcept nogil:
    # the value of `key` (0 for a key of a set), or _ABSENT
    cdef Py_ssize_t i
    if key == _FREE:
        return m.min_val if m.holds_min else _ABSENT
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        return _ABSENT
    return m.vals[i] if m.vals != NULL else 0


cdef int _map_grow(I64Map* m) except -1:
    cdef I64Map old = m[0]
    cdef Py_ssize_t i, j
    _map_init(m, (old.mask + 1) * 2, old.vals != NULL)
    for i in range(old.mask + 1):
        if old.keys[i] != _FREE:
            j = _map_slot(m, old.keys[i])
            m.keys[j] = old.keys[i]
            if m.vals != NULL:
                m.vals[j] = old.vals[i]
    m.size = old.size
    m.holds_min = old.holds_min
    m.min_val = old.min_val
    _map_free(&old)
    return 0


cdef int _map_put(I64Map* m, int64_t key, int64_t val) except -1:
    cdef Py_ssize_t i
    if key == _FREE:
        m.size += not m.holds_min
        m.holds_min = True
        m.min_val = val
        return 0
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        if (m.size + 1) * 4 > (m.mask + 1) * 3:  # keep the load under 3/4
            _map_grow(m)
            i = _map_slot(m, key)
        m.size += 1
        m.keys[i] = key
    if m.vals != NULL:
        m.vals[i] = val
    return 0


cdef bint _map_del(I64Map* m, int64_t key) noexcept nogil:
    # remove `key`; whether it was there. The entries after it in its run move back into the
    # hole when their home slot is not cyclically between the hole and where they sit.
    cdef Py_ssize_t i, j, home
    if key == _FREE:
        if not m.holds_min:
            return False
        m.holds_min = False
        m.size -= 1
        return True
    i = _map_slot(m, key)
    if m.keys[i] == _FREE:
        return False
    j = i
    while True:
        j = (j + 1) & m.mask
        if m.keys[j] == _FREE:
            break
        home = <Py_ssize_t>(_mix(<uint64_t>m.keys[j]) & <uint64_t>m.mask)
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            m.keys[i] = m.keys[j]
            if m.vals != NULL:
                m.vals[i] = m.vals[j]
            i = j
    m.keys[i] = _FREE
    m.size -= 1
    return True
