# The C API of the compiled ghost set (`IntGhostSet`, _ghosts.pyx) for another compiled module:
# the simulator's radix loop (engine_adapter/sim/_radix_run.pyx) tells it each lookup and each
# eviction call with int64 arrays, no Python object per key. Each function takes the ghost set as
# an object (TypeError for one that is not an IntGhostSet) and does what its Python method does:
# `ghosts_lookup` is `IntGhostSet.lookup` (the hits' reuse times into `times`, -1 for None; each
# missed ghost as a `GhostFound`, removed), `ghosts_stamp` `stamp()`, `ghosts_add_evicted` is
# `add_many(keys, range(first_id, first_id + n), tenants, call)` with the tenants as the set's
# own ids (`ghosts_tenant_id`; None is 0).

from libc.stdint cimport int32_t, int64_t


cdef struct GhostFound:
    Py_ssize_t index  # its place in the lookup's keys
    bint regret
    double evicted_at
    int32_t tenant  # the set's id of its tenant (`ghosts_tenant_id`)


cdef int ghosts_lookup(object ghosts, const int64_t* keys, Py_ssize_t n, Py_ssize_t n_hit,
                       int64_t* times, GhostFound* found, Py_ssize_t* n_found) except -1
cdef int64_t ghosts_stamp(object ghosts) except -1
cdef int32_t ghosts_tenant_id(object ghosts, object tenant) except -1
cdef int ghosts_add_evicted(object ghosts, const int64_t* keys, Py_ssize_t n, int64_t first_id,
                            const int32_t* tenants, object call) except -1
