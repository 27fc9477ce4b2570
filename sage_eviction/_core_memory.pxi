# Allocation that raises instead of returning NULL, for the compiled modules that keep C arrays:
# included (setup.py's include path has sage_eviction/) by engine_adapter/cache/_ghosts.pyx and
# engine_adapter/sim/_radix_run.pyx, one source.

from libc.stdlib cimport malloc, realloc


cdef void* _alloc(size_t size) except NULL:
    # `malloc`, or MemoryError
    cdef void* p = malloc(size)
    if p == NULL:
        raise MemoryError()
    return p


cdef void* _resized(void* p, size_t size) except NULL:
    # `realloc`, or MemoryError with `p` left as it was (still the owner's to free)
    cdef void* q = realloc(p, size)
    if q == NULL:
        raise MemoryError()
    return q
