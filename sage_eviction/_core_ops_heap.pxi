# The score-heap policies' C operations: `HeapPolicy` and `FlatHeapPolicy` (sage_eviction/heap.py)
# as GDSF, SLO and Predictive use them, Belady (its own insert and access), and `share_ops`.
# Part of sage_eviction/_core.pyx, which includes it after _core_ops.pxi (the table, `hooked`,
# `register` and the base operations this file builds on).
#
# Each function mirrors the Python method named in its comment, over the same attributes (`_heap`,
# `_live`, `_tick`, `_pushes`, Belady's `_next_use`, `_due`, `_pos`, ...). The heap is the
# compiled `ScoreHeap` (its C methods are called directly) or, after a fallback (heap.py: numbers
# the C heap cannot hold), the reference `_ListHeap` (its heapq list driven from here); any other
# heap object is called through its Python methods. `_score` is always called through Python, as
# heap.py calls it: it is the method subclasses write, and `share_ops` relies on that.

from bisect import bisect_left as _bisect_left
from operator import getitem as _getitem

cdef object _ListHeap = None  # sage_eviction.heap._ListHeap, bound by _register_heap
cdef object _HeapPolicy = None  # sage_eviction.heap.HeapPolicy, bound by _register_heap


# ---- the heap (heap.py: _Heap, _ListHeap, HeapPolicy._add) ---------------------------------------

cdef inline object _key_of(object item):
    # item[-1], spelled out: this module's directives (wraparound=False) do not wrap an index
    if PyTuple_CheckExact(item) and PyTuple_GET_SIZE(item) > 0:
        return <object>PyTuple_GET_ITEM(item, PyTuple_GET_SIZE(item) - 1)
    return _getitem(item, -1)


cdef bint heap_push(object heap, object item) except -1:
    # heap.push(item)
    if type(heap) is ScoreHeap:
        return (<ScoreHeap>heap).push(item)
    if type(heap) is _ListHeap:
        _heappush(heap.heap, item)  # _ListHeap.push
        return True
    return heap.push(item)


cdef Py_ssize_t heap_len(object heap) except -1:
    # len(heap)
    if type(heap) is ScoreHeap:
        return (<ScoreHeap>heap).size
    if type(heap) is _ListHeap:
        return len(<list>heap.heap)
    return len(heap)


cdef object heap_pop_live(object heap, dict live, dict ticks):
    # heap.pop_live(live, ticks)
    cdef list items
    if type(heap) is ScoreHeap:
        return (<ScoreHeap>heap).pop_live(live, ticks)
    if type(heap) is not _ListHeap:
        return heap.pop_live(live, ticks)
    items = heap.heap  # _ListHeap.pop_live
    while True:
        item = _heappop(items)  # IndexError when empty, as the compiled heap
        key = _key_of(item)
        if live.get(key) is item:
            del live[key]
            del ticks[key]
            return item


cdef int heap_add(object policy, object item) except -1:
    # HeapPolicy._add: make `item` its key's live item and push it
    cdef dict live = policy._live
    live[_key_of(item)] = item
    heap = policy._heap
    if not heap_push(heap, item):  # not numbers the compiled heap holds: on in pure Python
        heap = _ListHeap(heap.items())
        policy._heap = heap
        heap_push(heap, item)
    if heap_len(heap) > 2 * len(live) + 64:
        policy._refill()  # rare: through Python
    return 0


cdef inline int heap_push_key(object policy, object key, object meta, bint flat) except -1:
    # HeapPolicy._push (the item `(score, push number, key)`), FlatHeapPolicy._push (`(*score, key)`)
    if flat:
        return heap_add(policy, (*policy._score(key, meta), key))
    policy._pushes += 1
    return heap_add(policy, (policy._score(key, meta), policy._pushes, key))


# ---- HeapPolicy's and FlatHeapPolicy's hooks -----------------------------------------------------

cdef inline int _on_insert(object policy, object key, object meta, bint evictable, bint flat) except -1:
    # HeapPolicy._on_insert
    (<dict?>policy._tick)[key] = policy._clock
    if evictable:
        heap_push_key(policy, key, meta, flat)
    return 0


cdef inline int _on_access(object policy, object key, object meta, bint flat) except -1:
    # HeapPolicy._on_access
    (<dict?>policy._tick)[key] = policy._clock
    if policy.rescore_on_access and key in <dict?>policy._live:
        heap_push_key(policy, key, meta, flat)
    return 0


cdef inline int _on_evictable(object policy, object key, object meta, bint evictable, bint flat) except -1:
    # HeapPolicy._on_evictable
    if evictable:
        heap_push_key(policy, key, meta, flat)
    else:
        del (<dict?>policy._live)[key]
    return 0


cdef inline object _pop_item(object policy):
    # HeapPolicy._pop_victim's first line: the victim's live item, gone from `_live` and `_tick`
    return heap_pop_live(policy._heap, policy._live, policy._tick)


cdef int _heap_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    return _on_evictable(policy, key, meta, evictable, False)


cdef int _flat_on_insert(object policy, object key, object meta, bint evictable) except -1:
    return _on_insert(policy, key, meta, evictable, True)


cdef int _flat_on_access(object policy, object key, object meta) except -1:
    return _on_access(policy, key, meta, True)


cdef int _flat_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    return _on_evictable(policy, key, meta, evictable, True)


cdef object _flat_pop_victim(object policy):
    # FlatHeapPolicy._pop_victim, `_on_victim` through Python (SLO's and Predictive's do nothing
    # and `_victim_hook` is False for them; a subclass's own one is called as heap.py calls it)
    item = _pop_item(policy)
    key = _key_of(item)
    if policy._victim_hook:
        policy._on_victim(key, item)
    return key


cdef object _gdsf_pop_victim(object policy):
    # FlatHeapPolicy._pop_victim with GDSFPolicy._on_victim inlined: L rises to the victim's H
    item = _pop_item(policy)
    key = _key_of(item)
    if policy._victim_hook:
        policy.inflation = _getitem(item, 0)  # item[0]
    return key


# ---- Belady (sage_eviction/policies/belady.py) ---------------------------------------------------

cdef Py_ssize_t _belady_consume(object policy, object key) except -1:
    # BeladyPolicy._consume: the position the call takes (not yet committed)
    cdef Py_ssize_t pos, at
    cdef list positions
    future = policy._future
    if future is None:
        raise PolicyStateError(f"{policy.name}: the future is not set; call set_future(keys) first")
    pos = policy._pos
    if pos < len(future) and future[pos] == key:
        return pos
    if pos >= len(future):
        raise PolicyStateError(
            f"{policy.name}: call for key {key!r} past the end of the future ({len(future)} lookups)"
        )
    if policy._strict:
        raise PolicyStateError(
            f"{policy.name}: the calls diverge from the future at position {pos}: "
            f"expected key {future[pos]!r}, got {key!r}"
        )
    positions = (<dict?>policy._occurrences).get(key, [])
    at = _bisect_left(positions, pos)
    if at == len(positions):
        raise PolicyStateError(
            f"{policy.name}: key {key!r} does not occur in the future at or after position {pos}"
        )
    return positions[at]


cdef int _belady_commit(object policy, Py_ssize_t pos) except -1:
    # BeladyPolicy._commit
    cdef bint skipped = pos > <Py_ssize_t>policy._pos
    policy._pos = pos + 1
    if skipped:
        policy._refresh(pos)  # lenient mode only: through Python
    return 0


cdef int _belady_insert(PolicyOps* ops, object policy, object key, object meta, bint evictable) except -1:
    # BeladyPolicy.insert (`super().insert` is EvictionPolicy's: base_insert)
    cdef Py_ssize_t pos = _belady_consume(policy, key)
    policy._incoming = policy._next_pos[pos]
    base_insert(ops, policy, key, meta, evictable)
    return _belady_commit(policy, pos)


cdef int _belady_access(PolicyOps* ops, object policy, object key, object now) except -1:
    # BeladyPolicy.access
    cdef Py_ssize_t pos
    if key not in <dict?>policy._meta:
        base_access(ops, policy, key, now)  # raises UnknownKeyError
    pos = _belady_consume(policy, key)
    policy._incoming = policy._next_pos[pos]
    base_access(ops, policy, key, now)
    return _belady_commit(policy, pos)


cdef int _belady_by_next_insert(PolicyOps* ops, object policy, object key, object meta,
                                bint evictable) except -1:
    # The insert of a subclass whose next use comes from its `_next(key)` (see `share_ops`)
    policy._incoming = policy._next(key)
    return base_insert(ops, policy, key, meta, evictable)


cdef int _belady_by_next_access(PolicyOps* ops, object policy, object key, object now) except -1:
    policy._incoming = policy._next(key)
    return base_access(ops, policy, key, now)


cdef inline int _belady_track(object policy, object key, object next_use) except -1:
    # BeladyPolicy._track: lenient mode's heap of due next uses
    if not policy._strict and next_use < policy._never:
        policy._pushes += 1
        _heappush(policy._due, (next_use, policy._pushes, key))
    return 0


cdef int _belady_on_insert(object policy, object key, object meta, bint evictable) except -1:
    # BeladyPolicy._on_insert, then HeapPolicy._on_insert
    (<dict?>policy._next_use)[key] = policy._incoming
    _belady_track(policy, key, policy._incoming)
    return _on_insert(policy, key, meta, evictable, False)


cdef int _belady_on_access(object policy, object key, object meta) except -1:
    # BeladyPolicy._on_access, then HeapPolicy._on_access
    (<dict?>policy._next_use)[key] = policy._incoming
    _belady_track(policy, key, policy._incoming)
    return _on_access(policy, key, meta, False)


cdef object _belady_pop_victim(object policy):
    # HeapPolicy._pop_victim with BeladyPolicy._on_victim inlined
    item = _pop_item(policy)
    key = _key_of(item)
    if policy._victim_hook:
        del (<dict?>policy._next_use)[key]
    return key


# ---- sharing a table with a subclass -------------------------------------------------------------

# The methods whose bodies the C functions of each registered heap class run in C (a subclass
# that overrides one of them would be bypassed); what they call through Python (`_score`,
# `_refill`, `_refresh`, SLO's and Predictive's `_on_victim`) a subclass may override.
_BASE_MIRRORED = ("insert", "access", "set_evictable", "evict")
_HEAP_MIRRORED = _BASE_MIRRORED + ("_on_insert", "_on_access", "_on_evictable", "_pop_victim", "_push", "_add")
_BELADY_MIRRORED = _HEAP_MIRRORED + ("_on_victim", "_consume", "_commit", "_track")
cdef dict _mirrored = {}  # registered class -> the names of the methods its table mirrors
cdef dict _shared = {}  # subclass -> the base whose table it was given
cdef PolicyOps _belady_by_next_ops

# The one override form a table is given for: a Belady subclass that finds the next use itself
# (engine_adapter's RadixBelady). Its insert and access must be exactly these statements (after a
# docstring), which `_belady_by_next_insert` and `_belady_by_next_access` run.
_BY_NEXT_FORMS = {
    "insert": (
        "def insert(self, key, meta=None, *, evictable=True):\n"
        "    self._incoming = self._next(key)\n"
        "    HeapPolicy.insert(self, key, meta, evictable=evictable)\n"
    ),
    "access": (
        "def access(self, key, now=None):\n"
        "    self._incoming = self._next(key)\n"
        "    HeapPolicy.access(self, key, now)\n"
    ),
}


def _function_shape(function, source=None):
    """The parameters (names, kinds, defaults) and the statements past a docstring of a Python
    function, as comparable values, from `source` or else its file; None when that cannot be read."""
    import ast, inspect, textwrap

    try:
        node = ast.parse(textwrap.dedent(source or inspect.getsource(function))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef) or node.decorator_list:
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    params = [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]
    return params, [ast.dump(statement) for statement in body]


def _by_next_refusal(subclass):
    """Why `subclass` (of a Belady class) cannot have the by-`_next` table, or None."""
    namespace = {}
    for name, source in _BY_NEXT_FORMS.items():
        exec(source, namespace)
        function = getattr(subclass, name)
        if _function_shape(function) != _function_shape(namespace[name], source):
            return f"its {name} is not `{source.splitlines()[1].strip()}` then HeapPolicy.{name}"
        if getattr(function, "__globals__", {}).get("HeapPolicy") is not _HeapPolicy:
            return f"HeapPolicy in its {name} is not sage_eviction.heap.HeapPolicy"
    if not callable(getattr(subclass, "_next", None)):
        return "it has no _next(key) method"
    return None


def share_ops(subclass, base):
    """Give `subclass` the C operations of the registered built-in class `base`, so that the
    compiled core calls its instances without Python frames (the table is by exact class).

    The rule: every method that insert, access, set_evictable or evict(1) runs and that
    `subclass` overrides must be reached by the table's C functions through a Python call. So
    `subclass` may override what they call through Python (`_score`, `_refill`, ...), what they
    never run (`_on_remove`, `explain`, ...) and add methods of its own, but not the methods whose
    bodies they mirror in C (`base`'s operations and hooks, listed per class in this file; only
    the classes registered here have such a list, so only they can be shared). One override form is
    recognised: a Belady subclass whose insert and access are `self._incoming = self._next(key)`
    followed by HeapPolicy's method (RadixBelady, engine_adapter/sim/cache_models.py) gets the
    Belady hooks with insert and access that call its `_next` through Python.

    Raises:
        TypeError: `base` has no table to share, `subclass` is not a subclass of it, or it
            overrides a method the table runs in C; `subclass` then keeps the Python path.
    """
    cdef PolicyOps ops
    if _ops_index is None:
        _build_table()
    mirrored = _mirrored.get(base)
    if mirrored is None:
        raise TypeError(f"{getattr(base, '__qualname__', base)!r} has no compiled operations to share "
                        "(no list of the methods its C functions mirror)")
    if not isinstance(subclass, type) or not issubclass(subclass, base) or subclass is base:
        raise TypeError(f"{subclass!r} is not a subclass of {base.__qualname__}")
    if _shared.get(subclass) is base:
        return  # already given
    if subclass in _ops_index:
        raise TypeError(f"{subclass.__qualname__} already has its own compiled operations")
    ops = _ops[<Py_ssize_t>_ops_index[base]]
    if "_consume" in mirrored and any(getattr(subclass, n) is not getattr(base, n) for n in ("insert", "access")):
        reason = _by_next_refusal(subclass)
        if reason is not None:
            raise TypeError(f"{subclass.__qualname__} keeps the Python path: {reason}")
        ops = _belady_by_next_ops
        mirrored = tuple(n for n in mirrored if n not in ("insert", "access", "_consume", "_commit"))
    overridden = [n for n in mirrored if getattr(subclass, n) is not getattr(base, n)]
    if overridden:
        raise TypeError(
            f"{subclass.__qualname__} overrides {', '.join(overridden)}, which the compiled operations "
            f"of {base.__qualname__} run in C: it keeps the Python path"
        )
    register(subclass, ops)
    _shared[subclass] = base


# ---- the registration ----------------------------------------------------------------------------

cdef int _register_heap() except -1:
    global _ListHeap, _HeapPolicy, _belady_by_next_ops
    from sage_eviction.heap import HeapPolicy, _ListHeap as list_heap
    from sage_eviction.policies.belady import BeladyPolicy
    from sage_eviction.policies.gdsf import GDSFPolicy
    from sage_eviction.policies.predictive import PredictivePolicy
    from sage_eviction.policies.slo import SLOPolicy

    cdef PolicyOps flat = hooked(_flat_on_insert, _flat_on_access, _flat_on_evictable, _flat_pop_victim)
    cdef PolicyOps gdsf = hooked(_flat_on_insert, _flat_on_access, _flat_on_evictable, _gdsf_pop_victim)
    cdef PolicyOps belady = hooked(_belady_on_insert, _belady_on_access, _heap_on_evictable, _belady_pop_victim)
    _ListHeap = list_heap
    _HeapPolicy = HeapPolicy
    for cls in (SLOPolicy, PredictivePolicy):
        register(cls, flat)
        _mirrored[cls] = _HEAP_MIRRORED
    register(GDSFPolicy, gdsf)
    _mirrored[GDSFPolicy] = _HEAP_MIRRORED + ("_on_victim",)
    _belady_by_next_ops = belady
    _belady_by_next_ops.insert = _belady_by_next_insert
    _belady_by_next_ops.access = _belady_by_next_access
    belady.insert = _belady_insert
    belady.access = _belady_access
    register(BeladyPolicy, belady)
    _mirrored[BeladyPolicy] = _BELADY_MIRRORED
    return 0
