# `score_into`: scoring a bulk load (a hot swap into a heap policy).
# Part of sage_eviction/_core.pyx, which includes it: one extension module, split by idea;
# its reference is each heap policy's `_score` (sage_eviction/heap.py, `FlatHeapPolicy._load_bulk`).

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
