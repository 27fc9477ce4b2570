# The C-level policy interface: `PolicyOps` (declared in _core.pxd), `ops_for`, and `PolicyOpsCaller`.
# Part of sage_eviction/_core.pyx, which includes it: the base operations of `EvictionPolicy`
# (sage_eviction/base.py: insert, access, set_evictable, evict(1)) in C, over the policy object's
# own attributes, and the table of each built-in class's hooks (this file: the recency queues of
# recency.py; the other _core_ops_*.pxi files: the other policies).
#
# Why over the Python state: the policy stays one object with one state, whichever path changed
# it. Its Python methods (explain, entries, metrics, a hot swap's handover) read what the C calls
# wrote, and a test can compare a policy driven through these functions with one driven through
# its methods attribute for attribute. What the C path saves is the Python frames (four or five
# per block: the public method, the hook, the queue's method) and the method lookups.

import time as _time
from heapq import heapify as _heapify, heappop as _heappop, heappush as _heappush

from sage_eviction.errors import DuplicateKeyError, PolicyStateError, UnknownKeyError
from sage_eviction.metrics import MAX_TENANTS as _MAX_TENANTS_VALUE, OTHER_TENANTS as _OTHER_TENANTS
from sage_eviction.types import EntryMeta as _EntryMeta

# ---- a default EntryMeta without a Python frame ----------------------------------------------------
#
# `insert(key)` without a meta builds `EntryMeta()`: through the dataclass's __init__ (a Python frame
# filling 16 defaults) it costs more than the rest of a flat miss. Where EntryMeta is a slots
# dataclass whose fields all have plain defaults (no factory, no __post_init__, plain allocation),
# the record is allocated and each slot is given the default object, which is what __init__ stores.
# Anything else falls back to calling EntryMeta().

cdef extern from "Python.h":
    ctypedef struct PyTypeObject
    object PyType_GenericAlloc(PyTypeObject* cls, Py_ssize_t nitems)

cdef Py_ssize_t _default_offsets[32]
cdef PyObject* _default_values[32]
cdef Py_ssize_t _num_defaults = -1  # -1: not read yet; 0: call EntryMeta()
cdef list _default_objects = []  # keeps the default values alive


cdef int _read_defaults() except -1:
    global _num_defaults
    import dataclasses

    cls = _EntryMeta
    _num_defaults = 0
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    if (not fields or len(fields) > 32 or hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__
            or type(cls).__call__ is not type.__call__ or cls.__init__ is object.__init__):
        return 0
    for i, field in enumerate(fields):
        if field.default is dataclasses.MISSING or not field.init:
            return 0
        try:
            _default_offsets[i] = _offset(cls, field.name)
        except (KeyError, TypeError):
            return 0
        _default_objects.append(field.default)
        _default_values[i] = <PyObject*>field.default
    _num_defaults = len(fields)
    return 0


cdef object default_meta():
    """`EntryMeta()`."""
    cdef Py_ssize_t i
    cdef object meta
    if _num_defaults < 0:
        _read_defaults()
    if _num_defaults == 0:
        return _EntryMeta()
    meta = PyType_GenericAlloc(<PyTypeObject*>_EntryMeta, 0)
    for i in range(_num_defaults):
        Py_INCREF(<object>_default_values[i])  # the slot's reference (fresh slots are NULL)
        (<PyObject**>((<char*><PyObject*>meta) + _default_offsets[i]))[0] = _default_values[i]
    return meta


def new_default_meta():
    """`EntryMeta()` as the compiled operations build it (for the tests)."""
    return default_meta()


# ---- the base operations (EvictionPolicy's public methods) ---------------------------------------
#
# A registered class's state lives in plain instance attributes (its class defines no descriptor of
# those names), so they are read and written in the instance's __dict__: one dict operation each,
# without the generic attribute lookup's walk of the class first (half of an operation's cost).

cdef extern from "Python.h":
    PyObject** _PyObject_GetDictPtr(object obj)


cdef inline dict attrs(object obj):
    """`obj.__dict__` (made now if the instance keeps its attributes inline)."""
    cdef PyObject** where = _PyObject_GetDictPtr(obj)
    if where == NULL or where[0] == NULL:
        return obj.__dict__
    return <dict>where[0]


cdef inline object tick_clock(dict a):
    # policy._clock += 1
    clock = a["_clock"] + 1
    a["_clock"] = clock
    return clock


cdef Py_ssize_t _MAX_TENANTS = _MAX_TENANTS_VALUE


cdef inline int _count_tenant(dict a, object meta, bint hit) except -1:
    # the `_tenants` counters: [hits, lookups] per tenant, up to MAX_TENANTS of them, the rest
    # under OTHER_TENANTS (sage_eviction/metrics.py, `count_tenant`, line for line)
    cdef dict tenants = a["_tenants"]
    cdef object tenant = meta.tenant
    cdef object counts = tenants.get(tenant)
    if counts is None:
        if len(tenants) >= _MAX_TENANTS:
            tenant = _OTHER_TENANTS
            counts = tenants.get(tenant)
        if counts is None:
            tenants[tenant] = [1 if hit else 0, 1]
            return 0
    if hit:
        counts[0] += 1
    counts[1] += 1
    return 0


cdef int base_insert(PolicyOps* ops, object policy, object key, object meta, bint evictable) except -1:
    cdef dict a = attrs(policy)
    cdef dict metas = a["_meta"]
    if key in metas:
        raise DuplicateKeyError(f"{policy.name}: key {key!r} is already in the policy")
    if meta is None:
        meta = default_meta()
    tick_clock(a)
    metas[key] = meta
    if evictable:
        (<set>a["_evictable"]).add(key)
    if evicted_discard(a["_evicted"], key):
        a["_re_prefills"] = a["_re_prefills"] + 1
    _count_tenant(a, meta, False)
    return ops.on_insert(policy, key, meta, evictable)


cdef int base_access(PolicyOps* ops, object policy, object key, object now) except -1:
    cdef dict a = attrs(policy)
    cdef object meta = (<dict>a["_meta"]).get(key)
    if meta is None:
        raise UnknownKeyError(f"{policy.name}: access of key {key!r}, which is not in the policy")
    tick_clock(a)
    meta.hits += 1
    meta.last_access = _time.time() if now is None else now
    _count_tenant(a, meta, True)
    return ops.on_access(policy, key, meta)


cdef int base_set_evictable(PolicyOps* ops, object policy, object key, bint evictable) except -1:
    cdef dict a = attrs(policy)
    cdef object meta = (<dict>a["_meta"]).get(key)
    cdef set held
    if meta is None:
        raise UnknownKeyError(f"{policy.name}: set_evictable of key {key!r}, which is not in the policy")
    held = a["_evictable"]
    if evictable:
        if key in held:
            return 0
        held.add(key)
    else:
        if key not in held:
            return 0
        held.discard(key)
    return ops.on_evictable(policy, key, meta, evictable)


cdef object base_evict_one(PolicyOps* ops, object policy, bint* found):
    # evict(1): the victim leaves the evictable set and the metadata, joins the evicted keys
    cdef dict a = attrs(policy)
    cdef set held = a["_evictable"]
    if not held:
        found[0] = False
        return None
    key = ops.pop_victim(policy)
    held.discard(key)
    del (<dict>a["_meta"])[key]
    evicted_add(a["_evicted"], key)
    a["_evictions"] = a["_evictions"] + 1
    found[0] = True
    return key


# ---- the table -----------------------------------------------------------------------------------

DEF _MAX_OPS = 32
cdef PolicyOps _ops[_MAX_OPS]
cdef Py_ssize_t _num_ops = 0
cdef dict _ops_index = None  # policy class -> its index in _ops; None until the table is built
cdef tuple _built_in = ()  # the classes registered with the table (not those given one by share_ops)


cdef PolicyOps hooked(OnInsertHook on_insert, OnAccessHook on_access, OnEvictableHook on_evictable,
                      PopVictimHook pop_victim) noexcept:
    """A table of `EvictionPolicy`'s own four operations over the class's four hooks."""
    cdef PolicyOps ops
    ops.insert = base_insert
    ops.access = base_access
    ops.set_evictable = base_set_evictable
    ops.evict_one = base_evict_one
    ops.on_insert = on_insert
    ops.on_access = on_access
    ops.on_evictable = on_evictable
    ops.pop_victim = pop_victim
    return ops


cdef int register(object cls, PolicyOps ops) except -1:
    global _num_ops
    if _num_ops >= _MAX_OPS:
        raise RuntimeError("the compiled policy table is full")
    _ops[_num_ops] = ops
    _ops_index[cls] = _num_ops
    _num_ops += 1
    return 0


cdef int _build_table() except -1:
    # Lazily, at the first policy asked about: the policies import sage_eviction.base, which
    # imports this module through sage_eviction.native.
    global _ops_index, _built_in
    _ops_index = {}
    _register_recency()
    _register_levelled()
    _register_sieve()
    _register_heap()
    _register_ghosts()
    _built_in = tuple(_ops_index)
    return 0


cdef PolicyOps* ops_for(object policy) except? NULL:
    cdef object index
    if _ops_index is None:
        _build_table()
    index = _ops_index.get(type(policy))
    if index is None or getattr(policy, "_compiled", False) is not True:
        return NULL
    return &_ops[<Py_ssize_t>index]


def compiled_policies():
    """The names of the built-in policies whose operations run in C (their exact classes)."""
    if _ops_index is None:
        _build_table()
    return sorted(cls.name for cls in _built_in)


cdef class PolicyOpsCaller:
    """A policy's C operations as Python methods: what the compiled radix core calls, for tests
    and benchmarks that drive a policy through its table. Raises TypeError for a policy without
    one (a plugin, a subclass, a policy built inside `native.pure_python()`)."""

    cdef PolicyOps* ops
    cdef readonly object policy

    def __init__(self, policy):
        self.ops = ops_for(policy)
        if self.ops == NULL:
            raise TypeError(f"policy {type(policy).__qualname__} has no compiled operations")
        self.policy = policy

    def insert(self, key, meta=None, *, evictable=True):
        self.ops.insert(self.ops, self.policy, key, meta, evictable)

    def access(self, key, now=None):
        self.ops.access(self.ops, self.policy, key, now)

    def set_evictable(self, key, evictable):
        self.ops.set_evictable(self.ops, self.policy, key, evictable)

    def evict(self, Py_ssize_t n=1):
        cdef list victims = []
        cdef bint found = True
        while len(victims) < n:
            key = self.ops.evict_one(self.ops, self.policy, &found)
            if not found:
                break
            victims.append(key)
        return victims


def has_compiled_ops(policy):
    """Whether the compiled radix core calls `policy` through its C table."""
    return ops_for(policy) != NULL


# ---- recency queues (sage_eviction/recency.py: _TickQueue, RecencyPolicy) ------------------------

cdef inline object _first_key(object order, bint last):
    # the key `order.popitem(last=last)` would take
    return next(reversed(order)) if last else next(iter(order))


cdef int queue_add_old(object queue, object key, object tick) except -1:
    # _TickQueue.add_old
    cdef object order = queue.order
    cdef dict side_live
    cdef list side
    if not order or tick > (<dict>queue.ticks)[next(reversed(order))]:
        order[key] = None
        return 0
    side_live = queue.side_live
    side_live[key] = tick
    side = queue.side
    _heappush(side, (-tick if queue.newest_first else tick, key))
    if len(side) > 2 * len(side_live) + 64:
        sign = -1 if queue.newest_first else 1
        side = [(sign * t, k) for k, t in side_live.items()]
        _heapify(side)
        queue.side = side
    return 0


cdef int queue_touch(object queue, object key) except -1:
    # _TickQueue.touch
    cdef object order = queue.order
    if key in order:
        order.move_to_end(key)
    else:
        del (<dict>queue.side_live)[key]
        order[key] = None
    return 0


cdef int queue_discard(object queue, object key) except -1:
    # _TickQueue.discard
    cdef object order = queue.order
    if key in order:
        del order[key]
    else:
        del (<dict>queue.side_live)[key]
    return 0


cdef object queue_pop(object queue):
    # _TickQueue.pop
    cdef object order = queue.order
    cdef list side = queue.side
    cdef dict side_live
    cdef bint newest_first
    cdef bint take_side
    if side:
        side_live = queue.side_live
        newest_first = queue.newest_first
        while side:
            tick, key = side[0]
            if newest_first:
                tick = -tick
            if side_live.get(key) == tick:
                break
            _heappop(side)  # stale
        if side:
            take_side = not order
            if not take_side:
                head = _first_key(order, newest_first)
                head_tick = (<dict>queue.ticks)[head]
                take_side = tick > head_tick if newest_first else tick < head_tick
            if take_side:
                _heappop(side)
                del side_live[key]
                return key
    return _pop_end(order, queue.newest_first)


cdef inline object _pop_end(object order, bint last):
    # order.popitem(last=last)[0]: the same item leaves the same ordered dict
    key = _first_key(order, last)
    del order[key]
    return key


cdef int _recency_on_insert(object policy, object key, object meta, bint evictable) except -1:
    cdef dict a = attrs(policy)
    (<dict>a["_tick"])[key] = a["_clock"]
    if evictable:
        a["_queue"].order[key] = None
    return 0


cdef int _recency_on_access(object policy, object key, object meta) except -1:
    cdef dict a
    if policy.touch_on_access:
        a = attrs(policy)
        (<dict>a["_tick"])[key] = a["_clock"]
        if key in <set>a["_evictable"]:
            queue_touch(a["_queue"], key)
    return 0


cdef int _recency_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    cdef dict a = attrs(policy)
    if evictable:
        queue_add_old(a["_queue"], key, (<dict>a["_tick"])[key])
    else:
        queue_discard(a["_queue"], key)
    return 0


cdef object _recency_pop_victim(object policy):
    cdef dict a = attrs(policy)
    queue = a["_queue"]
    key = queue_pop(queue) if queue.side else _pop_end(queue.order, policy.newest_first)
    del (<dict>a["_tick"])[key]
    return key


cdef int _register_recency() except -1:
    from sage_eviction.policies.fifo import FIFOPolicy
    from sage_eviction.policies.filo import FILOPolicy
    from sage_eviction.policies.lru import LRUPolicy
    from sage_eviction.policies.mru import MRUPolicy

    cdef PolicyOps ops = hooked(
        _recency_on_insert, _recency_on_access, _recency_on_evictable, _recency_pop_victim
    )
    for cls in (LRUPolicy, FIFOPolicy, MRUPolicy, FILOPolicy):
        register(cls, ops)
    return 0
