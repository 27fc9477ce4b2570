# cython: language_level=3, boundscheck=True, wraparound=False
"""The compiled core of `engine_adapter.cache.radix_cache`: `CachedBlock` and the hot paths of
`RadixCache` in C, and the blocks' policy records of `block_meta`.

radix_cache.py (with cached_block.py and block_meta.py) is the reference and the fallback: every
method here mirrors the method of the same name there, line for line, and must give the same
results, raise the same errors and make the same policy calls in the same order
(tests/test_compiled_cache.py runs both side by side). `radix_cache.CompiledRadixCache` puts
`RadixCore` in front of `RadixCache`, so the methods not here (pin, unpin, remove,
evict_explained, check, ...) are the pure-Python ones, over the same attributes.

What is compiled: the per-block loops of a request (match, touch, lock, unlock, the inserts of
commit and release, eviction with its cascade), the nodes as C structs with typed fields, and
each `EntryMeta` built without a Python frame. A built-in policy is called through its table of C
functions (`sage_eviction._core.PolicyOps`: its insert, access, set_evictable and evict(1) over its
own state, no Python frame); any other policy (a plugin, a subclass, one built inside
`native.pure_python()`) through its public methods, with the same results either way
(tests/test_policy_ops.py, tests/test_compiled_cache.py).

Bounds checks stay on (a caller's short block table raises IndexError as in pure Python).
"""

import dataclasses
import time
import types

from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF

from engine_adapter.cache.errors import BlockStateError, CacheInvariantError
from sage_eviction import EntryMeta

from sage_eviction._core cimport PolicyOps, monotonic_seconds, ops_for


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags

    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

    object PyType_GenericAlloc(PyTypeObject* cls, Py_ssize_t nitems)
    object PyObject_VectorcallMethod(object name, PyObject** args, size_t nargsf, PyObject* kwnames)

cdef extern from "structmember.h":
    int T_OBJECT_EX
    int READONLY


# ---- EntryMeta without a Python frame ------------------------------------------------------------
#
# A block's EntryMeta is built once per inserted block; through the dataclass's __init__ (a Python
# frame with 16 keyword arguments) it was the largest cost of an insert after the policy's. Where
# EntryMeta is what sage_eviction defines today (a slots dataclass without __post_init__, every
# field a plain object slot), the record is allocated and its slots are filled in place, exactly
# what __init__ would store. Anything else (a changed EntryMeta) falls back to calling it.

_META_FIELDS = (
    "size", "cost", "priority", "tenant", "created_at", "last_access", "hits", "estimated_lifetime",
    "seq_len", "max_len", "deadline", "depth", "pos_from_end", "prompt_blocks", "conversation",
    "prefix_idle",
)
cdef Py_ssize_t _meta_offsets[16]
cdef bint _meta_in_place = False


cdef bint _find_meta_slots():
    if not dataclasses.is_dataclass(EntryMeta) or hasattr(EntryMeta, "__post_init__"):
        return False
    if tuple(f.name for f in dataclasses.fields(EntryMeta)) != _META_FIELDS:
        return False
    if EntryMeta.__new__ is not object.__new__ or type(EntryMeta).__call__ is not type.__call__:
        return False
    cdef PyMemberDef* member
    for i, name in enumerate(_META_FIELDS):
        descr = EntryMeta.__dict__.get(name)
        if type(descr) is not types.MemberDescriptorType:
            return False
        member = (<PyMemberDescrObject*>descr).d_member
        if member.type != T_OBJECT_EX or member.flags & READONLY:
            return False
        _meta_offsets[i] = member.offset
    return True


_meta_in_place = _find_meta_slots()


cdef inline void _put(object obj, Py_ssize_t i, object value):
    Py_INCREF(value)  # the slot owns a reference, as a setattr would take; fresh slots are NULL
    (<PyObject**>((<char*><PyObject*>obj) + _meta_offsets[i]))[0] = <PyObject*>value




def meta_in_place():
    """Whether EntryMeta records are filled in place (else built by calling EntryMeta)."""
    return _meta_in_place


# The policy's methods are called as CPython calls a method: by vectorcall on the name, without
# making a bound method or a keyword dict per call (a few tens of ns of each block's work).

cdef object _EVICTABLE = ("evictable",)
cdef object _INSERT = "insert"
cdef object _SET_EVICTABLE = "set_evictable"
cdef object _ACCESS = "access"
cdef object _EVICT = "evict"
cdef object _ONE = 1
cdef object _ZERO = 0


cdef inline void _py_insert(object policy, object key, object meta, bint evictable) except *:
    # policy.insert(key, meta, evictable=evictable)
    cdef PyObject* args[4]
    cdef object flag = True if evictable else False
    args[0] = <PyObject*>policy
    args[1] = <PyObject*>key
    args[2] = <PyObject*>meta
    args[3] = <PyObject*>flag
    PyObject_VectorcallMethod(_INSERT, args, 3, <PyObject*>_EVICTABLE)


cdef inline object _call(object policy, object name, object a, object b):
    # policy.<name>(a, b)
    cdef PyObject* args[3]
    args[0] = <PyObject*>policy
    args[1] = <PyObject*>a
    args[2] = <PyObject*>b
    return PyObject_VectorcallMethod(name, args, 3, NULL)


cdef inline void _py_set_evictable(object policy, object key, bint evictable) except *:
    _call(policy, _SET_EVICTABLE, key, True if evictable else False)


cdef inline object _py_evict_one(object policy):
    # policy.evict(1)
    cdef PyObject* args[2]
    args[0] = <PyObject*>policy
    args[1] = <PyObject*>_ONE
    return PyObject_VectorcallMethod(_EVICT, args, 2, NULL)


cdef object _fmt(object key):
    from engine_adapter.cache.block_keys import format_block_key  # cold: errors and repr only

    return format_block_key(key)


cdef class CachedBlock:
    """One cached block: `cached_block.CachedBlock` with typed fields (same attributes)."""

    cdef public object key
    cdef public object block_id
    cdef public CachedBlock parent
    cdef public Py_ssize_t depth
    cdef public Py_ssize_t num_children
    cdef public Py_ssize_t ref_count
    cdef public Py_ssize_t pin_count
    cdef public bint evictable
    cdef public object meta
    cdef public object sequence_id

    def __init__(self, key, block_id, CachedBlock parent, meta, sequence_id, Py_ssize_t ref_count):
        self.key = key
        self.block_id = block_id
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.num_children = 0
        self.ref_count = ref_count
        self.pin_count = 0
        self.evictable = ref_count == 0
        self.meta = meta
        self.sequence_id = sequence_id

    def __repr__(self):
        return (
            f"CachedBlock(key={_fmt(self.key)[:12]}, block_id={self.block_id}, "
            f"depth={self.depth}, ref={self.ref_count}, pin={self.pin_count}, children={self.num_children})"
        )


cdef inline CachedBlock _new_block(
    object key, object block_id, CachedBlock parent, object meta, object sequence_id, Py_ssize_t ref_count
):
    cdef CachedBlock block = CachedBlock.__new__(CachedBlock)
    block.key = key
    block.block_id = block_id
    block.parent = parent
    block.depth = 0 if parent is None else parent.depth + 1
    block.num_children = 0
    block.ref_count = ref_count
    block.pin_count = 0
    block.evictable = ref_count == 0
    block.meta = meta
    block.sequence_id = sequence_id
    return block


cdef class RadixCore:
    """The state and the hot paths of `RadixCache` (its other methods come from radix_cache.py)."""

    cdef object _policy
    cdef PolicyOps* _ops  # the policy's C table, or NULL: its Python methods
    cdef public object num_blocks
    cdef public object max_pinned_ratio
    cdef public Py_ssize_t max_pinned
    cdef public dict _blocks
    cdef public Py_ssize_t num_pinned
    cdef public Py_ssize_t num_reclaimable

    def __init__(self, policy, *, num_blocks, max_pinned_ratio=0.5):
        if not 0.0 <= max_pinned_ratio <= 1.0:
            raise ValueError(f"max_pinned_ratio={max_pinned_ratio!r} must be within [0, 1]")
        self.policy = policy
        self.num_blocks = num_blocks
        self.max_pinned_ratio = max_pinned_ratio
        self.max_pinned = int(max_pinned_ratio * num_blocks)
        self._blocks = {}
        self.num_pinned = 0
        self.num_reclaimable = 0

    @property
    def policy(self):
        return self._policy

    @policy.setter
    def policy(self, policy):
        # a hot swap (`set_policy`) assigns here too: the table follows the policy
        self._ops = ops_for(policy)
        self._policy = policy

    @property
    def policy_calls(self):
        """How this cache calls its policy: "compiled" (its C table) or "python" (its methods)."""
        return "compiled" if self._ops != NULL else "python"

    def __reduce__(self):
        raise TypeError("a compiled radix cache does not pickle (its policy table is a C pointer)")

    # The four policy calls: through the C table when the policy has one, else its methods.

    cdef inline int _policy_insert(self, object key, object meta, bint evictable) except -1:
        if self._ops != NULL:
            return self._ops.insert(self._ops, self._policy, key, meta, evictable)
        _py_insert(self._policy, key, meta, evictable)
        return 0

    cdef inline int _policy_access(self, object key, object now) except -1:
        if self._ops != NULL:
            return self._ops.access(self._ops, self._policy, key, now)
        _call(self._policy, _ACCESS, key, now)
        return 0

    cdef inline int _set_evictable(self, object key, bint evictable) except -1:
        if self._ops != NULL:
            return self._ops.set_evictable(self._ops, self._policy, key, evictable)
        _py_set_evictable(self._policy, key, evictable)
        return 0

    cdef inline object _evict_one(self, bint* found):
        # the victim (found) or nothing evictable (not found), as policy.evict(1) answers
        if self._ops != NULL:
            return self._ops.evict_one(self._ops, self._policy, found)
        keys = _py_evict_one(self._policy)
        found[0] = bool(keys)
        return keys[0] if keys else None

    def match(self, keys):
        cdef dict blocks = self._blocks
        cdef list path = []
        cdef object parent = None
        cdef object found
        for key in keys:
            found = blocks.get(key)
            if found is None or (<CachedBlock>found).parent is not parent:
                break
            path.append(found)
            parent = found
        return path

    def touch(self, path, now=None):
        cdef CachedBlock block
        if now is None:
            now = time.time()
        for block in path:
            self._policy_access(block.key, now)

    def lock(self, path):
        cdef CachedBlock block
        for block in path:
            if block.ref_count == 0 and block.pin_count == 0:
                self.num_reclaimable -= 1
            block.ref_count += 1
            if block.evictable:
                block.evictable = False
                self._set_evictable(block.key, False)

    def unlock(self, path):
        cdef CachedBlock block
        for block in path:
            if block.ref_count <= 0:
                raise BlockStateError(f"unlock of {block!r} whose ref count is already 0")
        for block in path:
            block.ref_count -= 1
            if block.ref_count == 0 and block.pin_count == 0:
                self.num_reclaimable += 1
                if block.num_children == 0:
                    block.evictable = True
                    self._set_evictable(block.key, True)

    def reclaimable_in(self, path):
        cdef CachedBlock block
        cdef Py_ssize_t n = 0
        for block in path:
            if block.ref_count == 0 and block.pin_count == 0:
                n += 1
        return n

    def insert(self, parent, key, block_id, meta, *, sequence_id=None, locked=False, leaf=True):
        return self._insert(parent, key, block_id, meta, sequence_id, bool(locked), bool(leaf), False)

    cdef CachedBlock _insert(
        self,
        object parent,
        object key,
        object block_id,
        object meta,
        object sequence_id,
        bint locked,
        bint leaf,
        bint checked,
    ):
        # checked: the caller knows `key` is not cached and `parent` is (a block it just
        # inserted or found), so the two lookups that would raise are skipped
        cdef dict blocks = self._blocks
        cdef CachedBlock up = None
        cdef CachedBlock block
        cdef bint evictable
        if not checked and key in blocks:
            raise BlockStateError(f"block {_fmt(key)} is already cached")
        if parent is not None:
            up = <CachedBlock?>parent
            if not checked and blocks.get(up.key) is not up:
                raise BlockStateError(f"parent {up!r} of block {_fmt(key)} is not cached")
            up.num_children += 1
            if up.evictable:
                up.evictable = False
                self._set_evictable(up.key, False)
        block = _new_block(key, block_id, up, meta, sequence_id, 1 if locked else 0)
        blocks[key] = block
        if not locked:
            self.num_reclaimable += 1
        evictable = leaf and not locked
        block.evictable = evictable
        self._policy_insert(key, meta, evictable)
        return block

    def refresh(self, CachedBlock block):
        cdef bint should = block.ref_count == 0 and block.pin_count == 0 and block.num_children == 0
        if block.evictable != should:
            block.evictable = should
            self._set_evictable(block.key, should)

    def evict(self, Py_ssize_t n):
        cdef list victims = []
        if n <= 0:
            return victims, 0.0
        policy = self._policy
        cdef dict blocks = self._blocks
        cdef double decision = 0.0
        cdef double t0
        cdef CachedBlock block
        cdef CachedBlock parent
        cdef object found
        cdef bint any_victim = False
        while len(victims) < n:
            t0 = monotonic_seconds()
            key = self._evict_one(&any_victim)
            decision += monotonic_seconds() - t0
            if not any_victim:
                break
            found = blocks.pop(key, None)
            if found is not None:
                block = <CachedBlock?>found
            if found is None or block.ref_count or block.pin_count or block.num_children:
                if found is not None:
                    blocks[key] = found
                raise CacheInvariantError(
                    f"policy {policy.name!r} evicted {_fmt(key)}, which is "
                    f"{'not cached' if found is None else repr(found)}"
                )
            self.num_reclaimable -= 1
            block.evictable = False
            parent = block.parent
            if parent is not None:
                parent.num_children -= 1
                if parent.num_children == 0 and parent.ref_count == 0 and parent.pin_count == 0:
                    parent.evictable = True
                    self._set_evictable(parent.key, True)
            victims.append(block)
        return victims, decision

    def commit(self, list path, keys, table, sequence_id, fields):
        cdef Py_ssize_t i, n = len(keys)
        cdef Py_ssize_t start = len(path)
        cdef Py_ssize_t added = 0
        cdef dict blocks = self._blocks
        cdef object parent = path[start - 1] if start else None
        cdef _Metas metas
        if start >= n:
            return 0
        metas = _Metas(fields)
        for i in range(start, n):
            key = keys[i]
            if key in blocks:
                break
            # the first block's parent is the caller's; the later ones' were inserted here
            parent = self._insert(parent, key, table[i], metas.meta(i), sequence_id, True, True, i > start)
            path.append(parent)
            added += 1
        return added

    def release(self, list path, keys, table, sequence_id, fields):
        cdef Py_ssize_t i, n = len(keys)
        cdef Py_ssize_t start = len(path)
        cdef Py_ssize_t added = 0
        cdef Py_ssize_t stop = max(n, start)
        cdef dict blocks = self._blocks
        cdef object parent = path[start - 1] if start else None
        cdef CachedBlock last_new = None
        cdef list to_free = []
        cdef object existing
        cdef _Metas metas
        if start < n:
            metas = _Metas(fields)
        for i in range(start, n):
            key = keys[i]
            existing = blocks.get(key)
            if existing is None:
                # not cached (just looked up); the parent is the caller's first, then one
                # inserted or found here
                last_new = self._insert(parent, key, table[i], metas.meta(i), sequence_id, False, False, i > start)
                parent = last_new
                added += 1
            elif (<CachedBlock>existing).parent is parent:
                to_free.append(table[i])
                parent = existing
            else:
                stop = i
                break
        if last_new is not None:
            self.refresh(last_new)
        to_free.extend(table[stop:])
        self.unlock(path)
        return added, to_free


cdef class _Metas:
    """`block_meta.BlockMetaFields.meta` without a Python frame per block."""

    cdef Py_ssize_t block_size
    cdef Py_ssize_t prompt_blocks
    cdef object priority, tenant, now, estimated_lifetime, seq_len, max_len, deadline
    cdef object conversation, prefix_idle
    cdef object size, prompt_blocks_obj

    def __init__(self, fields):
        block_size, request, self.now, self.seq_len, prompt_blocks, self.prefix_idle = fields
        # the request's fields, read once per call (BlockMetaFields.meta reads them per block)
        self.priority = request.priority
        self.tenant = request.tenant
        self.estimated_lifetime = request.estimated_lifetime
        self.max_len = request.max_tokens
        self.deadline = request.deadline
        self.conversation = request.conversation
        self.block_size = block_size
        self.prompt_blocks = prompt_blocks
        self.size = block_size
        self.prompt_blocks_obj = prompt_blocks

    cdef object meta(self, Py_ssize_t index):
        cost = <double>((index + 1) * self.block_size)
        depth = index
        pos_from_end = self.prompt_blocks - 1 - index
        if not _meta_in_place:
            return EntryMeta(
                self.size, cost, self.priority, self.tenant, self.now, self.now, 0,
                self.estimated_lifetime, self.seq_len, self.max_len, self.deadline, depth,
                pos_from_end, self.prompt_blocks_obj, self.conversation, self.prefix_idle,
            )
        meta = PyType_GenericAlloc(<PyTypeObject*>EntryMeta, 0)
        # in the order of _META_FIELDS
        _put(meta, 0, self.size)
        _put(meta, 1, cost)
        _put(meta, 2, self.priority)
        _put(meta, 3, self.tenant)
        _put(meta, 4, self.now)  # created_at
        _put(meta, 5, self.now)  # last_access
        _put(meta, 6, _ZERO)  # hits
        _put(meta, 7, self.estimated_lifetime)
        _put(meta, 8, self.seq_len)
        _put(meta, 9, self.max_len)
        _put(meta, 10, self.deadline)
        _put(meta, 11, depth)
        _put(meta, 12, pos_from_end)
        _put(meta, 13, self.prompt_blocks_obj)
        _put(meta, 14, self.conversation)
        _put(meta, 15, self.prefix_idle)
        return meta


def block_meta(fields, Py_ssize_t index):
    """`block_meta.BlockMetaFields.meta(index)` as the compiled commit builds it (for the tests)."""
    return (<_Metas>_Metas(fields)).meta(index)
