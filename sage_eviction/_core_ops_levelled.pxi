# The levelled recency queues' hooks in C: `LevelledRecencyPolicy` of sage_eviction/recency.py
# (lfu, priority). Part of sage_eviction/_core.pyx, which includes it after _core_ops.pxi, whose
# `_TickQueue` helpers (queue_add_old, queue_touch, queue_discard, queue_pop, _pop_end) it reuses.
#
# Each function mirrors the Python method named in its comment, line for line, over the policy's
# own `_tick`, `_queues`, `_levels` and `_where`.

cdef object _TickQueueType = None  # recency._TickQueue, bound by _register_levelled
cdef object _OrderedDict = None  # collections.OrderedDict, likewise


cdef object _new_tick_queue(object level, object ticks):
    # `_TickQueue(level, ticks, False)` without running its Python __init__ (LFU opens a level
    # at every hit): a bare __new__ with the six slots __init__ sets, the same queue
    queue = _TickQueueType.__new__(_TickQueueType)
    queue.level = level
    queue.ticks = ticks
    queue.newest_first = False
    queue.order = _OrderedDict()
    queue.side = []
    queue.side_live = {}
    return queue


cdef inline object _level_of(object policy, object meta):
    # `self._level(meta)`. LFUPolicy and PriorityPolicy (the only classes registered, exact
    # class) define `_level` as `getattr(meta, level_attr)` (recency.py's contract for
    # `level_attr`, which its bulk load relies on too): read the attribute and skip the Python
    # frame; without `level_attr`, call the method as the Python hooks do.
    attr = policy.level_attr
    if attr is None:
        return policy._level(meta)
    return getattr(meta, attr)


cdef object _levelled_queue_of(object policy, object level):
    # LevelledRecencyPolicy._queue_of
    cdef dict queues = policy._queues
    cdef list levels
    queue = queues.get(level)
    if queue is None:
        queue = _new_tick_queue(level, policy._tick)
        queues[level] = queue
        levels = policy._levels
        _heappush(levels, level)
        if len(levels) > 2 * len(queues) + 16:
            levels = list(queues)
            policy._levels = levels
            _heapify(levels)
    return queue


cdef int _levelled_unlink(object policy, object key) except -1:
    # LevelledRecencyPolicy._unlink
    queue = (<dict>policy._where).pop(key)
    queue_discard(queue, key)
    if not queue.order and not queue.side_live:
        del (<dict>policy._queues)[queue.level]
    return 0


cdef int _levelled_on_insert(object policy, object key, object meta, bint evictable) except -1:
    (<dict>policy._tick)[key] = policy._clock
    if evictable:
        queue = _levelled_queue_of(policy, _level_of(policy, meta))
        queue.order[key] = None
        (<dict>policy._where)[key] = queue
    return 0


cdef int _levelled_on_access(object policy, object key, object meta) except -1:
    (<dict>policy._tick)[key] = policy._clock
    queue = (<dict>policy._where).get(key)
    if queue is None:
        return 0
    level = _level_of(policy, meta)
    if level == queue.level:
        queue_touch(queue, key)
        return 0
    _levelled_unlink(policy, key)
    queue = _levelled_queue_of(policy, level)
    queue.order[key] = None
    (<dict>policy._where)[key] = queue
    return 0


cdef int _levelled_on_evictable(object policy, object key, object meta, bint evictable) except -1:
    if evictable:
        queue = _levelled_queue_of(policy, _level_of(policy, meta))
        queue_add_old(queue, key, (<dict>policy._tick)[key])
        (<dict>policy._where)[key] = queue
    else:
        _levelled_unlink(policy, key)
    return 0


cdef inline object _lowest(list levels):
    # `levels[0]`, with Python's IndexError: this module's indexing is compiled unchecked
    if not levels:
        raise IndexError("list index out of range")
    return levels[0]


cdef object _levelled_pop_victim(object policy):
    cdef list levels = policy._levels
    cdef dict queues = policy._queues
    queue = queues.get(_lowest(levels))
    while queue is None:
        _heappop(levels)
        queue = queues.get(_lowest(levels))
    # `queue.order.popitem(last=False)[0]` by _pop_end: the same key leaves the same dict
    key = queue_pop(queue) if queue.side else _pop_end(queue.order, False)
    if not queue.order and not queue.side_live:
        del queues[queue.level]
    del (<dict>policy._where)[key]
    del (<dict>policy._tick)[key]
    return key


cdef int _register_levelled() except -1:
    global _TickQueueType, _OrderedDict
    from collections import OrderedDict
    from sage_eviction.policies.lfu import LFUPolicy
    from sage_eviction.policies.priority import PriorityPolicy
    from sage_eviction.recency import _TickQueue

    _TickQueueType = _TickQueue
    _OrderedDict = OrderedDict
    cdef PolicyOps ops = hooked(
        _levelled_on_insert, _levelled_on_access, _levelled_on_evictable, _levelled_pop_victim
    )
    for cls in (LFUPolicy, PriorityPolicy):
        register(cls, ops)
    return 0
