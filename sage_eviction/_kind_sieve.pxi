# SIEVE in the simulator's radix loop (sage_eviction/policies/sieve.py, `SIEVEPolicy`): a FIFO
# queue of the evictable nodes, one visited bit per node, and a hand that sweeps from the tail
# toward the head. Part of engine_adapter/sim/_radix_run.pyx, which includes the core's intrusive
# lists (`Ends`, `_link_head`, `_unlink`: _core_flat_lists.pxi) before it.
#
# The queue is a doubly linked list in two int32 arrays by node (`newer` toward the head, `older`
# toward the tail; -1 ends it), so a hit costs one byte store and an eviction's sweep no
# allocation. As in the Python policy, a node that stops being evictable is unlinked (the hand
# never passes a locked block) and keeps its bit; one made evictable again is linked at the head
# as if newly admitted; a hand resting on a node that leaves moves to its newer neighbour (-1:
# the next sweep starts at the tail).


cdef struct SieveState:
    int32_t* newer  # by node: its neighbour toward the head, -1 at the head
    int32_t* older  # toward the tail, -1 at the tail
    uint8_t* visited  # the visited bit, by node (linked or not)
    Ends q  # the newest (head) and the oldest (tail) linked node, -1: the queue is empty
    int32_t hand  # where the next sweep starts; -1: at the tail


cdef inline SieveState* _sieve(Nodes* t) noexcept:
    return <SieveState*>t.pol


cdef int _sieve_init(Nodes* t, object policy) except -1:
    cdef SieveState* s = <SieveState*>malloc(sizeof(SieveState))
    if s == NULL:
        raise MemoryError()
    t.pol = s
    # + 1: a pool of 0 blocks still gets three valid (unused) arrays to free
    s.newer = <int32_t*>malloc((t.capacity + 1) * sizeof(int32_t))
    s.older = <int32_t*>malloc((t.capacity + 1) * sizeof(int32_t))
    s.visited = <uint8_t*>malloc((t.capacity + 1) * sizeof(uint8_t))
    s.q.head = s.q.tail = s.hand = -1
    if s.newer == NULL or s.older == NULL or s.visited == NULL:
        raise MemoryError()
    return 0


cdef void _sieve_free(Nodes* t) noexcept:
    cdef SieveState* s = _sieve(t)
    free(s.newer)
    free(s.older)
    free(s.visited)
    free(s)
    t.pol = NULL


cdef inline void _sieve_link_head(SieveState* s, int32_t node) noexcept:
    # `SIEVEPolicy._link_head`
    _link_head(s.newer, s.older, &s.q, node)


cdef inline void _sieve_unlink(SieveState* s, int32_t node) noexcept:
    # `SIEVEPolicy._unlink`: the hand moves off a node that leaves, to its newer neighbour
    if s.hand == node:
        s.hand = s.newer[node]
    _unlink(s.newer, s.older, &s.q, node)


cdef int _sieve_insert(Nodes* t, int32_t node, bint evictable) except -1:
    # a new entry, bit clear (a reused node's old bit is not its own), linked when evictable
    cdef SieveState* s = _sieve(t)
    s.visited[node] = 0
    if evictable:
        _sieve_link_head(s, node)
    return 0


cdef int _sieve_access(Nodes* t, int32_t node) except -1:
    # a hit sets the bit and moves nothing, linked or not
    _sieve(t).visited[node] = 1
    return 0


cdef int _sieve_evictable(Nodes* t, int32_t node, bint evictable) except -1:
    # the base calls this only when the flag changes, so a node is linked exactly while evictable
    cdef SieveState* s = _sieve(t)
    if evictable:
        _sieve_link_head(s, node)
    else:
        _sieve_unlink(s, node)
    return 0


cdef int32_t _sieve_pop(Nodes* t) except -2:
    # `_pop_victim`: from the hand (the tail when it is off the queue), clear each visited bit
    # passed toward the head, wrapping to the tail, and take the first unvisited node; the hand
    # rests on its newer neighbour. The sweep ends: it clears each bit it passes, so the second
    # lap at the latest finds an unvisited node.
    cdef SieveState* s = _sieve(t)
    cdef int32_t node = s.hand if s.hand >= 0 else s.q.tail
    if node < 0:
        raise RuntimeError("the sieve policy's queue has no evictable node")
    while s.visited[node]:
        s.visited[node] = 0
        node = s.newer[node]
        if node < 0:
            node = s.q.tail
    s.hand = s.newer[node]
    _sieve_unlink(s, node)
    return node
