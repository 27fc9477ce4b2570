# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""The compiled core of sage_eviction: the score heap and the sequence-level victim choice.

Each piece mirrors a pure-Python reference that stays the fallback (sage_eviction/native.py
picks): `ScoreHeap` is `sage_eviction.heap._ListHeap`, `select_victims` is
`sage_eviction.sequence_level.select_in_order` over the policy's `candidate_key`. Both hold Python numbers
as C doubles only where a double compares exactly as the number does (a float that is not NaN,
an int or bool within 2**53); anything else makes them answer "not here" (False or None) and
the caller runs the pure-Python code, so results never differ (tests/test_native_core.py runs
both side by side).

`-ffp-contract=off`: no fused multiply-add, so the candidate keys are the very doubles Python's
own arithmetic gives.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.math cimport INFINITY, isnan, pow
from libc.string cimport memcpy

cdef extern from "Python.h":
    int PyFloat_CheckExact(object)
    double PyFloat_AS_DOUBLE(object)
    int PyLong_CheckExact(object)
    int PyBool_Check(object)
    int PyTuple_CheckExact(object)
    int PyObject_IsTrue(object) except -1
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1
    PyObject* PyDict_GetItemWithError(object, object) except? NULL
    int PyDict_DelItem(object, object) except -1
    Py_ssize_t PyTuple_GET_SIZE(object)
    PyObject* PyTuple_GET_ITEM(object, Py_ssize_t)
    PyObject* PyList_GET_ITEM(object, Py_ssize_t)
    Py_ssize_t PyList_GET_SIZE(object)

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
        int flags
    int T_OBJECT_EX

cdef extern from "descrobject.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

__all__ = ["ScoreHeap", "score_into", "select_victims", "sorted_keys"]

cdef double EXACT = 9007199254740992.0  # 2**53: every int up to it is a double
cdef long long EXACT_INT = (<long long>1) << 53  # (a C constant: a literal this big is a Python int)


cdef inline bint as_double(PyObject* v, double* out) noexcept:
    """`v` as the double that compares with every other such double as `v` does, if any."""
    cdef int overflow = 0
    cdef long long i
    cdef object o = <object>v
    if PyFloat_CheckExact(o):
        out[0] = PyFloat_AS_DOUBLE(o)
        return not isnan(out[0])
    if PyLong_CheckExact(o) or PyBool_Check(o):
        i = PyLong_AsLongLongAndOverflow(o, &overflow)
        if overflow or i > EXACT_INT or i < -EXACT_INT:
            return False
        out[0] = <double>i
        return True
    return False


# ---- the score heap ------------------------------------------------------------------------

ctypedef struct Entry:
    double k0
    double k1
    double k2
    PyObject* item  # a strong reference to the Python item tuple


cdef inline bint before(Entry* a, Entry* b) noexcept nogil:
    """Python's tuple order over the numbers (unused ones are 0 in both)."""
    if a.k0 != b.k0:
        return a.k0 < b.k0
    if a.k1 != b.k1:
        return a.k1 < b.k1
    return a.k2 < b.k2


cdef class ScoreHeap:
    """A 4-ary min-heap of item tuples `(*numbers, key)` (1 to 3 numbers, the same count for
    every item), ordered as the tuples are, with lazy deletion: an item is live while
    `live[key] is item`. The numbers sit in a C array beside each item, so a sift compares
    doubles in adjacent memory instead of following pointers to tuples and floats.

    The policies' items tie only between a stale item and the live one of the same key (their
    numbers end with a unique tick or push number), so any heap pops live items in the order
    heapq does.
    """

    cdef Entry* data  # data[1 + 4j .. 4 + 4j], siblings, share one 128-byte block
    cdef void* raw  # the allocation `data` lies in
    cdef Py_ssize_t size
    cdef Py_ssize_t cap
    cdef Py_ssize_t width  # numbers per item; 0 until the first item

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.size):
            Py_DECREF(<object>self.data[i].item)
        PyMem_Free(self.raw)

    def __len__(self):
        return self.size

    cdef bint _entry(self, object item, Entry* e) except -1:
        cdef Py_ssize_t n
        if not PyTuple_CheckExact(item):
            return False
        n = PyTuple_GET_SIZE(item) - 1
        if self.width == 0:
            if n < 1 or n > 3:
                return False
            self.width = n
        elif n != self.width:
            return False
        e.k1 = 0.0
        e.k2 = 0.0
        if not as_double(PyTuple_GET_ITEM(item, 0), &e.k0):
            return False
        if n > 1 and not as_double(PyTuple_GET_ITEM(item, 1), &e.k1):
            return False
        if n > 2 and not as_double(PyTuple_GET_ITEM(item, 2), &e.k2):
            return False
        e.item = <PyObject*>item
        return True

    cdef int _reserve(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        cdef Entry* data
        cdef void* raw
        if need <= self.cap:
            return 0
        cap = max(need, 2 * self.cap, 64)
        raw = PyMem_Malloc(cap * sizeof(Entry) + 128)
        if raw == NULL:
            raise MemoryError()
        # align &data[1] to 128 bytes: a node's four children are then two cache lines
        data = <Entry*>((((<uintptr_t>raw + sizeof(Entry)) + 127) & ~(<uintptr_t>127)) - sizeof(Entry))
        if self.size:
            memcpy(data, self.data, self.size * sizeof(Entry))
        PyMem_Free(self.raw)
        self.raw = raw
        self.data = data
        self.cap = cap
        return 0

    cdef void _sift_down(self, Py_ssize_t i) noexcept nogil:
        """Move data[i] down to its place (4-ary: children 4i+1 .. 4i+4)."""
        cdef Entry moving = self.data[i]
        cdef Py_ssize_t child, best, last, n = self.size
        while True:
            child = 4 * i + 1
            if child >= n:
                break
            best = child
            last = min(child + 4, n)
            child += 1
            while child < last:
                if before(&self.data[child], &self.data[best]):
                    best = child
                child += 1
            if not before(&self.data[best], &moving):
                break
            self.data[i] = self.data[best]
            i = best
        self.data[i] = moving

    cdef void _sift_up(self, Py_ssize_t i) noexcept nogil:
        cdef Entry moving = self.data[i]
        cdef Py_ssize_t parent
        while i > 0:
            parent = (i - 1) >> 2
            if not before(&moving, &self.data[parent]):
                break
            self.data[i] = self.data[parent]
            i = parent
        self.data[i] = moving

    cpdef bint push(self, object item) except -1:
        """Add `item`; False (nothing added) when its numbers are not all exact doubles."""
        cdef Entry e
        if not self._entry(item, &e):
            return False
        self._reserve(self.size + 1)
        Py_INCREF(item)
        self.data[self.size] = e
        self.size += 1
        self._sift_up(self.size - 1)
        return True

    cdef bint fill_unordered(self, object items) except -1:
        """Replace the contents with `items`, not yet in heap order; False, leaving the heap
        empty, when one of them is not all exact doubles."""
        cdef list seq = list(items)
        cdef Py_ssize_t i, n = len(seq)
        cdef Entry e
        self.clear()
        self._reserve(n)
        for i in range(n):
            if not self._entry(seq[i], &e):
                self.clear()
                return False
            Py_INCREF(seq[i])
            self.data[self.size] = e
            self.size += 1
        return True

    cpdef bint fill(self, object items) except -1:
        """Replace the contents with `items` (heapified at once); False, leaving the heap empty,
        when one of them is not all exact doubles."""
        cdef Py_ssize_t i, n
        if not self.fill_unordered(items):
            return False
        n = self.size
        i = (n - 2) >> 2 if n > 1 else -1
        while i >= 0:
            self._sift_down(i)
            i -= 1
        return True

    cpdef clear(self):
        cdef Py_ssize_t i
        cdef Py_ssize_t n = self.size
        self.size = 0
        self.width = 0
        for i in range(n):
            Py_DECREF(<object>self.data[i].item)

    cpdef object pop_live(self, dict live, dict ticks):
        """Pop items until one is live, delete its key from `live` and `ticks`, return it.

        Raises:
            IndexError: No live item is left.
        """
        cdef Entry top
        cdef object item, key
        cdef PyObject* current
        while self.size:
            top = self.data[0]
            self.size -= 1
            if self.size:
                self.data[0] = self.data[self.size]
                self._sift_down(0)
            item = <object>top.item
            Py_DECREF(item)  # `item` holds its own reference now
            key = <object>PyTuple_GET_ITEM(item, PyTuple_GET_SIZE(item) - 1)
            current = PyDict_GetItemWithError(live, key)
            if current == top.item:
                PyDict_DelItem(live, key)
                PyDict_DelItem(ticks, key)
                return item
        raise IndexError("pop from an empty score heap")

    def items(self):
        """Every item held, stale ones included, in no particular order."""
        cdef Py_ssize_t i
        return [<object>self.data[i].item for i in range(self.size)]

    def __reduce__(self):
        # pickle and deepcopy: the items (memoised with the policy's `_live`, so that the
        # identity `pop_live` checks survives), heapified again on load
        return (_score_heap_of, (self.items(),))


cdef int merge_sort(Entry* a, Py_ssize_t n) except -1:
    """Sort a[0:n] by `before`, stably: bottom-up merges through a buffer (the comparison
    inlined, which libc's qsort cannot: 3x faster at 1e6 entries)."""
    cdef Entry* buf = <Entry*>PyMem_Malloc(n * sizeof(Entry) if n > 0 else 1)
    cdef Entry* src = a
    cdef Entry* dst = buf
    cdef Entry* tmp
    cdef Py_ssize_t width = 1, lo, mid, hi, i, j, k
    if buf == NULL:
        raise MemoryError()
    with nogil:
        while width < n:
            lo = 0
            while lo < n:
                mid = min(lo + width, n)
                hi = min(lo + 2 * width, n)
                i, j, k = lo, mid, lo
                while i < mid and j < hi:
                    if before(&src[j], &src[i]):
                        dst[k] = src[j]
                        j += 1
                    else:
                        dst[k] = src[i]
                        i += 1
                    k += 1
                while i < mid:
                    dst[k] = src[i]
                    i += 1
                    k += 1
                while j < hi:
                    dst[k] = src[j]
                    j += 1
                    k += 1
                lo = hi
            tmp = src
            src = dst
            dst = tmp
            width *= 2
    if src != a:
        memcpy(a, src, n * sizeof(Entry))
    PyMem_Free(buf)
    return 0


def sorted_keys(object items):
    """`[item[-1] for item in sorted(items)]` for live items `(*numbers, key)` whose numbers
    tell every two apart (they end with a unique tick or push number), by a C sort of their
    doubles (stable, as `sorted`); None when one is not all exact doubles (then Python sorts them)."""
    cdef ScoreHeap holder = ScoreHeap()  # converts the items and owns the references
    cdef Py_ssize_t i
    cdef list out
    if not holder.fill_unordered(items):
        return None
    merge_sort(holder.data, holder.size)
    out = [None] * holder.size
    for i in range(holder.size):
        out[i] = <object>PyTuple_GET_ITEM(<object>holder.data[i].item, PyTuple_GET_SIZE(<object>holder.data[i].item) - 1)
    return out


def _score_heap_of(items):
    heap = ScoreHeap()
    if not heap.fill(items):
        raise ValueError("score heap items that are not all numbers and a key")
    return heap


# ---- select_victims over EvictionCandidate ---------------------------------------------------

ctypedef struct Key:
    double k0
    double k1
    double k2
    Py_ssize_t index


cdef inline bint key_before(Key* a, Key* b) noexcept nogil:
    """Candidate order: the key tuple, then the position (the stable sort's tie-break)."""
    if a.k0 != b.k0:
        return a.k0 < b.k0
    if a.k1 != b.k1:
        return a.k1 < b.k1
    if a.k2 != b.k2:
        return a.k2 < b.k2
    return a.index < b.index


cdef enum Kind:
    LRU, MRU, FIFO, FILO, LFU, PRIORITY, SEEN_ONCE_FIRST, S3FIFO, GDSF, PREDICTIVE, SLO

cdef dict KINDS = {
    "lru": LRU, "mru": MRU, "fifo": FIFO, "filo": FILO, "lfu": LFU, "priority": PRIORITY,
    "seen_once_first": SEEN_ONCE_FIRST, "s3fifo": S3FIFO, "gdsf": GDSF,
    "predictive": PREDICTIVE, "slo": SLO,
}

# EvictionCandidate's slot offsets, read once from its member descriptors
cdef object _candidate_type = None
cdef Py_ssize_t OFF_SEQ, OFF_BLOCKS, OFF_TIME, OFF_COUNT, OFF_PRIORITY, OFF_PINNED
cdef Py_ssize_t OFF_LIFETIME, OFF_SEQ_LEN, OFF_MAX_LEN


cdef Py_ssize_t _offset(object cls, str name) except -1:
    descr = cls.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef* member = (<PyMemberDescrObject*><PyObject*>descr).d_member
    if member.type != T_OBJECT_EX:
        raise TypeError(f"{cls.__name__}.{name} is not an object slot")
    return member.offset


def bind_candidate_type(cls):
    """Read the slot offsets of `cls` (`sage_eviction.types.EvictionCandidate`, a slots
    dataclass); only candidates of exactly this type are read through them."""
    global _candidate_type, OFF_SEQ, OFF_BLOCKS, OFF_TIME, OFF_COUNT, OFF_PRIORITY, OFF_PINNED
    global OFF_LIFETIME, OFF_SEQ_LEN, OFF_MAX_LEN
    OFF_SEQ = _offset(cls, "sequence_id")
    OFF_BLOCKS = _offset(cls, "block_ids")
    OFF_TIME = _offset(cls, "last_access_time")
    OFF_COUNT = _offset(cls, "access_count")
    OFF_PRIORITY = _offset(cls, "priority")
    OFF_PINNED = _offset(cls, "is_pinned")
    OFF_LIFETIME = _offset(cls, "estimated_lifetime")
    OFF_SEQ_LEN = _offset(cls, "sequence_length")
    OFF_MAX_LEN = _offset(cls, "max_length")
    _candidate_type = cls


from sage_eviction.types import EvictionCandidate as _EvictionCandidate  # noqa: E402

bind_candidate_type(_EvictionCandidate)


cdef inline PyObject* slot(object obj, Py_ssize_t offset) noexcept:
    """The slot's value (borrowed), NULL when unset."""
    return (<PyObject**>((<char*><PyObject*>obj) + offset))[0]


cdef inline bint field(object c, Py_ssize_t offset, double* out) noexcept:
    cdef PyObject* v = slot(c, offset)
    return v != NULL and as_double(v, out)


cdef inline bint exact_int(object c, Py_ssize_t offset, long long* out) noexcept:
    """An int slot within +-2**31 (so that sums and products of two stay exact doubles)."""
    cdef PyObject* v = slot(c, offset)
    cdef int overflow = 0
    if v == NULL or not (PyLong_CheckExact(<object>v) or PyBool_Check(<object>v)):
        return False
    out[0] = PyLong_AsLongLongAndOverflow(<object>v, &overflow)
    return not overflow and -2147483648 <= out[0] <= 2147483647


cdef inline bint is_int(object c, Py_ssize_t offset) noexcept:
    cdef PyObject* v = slot(c, offset)
    return v != NULL and (PyLong_CheckExact(<object>v) or PyBool_Check(<object>v))


cdef inline bint s3fifo_key(object c, double* p, Key* k) noexcept:
    """(0, 0, t) seen once, else (1, min(count, max_freq), t); p[0]: max_freq."""
    cdef double a
    if not field(c, OFF_COUNT, &a):
        return False
    if a < 2:
        k.k0 = 0.0
    else:
        k.k0 = 1.0
        k.k1 = a if a < p[0] else p[0]
    return field(c, OFF_TIME, &k.k2)


cdef inline bint gdsf_key(object c, Key* k) noexcept:
    """((access_count + 1) * sequence_length / max(len(block_ids), 1), t)."""
    cdef double a, b, v
    cdef long long ia, ib, blocks
    cdef PyObject* ids = slot(c, OFF_BLOCKS)
    if ids == NULL or type(<object>ids) is not list:
        return False
    blocks = PyList_GET_SIZE(<object>ids)
    if blocks < 1:
        blocks = 1
    if exact_int(c, OFF_COUNT, &ia) and exact_int(c, OFF_SEQ_LEN, &ib):
        # Python multiplies the ints exactly and divides them correctly rounded: so does
        # a double division of the exact product (|product| < 2**63, checked < 2**53)
        v = <double>((ia + 1) * ib)
        if v > EXACT or v < -EXACT:
            return False
        k.k0 = v / <double>blocks
    elif is_int(c, OFF_COUNT) or is_int(c, OFF_SEQ_LEN):
        return False  # int and float mixed: rare, left to Python
    else:
        if not (field(c, OFF_COUNT, &a) and field(c, OFF_SEQ_LEN, &b)):
            return False
        k.k0 = (a + 1.0) * b / <double>blocks
    return not isnan(k.k0) and field(c, OFF_TIME, &k.k1)


cdef inline bint predictive_key(object c, double* p, Key* k) noexcept:
    """(predicted end, -completion, t); p: decode_time_per_token, by_tokens (1.0 or 0.0)."""
    cdef long long ia, ib
    cdef PyObject* lifetime
    if not (exact_int(c, OFF_SEQ_LEN, &ia) and exact_int(c, OFF_MAX_LEN, &ib)):
        return False
    lifetime = slot(c, OFF_LIFETIME)
    if lifetime == NULL:
        return False
    if <object>lifetime is not None:
        if not as_double(lifetime, &k.k0):
            return False
    elif ib > 0 and p[1] != 0.0:
        k.k0 = <double>(ib - ia if ib > ia else 0) * p[0]
    else:
        k.k0 = INFINITY
    k.k1 = -(<double>ia / <double>ib) if ib > 0 else -0.0
    return not isnan(k.k0) and field(c, OFF_TIME, &k.k2)


cdef double URGENCY[33]  # pow(base, i) / slack for i in -16..16, filled per SLO call


cdef inline bint slo_key(object c, double* p, Key* k) noexcept:
    """(protected, urgency + cost, t); p: priority_base, slack + eps, cost_weight,
    protect_completion."""
    cdef double v
    cdef long long ia, ib, priority
    if not (exact_int(c, OFF_SEQ_LEN, &ia) and exact_int(c, OFF_MAX_LEN, &ib)):
        return False
    if not exact_int(c, OFF_PRIORITY, &priority) or priority < -1000 or priority > 1000:
        return False
    k.k0 = 1.0 if ib > 0 and <double>ia >= p[3] * <double>ib else 0.0
    # pow(base, priority) / slack: a table for the usual priorities (pow costs ~30 ns)
    v = (URGENCY[priority + 16] if -16 <= priority <= 16 else pow(p[0], <double>priority) / p[1])
    v = v + p[2] * <double>ia
    if isnan(v) or v == INFINITY or v == -INFINITY:
        return False  # Python raises on the overflow: let it
    k.k1 = v
    return field(c, OFF_TIME, &k.k2)


cdef bint candidate_key(object c, int kind, double* p, Key* k) noexcept:
    """The key of `candidate_key` for this kind as doubles; False when it cannot be exact."""
    cdef double t, a
    k.k1 = 0.0
    k.k2 = 0.0
    if kind == LRU:
        return field(c, OFF_TIME, &k.k0)
    if kind == MRU:
        if not field(c, OFF_TIME, &t):
            return False
        k.k0 = -t
        return True
    if kind == FIFO:
        return field(c, OFF_SEQ, &k.k0)
    if kind == FILO:
        if not field(c, OFF_SEQ, &t):
            return False
        k.k0 = -t
        return True
    if kind == LFU:
        return field(c, OFF_COUNT, &k.k0) and field(c, OFF_TIME, &k.k1)
    if kind == PRIORITY:
        return field(c, OFF_PRIORITY, &k.k0) and field(c, OFF_TIME, &k.k1)
    if kind == SEEN_ONCE_FIRST:  # (access_count > 1, last_access_time)
        if not field(c, OFF_COUNT, &a):
            return False
        k.k0 = 1.0 if a > 1 else 0.0
        return field(c, OFF_TIME, &k.k1)
    if kind == S3FIFO:
        return s3fifo_key(c, p, k)
    if kind == GDSF:
        return gdsf_key(c, k)
    if kind == PREDICTIVE:
        return predictive_key(c, p, k)
    if kind == SLO:
        return slo_key(c, p, k)
    return False


cdef void key_sift_down(Key* h, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    cdef Key moving = h[i]
    cdef Py_ssize_t child
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and key_before(&h[child + 1], &h[child]):
            child += 1
        if not key_before(&h[child], &moving):
            break
        h[i] = h[child]
        i = child
    h[i] = moving


cdef object take_in_order(Key* keys, Py_ssize_t m, list candidates, Py_ssize_t required):
    """Heapify the `m` keys and pop them in order, taking unpinned candidates until they free
    `required` blocks: their sequence ids, or None when a candidate lacks a slot."""
    cdef Py_ssize_t i = (m - 2) // 2 if m > 1 else -1
    cdef Py_ssize_t freed = 0
    cdef Key top
    cdef object c
    cdef PyObject* pinned
    cdef list victims = []
    while i >= 0:
        key_sift_down(keys, m, i)
        i -= 1
    while m:
        top = keys[0]
        m -= 1
        if m:
            keys[0] = keys[m]
            key_sift_down(keys, m, 0)
        c = <object>PyList_GET_ITEM(candidates, top.index)
        pinned = slot(c, OFF_PINNED)
        if pinned == NULL:
            return None
        if not <object>pinned:
            if slot(c, OFF_BLOCKS) == NULL or slot(c, OFF_SEQ) == NULL:
                return None
            victims.append(<object>slot(c, OFF_SEQ))
            freed += len(<object>slot(c, OFF_BLOCKS))
            if freed >= required:
                break
    return victims


def select_victims(list candidates, object required_blocks, str kind, tuple params):
    """`select_in_order(candidates, required_blocks, candidate_key)` for the `candidate_key`
    named `kind` (with its constants `params`): sequence ids in key order (ties by position),
    unpinned only, until they free `required_blocks` blocks.

    Returns None when the answer must come from Python: a candidate of another type, a
    `required_blocks` that is not an int, a key that is not an exact double.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(candidates)
    cdef Py_ssize_t i, m = 0, required
    cdef int code
    cdef double p[4]
    cdef Key* keys
    cdef object c
    if _candidate_type is None or type(required_blocks) is not int:
        return None
    required = required_blocks
    if required <= 0:
        return []
    code = KINDS.get(kind, -1)
    if code < 0 or len(params) > 4:
        return None
    for i in range(4):
        p[i] = params[i] if i < len(params) else 0.0
    if code == SLO:
        for i in range(33):
            URGENCY[i] = pow(p[0], <double>(i - 16)) / p[1]
    keys = <Key*>PyMem_Realloc(NULL, (n if n > 0 else 1) * sizeof(Key))
    if keys == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            c = <object>PyList_GET_ITEM(candidates, i)
            if type(c) is not _candidate_type or not candidate_key(c, code, p, &keys[m]):
                return None
            keys[m].index = i
            m += 1
        return take_in_order(keys, m, candidates, required)
    finally:
        PyMem_Free(keys)


# ---- scoring a bulk load (a hot swap into a heap policy) ---------------------------------------

cdef object _meta_type = None
cdef Py_ssize_t M_SIZE, M_COST, M_PRIORITY, M_LAST, M_HITS, M_LIFETIME, M_SEQ_LEN, M_MAX_LEN
cdef Py_ssize_t M_DEADLINE


def bind_meta_type(cls):
    """Read the slot offsets of `cls` (`sage_eviction.types.EntryMeta`, a slots dataclass)."""
    global _meta_type, M_SIZE, M_COST, M_PRIORITY, M_LAST, M_HITS, M_LIFETIME, M_SEQ_LEN
    global M_MAX_LEN, M_DEADLINE
    M_SIZE = _offset(cls, "size")
    M_COST = _offset(cls, "cost")
    M_PRIORITY = _offset(cls, "priority")
    M_LAST = _offset(cls, "last_access")
    M_HITS = _offset(cls, "hits")
    M_LIFETIME = _offset(cls, "estimated_lifetime")
    M_SEQ_LEN = _offset(cls, "seq_len")
    M_MAX_LEN = _offset(cls, "max_len")
    M_DEADLINE = _offset(cls, "deadline")
    _meta_type = cls


cdef inline bint exact_float(object m, Py_ssize_t offset, double* out) noexcept:
    """A float slot (exactly a float: no int, whose arithmetic Python keeps exact)."""
    cdef PyObject* v = slot(m, offset)
    if v == NULL or not PyFloat_CheckExact(<object>v):
        return False
    out[0] = PyFloat_AS_DOUBLE(<object>v)
    return True


cdef inline bint number(object m, Py_ssize_t offset, double* out) noexcept:
    """A float slot, or an int slot within +-2**31 (converted exactly in any product here)."""
    cdef long long i
    if exact_float(m, offset, out):
        return True
    if exact_int(m, offset, &i):
        out[0] = <double>i
        return True
    return False


cdef object gdsf_item(object m, double* p, object tick, object key):
    """(L + (hits + 1) * cost / max(size, 1), tick, key); p[0]: L. None: left to Python."""
    cdef long long hits, size, icost
    cdef double cost, h
    if not exact_int(m, M_HITS, &hits) or not exact_int(m, M_SIZE, &size):
        return None
    if size < 1:
        size = 1
    if exact_float(m, M_COST, &cost):
        h = (<double>(hits + 1) * cost) / <double>size
    elif exact_int(m, M_COST, &icost):
        # Python multiplies the ints exactly and divides them correctly rounded (|product| < 2**62)
        if (hits + 1) * icost > EXACT_INT or (hits + 1) * icost < -EXACT_INT:
            return None
        h = <double>((hits + 1) * icost) / <double>size
    else:
        return None
    return (p[0] + h, tick, key)


cdef object slo_item(object m, double* p, object tick, object key):
    """(protected, urgency + cost_weight * cost, tick, key); p: priority_base, eps, cost_weight,
    default_slack, protect_completion."""
    cdef long long priority, seq_len, max_len
    cdef double last, deadline, slack, urgency, cost, power
    cdef PyObject* d = slot(m, M_DEADLINE)
    if not exact_int(m, M_PRIORITY, &priority) or priority < -1000 or priority > 1000:
        return None
    if not (exact_int(m, M_SEQ_LEN, &seq_len) and exact_int(m, M_MAX_LEN, &max_len)):
        return None
    if not number(m, M_COST, &cost):
        return None
    if d == NULL:
        return None
    if <object>d is None:
        slack = p[3]
    else:
        if not (exact_float(m, M_DEADLINE, &deadline) and exact_float(m, M_LAST, &last)):
            return None
        slack = deadline - last
    if slack >= 0.0:
        power = pow(p[0], <double>priority)
        if power == INFINITY or isnan(power) or (power != 0.0 and power < 2.2250738585072014e-308):
            return None  # Python raises on overflow (and on a subnormal result): let it
        urgency = power / (slack + p[1])
    else:
        urgency = 0.0
    protected = max_len > 0 and <double>seq_len >= p[4] * <double>max_len
    return (protected, urgency + p[2] * cost, tick, key)


cdef object predictive_item(object m, double* p, object tick, object key):
    """(predicted end, -completion, tick, key) with the default predictor; p: decode time per
    token, its token-estimate confidence, the confidence threshold."""
    cdef long long seq_len, max_len, remaining
    cdef double last, lifetime, confidence, end = INFINITY, completion
    cdef PyObject* lt = slot(m, M_LIFETIME)
    cdef bint predicted = True
    if not (exact_int(m, M_SEQ_LEN, &seq_len) and exact_int(m, M_MAX_LEN, &max_len)):
        return None
    if lt == NULL or not exact_float(m, M_LAST, &last):
        return None
    if <object>lt is not None:
        if not number(m, M_LIFETIME, &lifetime):
            return None
        confidence = 1.0
    elif max_len > 0:
        remaining = max_len - seq_len if max_len > seq_len else 0
        lifetime = <double>remaining * p[0]
        confidence = p[1]
    else:
        predicted = False
    if predicted and confidence >= p[2] and not isnan(lifetime):
        end = last + lifetime
    completion = <double>seq_len / <double>max_len if max_len > 0 else 0.0
    return (end, -completion, tick, key)


def score_into(dict live, str kind, tuple params, list keys, list metas, list flags, Py_ssize_t first):
    """A heap policy's bulk load: `live[key] = (*_score(key, meta), key)` for each evictable
    entry, entry i with tick `first + i`, as `FlatHeapPolicy._load_bulk` scores them in Python.
    `kind` names the policy's `_score` ("gdsf", "slo", "predictive" with the default predictor)
    and `params` its constants. False, having stopped part way, when an entry's score is one
    only Python computes exactly (the caller clears `live` and scores in Python)."""
    cdef Py_ssize_t i, n = len(keys)
    cdef double p[5]
    cdef object m, item
    cdef int code
    if _meta_type is None or len(metas) != n or len(flags) != n or len(params) > 5:
        return False
    code = 0 if kind == "gdsf" else 1 if kind == "slo" else 2 if kind == "predictive" else -1
    if code < 0:
        return False
    for i in range(5):
        p[i] = params[i] if i < len(params) else 0.0
    for i in range(n):
        if not PyObject_IsTrue(<object>PyList_GET_ITEM(flags, i)):
            continue
        m = <object>PyList_GET_ITEM(metas, i)
        if type(m) is not _meta_type:
            return False
        if code == 0:
            item = gdsf_item(m, p, first + i, <object>PyList_GET_ITEM(keys, i))
        elif code == 1:
            item = slo_item(m, p, first + i, <object>PyList_GET_ITEM(keys, i))
        else:
            item = predictive_item(m, p, first + i, <object>PyList_GET_ITEM(keys, i))
        if item is None:
            return False
        live[<object>PyList_GET_ITEM(keys, i)] = item
    return True


from sage_eviction.types import EntryMeta as _EntryMeta  # noqa: E402

bind_meta_type(_EntryMeta)
