# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""The compiled core of sage_eviction: the score heap, the sequence-level victim choice, the
built-in policies' operations as C functions (`PolicyOps`) and the flat cache's lookup loop.

Each piece mirrors a pure-Python reference that stays the fallback (sage_eviction/native.py
picks): `ScoreHeap` is `sage_eviction.heap._ListHeap`, `select_victims` is
`sage_eviction.sequence_level.select_in_order` over a preemption order's key
(`sage_eviction.preemption`). Both hold
Python numbers as C doubles only where a double compares exactly as the number does (a float
that is not NaN, an int or bool within 2**53); anything else makes them answer "not here"
(False or None) and the caller runs the pure-Python code, so results never differ
(tests/test_native_core.py runs both side by side).

The parts, each in its own include file (one extension module, so they share this file's C
helpers): `_core_heap.pxi` (the score heap and `sorted_keys`), `_core_select.pxi`
(`select_victims`), `_core_scoring.pxi` (`score_into`, a hot swap into a heap policy),
`_core_ops.pxi` (the table of the policies' C operations, `EvictionPolicy`'s own bookkeeping in C,
the recency queues; declared for other compiled modules in `_core.pxd`) with one file per family
of hooks (`_core_ops_levelled.pxi`: lfu, priority; `_core_ops_sieve.pxi`: sieve, slru;
`_core_ops_heap.pxi`: gdsf, slo, predictive, belady and `share_ops`; `_core_ops_ghosts.pxi`:
s3fifo, arc, mq), `_core_flat.pxi` (`flat_lookup`, `FlatCache.lookup` in one call) and
`_core_flat_state.pxi` (`FlatState`: the flat cache with int64 keys and its policy's state in C
arrays, for lru, fifo, mru, filo, sieve, s3fifo, arc, lfu, gdsf and belady, over the int64 tables of
`_core_i64map.pxi` and the policies' one C home, `_kinds.pxi`: `_kind_nodes.pxi` and a file per
kind, which the simulator's radix loop includes too), and `_core_keyset.pxi`
(`KeySet`, the compact set of evicted keys, over the same int64 table). Each mirrors its Python
reference (tests/test_policy_ops*.py, tests/test_flat_lookup.py, tests/test_flat_state.py,
tests/test_keyset.py).

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

__all__ = [
    "KEYSET_DENSE_LIMIT",
    "FlatState",
    "KeySet",
    "PolicyOpsCaller",
    "ScoreHeap",
    "compiled_policies",
    "flat_lookup",
    "flat_state_policies",
    "flat_state_runs",
    "has_compiled_ops",
    "score_into",
    "select_victims",
    "share_ops",
    "sorted_keys",
]

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


# The three parts, one idea each (Cython includes them here as if written in this file).
include "_core_heap.pxi"
include "_core_select.pxi"
include "_core_scoring.pxi"
include "_core_i64map.pxi"
include "_core_keyset.pxi"
include "_core_ops.pxi"
include "_core_ops_levelled.pxi"
include "_core_ops_sieve.pxi"
include "_core_ops_heap.pxi"
include "_core_ops_ghosts.pxi"
include "_core_flat.pxi"
include "_core_flat_lists.pxi"
include "_core_memory.pxi"
include "_kinds.pxi"  # the policies' C home (_kind_*.pxi), shared with the simulator's radix loop
include "_core_flat_state.pxi"
