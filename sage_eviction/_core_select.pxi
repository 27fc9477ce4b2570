# `select_victims` over `EvictionCandidate`: the candidate keys and the greedy choice.
# Part of sage_eviction/_core.pyx, which includes it: one extension module, split by idea;
# its reference is sage_eviction/sequence_level.py, `select_in_order`.

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


cdef bint order_key(object c, int kind, double* p, Key* k) noexcept:
    """The key of the preemption order of this kind (`sage_eviction.preemption.ORDERS`) as
    doubles; False when it cannot be exact."""
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
    """`select_in_order(candidates, required_blocks, order.key)` for the preemption order whose
    compiled kind is `kind` (with its constants `params`; `PreemptionOrder.compiled`): sequence ids in key order (ties by position),
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
            if type(c) is not _candidate_type or not order_key(c, code, p, &keys[m]):
                return None
            keys[m].index = i
            m += 1
        return take_in_order(keys, m, candidates, required)
    finally:
        PyMem_Free(keys)
