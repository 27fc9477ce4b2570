# SIEVE's and SLRU's hooks in C (sage_eviction/policies/sieve.py, slru.py). Part of
# sage_eviction/_core.pyx, which includes it after _core_ops.pxi (its `_pop_end` is reused).
#
# Each function mirrors the Python method named in its comment, line for line, over the
# policy's own state: SIEVE's `_nodes` dict and its linked `_Node` objects (`_head`, `_tail`,
# `_hand`); SLRU's `_segment` dict and its two OrderedDicts.

# ---- SIEVE (policies/sieve.py) -------------------------------------------------------------------

cdef object _SieveNode = None  # sieve._Node, bound by _register_sieve


cdef object _sieve_node(object key):
    # `_Node(key)` without running its Python __init__: the object a bare __new__ gives, with
    # the four slots __init__ sets (the same node; the differential test compares them)
    node = _SieveNode.__new__(_SieveNode)
    node.key = key
    node.visited = False
    node.newer = None
    node.older = None
    return node


cdef int _ops_sieve_link_head(object policy, object node) except -1:
    # SIEVEPolicy._link_head
    head = policy._head
    node.newer = None
    node.older = head
    if head is None:
        policy._tail = node
    else:
        head.newer = node
    policy._head = node
    return 0


cdef int _ops_sieve_unlink(object policy, object node) except -1:
    # SIEVEPolicy._unlink
    if policy._hand is node:
        policy._hand = node.newer
    newer = node.newer
    older = node.older
    if newer is None:
        policy._head = older
    else:
        newer.older = older
    if older is None:
        policy._tail = newer
    else:
        older.newer = newer
    node.newer = None
    node.older = None
    return 0


cdef int _sieve_on_insert(object policy, object key, object meta, bint evictable) except -1:
    node = _sieve_node(key)
    (<dict>policy._nodes)[key] = node
    if evictable:
        _ops_sieve_link_head(policy, node)
    return 0


cdef int _sieve_on_access(object policy, object key, object meta) except -1:
    (<dict>policy._nodes)[key].visited = True
    return 0


cdef int _sieve_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    node = (<dict>policy._nodes)[key]
    if evictable:
        _ops_sieve_link_head(policy, node)
    else:
        _ops_sieve_unlink(policy, node)
    return 0


cdef object _sieve_pop_victim(object policy):
    node = policy._hand or policy._tail
    assert node is not None  # the base calls this only with an evictable entry
    while node.visited:
        node.visited = False
        node = node.newer or policy._tail
        assert node is not None
    policy._hand = node.newer
    _ops_sieve_unlink(policy, node)
    key = node.key
    del (<dict>policy._nodes)[key]
    return key


# ---- SLRU (policies/slru.py) ---------------------------------------------------------------------

cdef object _SLRU_PROBATION = None  # slru._PROBATION and slru._PROTECTED, bound by _register_sieve
cdef object _SLRU_PROTECTED = None


cdef int _slru_balance(object policy) except -1:
    # SLRUPolicy._balance
    cap = policy._protected_cap
    if cap is None:
        return 0
    protected = policy._protected
    while policy._n_protected > cap and protected:
        # `protected.popitem(last=False)` by _pop_end: the same key leaves the same dict
        key = _pop_end(protected, False)
        (<dict>policy._segment)[key] = _SLRU_PROBATION
        policy._n_protected -= 1
        policy._probation[key] = None
    return 0


cdef int _slru_on_insert(object policy, object key, object meta, bint evictable) except -1:
    (<dict>policy._segment)[key] = _SLRU_PROBATION
    if evictable:
        policy._probation[key] = None
    return 0


cdef int _slru_on_access(object policy, object key, object meta) except -1:
    if (<dict>policy._segment)[key] == _SLRU_PROTECTED:
        protected = policy._protected
        if key in protected:
            protected.move_to_end(key)
        return 0
    if meta.hits >= policy.protected_threshold:
        (<dict>policy._segment)[key] = _SLRU_PROTECTED
        policy._n_protected += 1
        probation = policy._probation
        if key in probation:
            del probation[key]
            policy._protected[key] = None
        _slru_balance(policy)
    else:
        probation = policy._probation
        if key in probation:
            probation.move_to_end(key)
    return 0


cdef int _slru_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    if (<dict>policy._segment)[key] == _SLRU_PROTECTED:
        if evictable:
            policy._protected[key] = None
            _slru_balance(policy)
        else:
            del policy._protected[key]
    elif evictable:
        policy._probation[key] = None
    else:
        del policy._probation[key]
    return 0


cdef object _slru_pop_victim(object policy):
    probation = policy._probation
    if probation:
        # `popitem(last=False)` by _pop_end, here and below: the same key leaves the same dict
        key = _pop_end(probation, False)
    else:
        key = _pop_end(policy._protected, False)
        policy._n_protected -= 1
    del (<dict>policy._segment)[key]
    return key


cdef int _register_sieve() except -1:
    global _SieveNode, _SLRU_PROBATION, _SLRU_PROTECTED
    from sage_eviction.policies import sieve, slru

    _SieveNode = sieve._Node
    _SLRU_PROBATION = slru._PROBATION
    _SLRU_PROTECTED = slru._PROTECTED
    register(sieve.SIEVEPolicy, hooked(
        _sieve_on_insert, _sieve_on_access, _sieve_on_evictable, _sieve_pop_victim
    ))
    register(slru.SLRUPolicy, hooked(
        _slru_on_insert, _slru_on_access, _slru_on_evictable, _slru_pop_victim
    ))
    return 0
