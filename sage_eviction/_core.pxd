# The C-level policy interface of sage_eviction's compiled core (issue 34), for other compiled
# modules: `from sage_eviction._core cimport PolicyOps, ops_for` (and `monotonic_seconds`, the
# clock both cores time the policy's decisions with).
#
# A built-in policy's four operations as C functions: the radix cache's compiled core calls them
# per block without a Python frame. They run over the policy object's own state (the same dicts,
# sets and queues its Python methods use), so every other method (explain, entries, a hot swap)
# sees what the C calls did; each mirrors `EvictionPolicy.insert`, `access`, `set_evictable` and
# `evict(1)` with the class's hooks, line for line (tests/test_policy_ops.py runs both).

from libc.stdint cimport int64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double monotonic_seconds() noexcept nogil:
    # time.perf_counter's clock on Linux, without a Python call (the policies' decision times)
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


# The time-stamp counter (a cycle count where there is one, else nanoseconds of the monotonic
# clock) and its period in seconds, measured once (`tick_seconds`, _core_flat_state.pxi): the
# compiled caches time their policies' decisions with it (a clock reading costs more than the
# decision on this class of machine).
cdef extern from *:
    """
    #if defined(__x86_64__) || defined(__i386__)
    #include <x86intrin.h>
    static inline unsigned long long sage_ticks(void) { return __rdtsc(); }
    #define SAGE_TICKS_ARE_CYCLES 1
    #else
    #include <time.h>
    static inline unsigned long long sage_ticks(void) {
        struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
        return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
    }
    #define SAGE_TICKS_ARE_CYCLES 0
    #endif
    """
    unsigned long long sage_ticks() noexcept nogil
    int SAGE_TICKS_ARE_CYCLES
cdef double tick_seconds()


cdef struct PolicyOps

ctypedef int (*InsertOp)(PolicyOps* ops, object policy, object key, object meta, bint evictable) except -1
ctypedef int (*AccessOp)(PolicyOps* ops, object policy, object key, object now) except -1
ctypedef int (*SetEvictableOp)(PolicyOps* ops, object policy, object key, bint evictable) except -1
# the victim (found[0] = True), or None with found[0] = False when nothing is evictable
ctypedef object (*EvictOneOp)(PolicyOps* ops, object policy, bint* found)

# The class's hooks (`_on_insert`, `_on_access`, `_on_evictable`, `_pop_victim`), which the four
# operations of `EvictionPolicy` call after its own bookkeeping.
ctypedef int (*OnInsertHook)(object policy, object key, object meta, bint evictable) except -1
ctypedef int (*OnAccessHook)(object policy, object key, object meta) except -1
ctypedef int (*OnEvictableHook)(object policy, object key, object meta, bint evictable) except -1
ctypedef object (*PopVictimHook)(object policy)

cdef struct PolicyOps:
    InsertOp insert
    AccessOp access
    SetEvictableOp set_evictable
    EvictOneOp evict_one
    OnInsertHook on_insert
    OnAccessHook on_access
    OnEvictableHook on_evictable
    PopVictimHook pop_victim

# The table of `policy` (by its exact class, and only for a policy built to use the compiled
# core: `policy._compiled`), or NULL: the caller then calls the policy's Python methods.
cdef PolicyOps* ops_for(object policy) except? NULL


# The flat cache with its policy's state in C (`FlatState`, _core_flat_state.pxi) for a compiled
# caller (the simulator's flat event loop, engine_adapter/sim/_flat_run.pyx): `FlatState.lookup`
# of `n` int64 keys, no Python object per key. The re-prefill tracker and the latency record are
# told once per run, as `lookup` tells them once per call: `flat_state_open` before the first
# lookup, `flat_state_close` after the last (in a `finally`). Returns whether the last key hit
# (0 for no key), the hits in `hits[0]`; TypeError for an object that is not a FlatState.
cdef int flat_state_open(object state) except -1
cdef int flat_state_lookup(object state, const int64_t* keys, Py_ssize_t n, Py_ssize_t* hits) except -1
cdef int flat_state_close(object state) except -1


# `KeySet.add` and `discard` of an int64 key (the compiled set of evicted keys, _core_keyset.pxi)
# for a compiled caller: the simulator's radix loop. TypeError for an object that is not a KeySet;
# `keyset_discard_int` gives 1 when the key was there.
cdef int keyset_add_int(object keys, int64_t key) except -1
cdef int keyset_discard_int(object keys, int64_t key) except -1
