# The score heap: `ScoreHeap`, `sorted_keys`.
# Part of sage_eviction/_core.pyx, which includes it: one extension module, split by idea;
# its reference is sage_eviction/heap.py, `_ListHeap`.

ctypedef struct Entry:
    double k0
    double k1
    double k2
    PyObject* item  # a strong reference to the Python item tuple


cdef inline bint before(Entry* a, Entry* b) noexcept nogil:
    """Python's tuple order over the numbers (unused ones are 0 in both)."""
    if a.k0 != b.k0:
        return a.k0 < b.k0
    if a.k1 != b.k1:
        return a.k1 < b.k1
    return a.k2 < b.k2


cdef class ScoreHeap:
    """A 4-ary min-heap of item tuples `(*numbers, key)` (1 to 3 numbers, the same count for
    every item), ordered as the tuples are, with lazy deletion: an item is live while
    `live[key] is item`. The numbers sit in a C array beside each item, so a sift compares
    doubles in adjacent memory instead of following pointers to tuples and floats.

    The policies' items tie only between a stale item and the live one of the same key (their
    numbers end with a unique tick or push number), so any heap pops live items in the order
    heapq does.
    """

    cdef Entry* data  # data[1 + 4j .. 4 + 4j], siblings, share one 128-byte block
    cdef void* raw  # the allocation `data` lies in
    cdef Py_ssize_t size
    cdef Py_ssize_t cap
    cdef Py_ssize_t width  # numbers per item; 0 until the first item

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.size):
            Py_DECREF(<object>self.data[i].item)
        PyMem_Free(self.raw)

    def __len__(self):
        return self.size

    cdef bint _entry(self, object item, Entry* e) except -1:
        cdef Py_ssize_t n
        if not PyTuple_CheckExact(item):
            return False
        n = PyTuple_GET_SIZE(item) - 1
        if self.width == 0:
            if n < 1 or n > 3:
                return False
            self.width = n
        elif n != self.width:
            return False
        e.k1 = 0.0
        e.k2 = 0.0
        if not as_double(PyTuple_GET_ITEM(item, 0), &e.k0):
            return False
        if n > 1 and not as_double(PyTuple_GET_ITEM(item, 1), &e.k1):
            return False
        if n > 2 and not as_double(PyTuple_GET_ITEM(item, 2), &e.k2):
            return False
        e.item = <PyObject*>item
        return True

    cdef int _reserve(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        cdef Entry* data
        cdef void* raw
        if need <= self.cap:
            return 0
        cap = max(need, 2 * self.cap, 64)
        raw = PyMem_Malloc(cap * sizeof(Entry) + 128)
        if raw == NULL:
            raise MemoryError()
        # align &data[1] to 128 bytes: a node's four children are then two cache lines
        data = <Entry*>((((<uintptr_t>raw + sizeof(Entry)) + 127) & ~(<uintptr_t>127)) - sizeof(Entry))
        if self.size:
            memcpy(data, self.data, self.size * sizeof(Entry))
        PyMem_Free(self.raw)
        self.raw = raw
        self.data = data
        self.cap = cap
        return 0

    cdef void _sift_down(self, Py_ssize_t i) noexcept nogil:
        """Move data[i] down to its place (4-ary: children 4i+1 .. 4i+4)."""
        cdef Entry moving = self.data[i]
        cdef Py_ssize_t child, best, last, n = self.size
        while True:
            child = 4 * i + 1
            if child >= n:
                break
            best = child
            last = min(child + 4, n)
            child += 1
            while child < last:
                if before(&self.data[child], &self.data[best]):
                    best = child
                child += 1
            if not before(&self.data[best], &moving):
                break
            self.data[i] = self.data[best]
            i = best
        self.data[i] = moving

    cdef void _sift_up(self, Py_ssize_t i) noexcept nogil:
        cdef Entry moving = self.data[i]
        cdef Py_ssize_t parent
        while i > 0:
            parent = (i - 1) >> 2
            if not before(&moving, &self.data[parent]):
                break
            self.data[i] = self.data[parent]
            i = parent
        self.data[i] = moving

    cpdef bint push(self, object item) except -1:
        """Add `item`; False (nothing added) when its numbers are not all exact doubles."""
        cdef Entry e
        if not self._entry(item, &e):
            return False
        self._reserve(self.size + 1)
        Py_INCREF(item)
        self.data[self.size] = e
        self.size += 1
        self._sift_up(self.size - 1)
        return True

    cdef bint fill_unordered(self, object items) except -1:
        """Replace the contents with `items`, not yet in heap order; False, leaving the heap
        empty, when one of them is not all exact doubles."""
        cdef list seq = list(items)
        cdef Py_ssize_t i, n = len(seq)
        cdef Entry e
        self.clear()
        self._reserve(n)
        for i in range(n):
            if not self._entry(seq[i], &e):
                self.clear()
                return False
            Py_INCREF(seq[i])
            self.data[self.size] = e
            self.size += 1
        return True

    cpdef bint fill(self, object items) except -1:
        """Replace the contents with `items` (heapified at once); False, leaving the heap empty,
        when one of them is not all exact doubles."""
        cdef Py_ssize_t i, n
        if not self.fill_unordered(items):
            return False
        n = self.size
        i = (n - 2) >> 2 if n > 1 else -1
        while i >= 0:
            self._sift_down(i)
            i -= 1
        return True

    cpdef clear(self):
        cdef Py_ssize_t i
        cdef Py_ssize_t n = self.size
        self.size = 0
        self.width = 0
        for i in range(n):
            Py_DECREF(<object>self.data[i].item)

    cpdef object pop_live(self, dict live, dict ticks):
        """Pop items until one is live, delete its key from `live` and `ticks`, return it.

        Raises:
            IndexError: No live item is left.
        """
        cdef Entry top
        cdef object item, key
        cdef PyObject* current
        while self.size:
            top = self.data[0]
            self.size -= 1
            if self.size:
                self.data[0] = self.data[self.size]
                self._sift_down(0)
            item = <object>top.item
            Py_DECREF(item)  # `item` holds its own reference now
            key = <object>PyTuple_GET_ITEM(item, PyTuple_GET_SIZE(item) - 1)
            current = PyDict_GetItemWithError(live, key)
            if current == top.item:
                PyDict_DelItem(live, key)
                PyDict_DelItem(ticks, key)
                return item
        raise IndexError("pop from an empty score heap")

    def items(self):
        """Every item held, stale ones included, in no particular order."""
        cdef Py_ssize_t i
        return [<object>self.data[i].item for i in range(self.size)]

    def __reduce__(self):
        # pickle and deepcopy: the items (memoised with the policy's `_live`, so that the
        # identity `pop_live` checks survives), heapified again on load
        return (_score_heap_of, (self.items(),))


cdef int merge_sort(Entry* a, Py_ssize_t n) except -1:
    """Sort a[0:n] by `before`, stably: bottom-up merges through a buffer (the comparison
    inlined, which libc's qsort cannot: 3x faster at 1e6 entries)."""
    cdef Entry* buf = <Entry*>PyMem_Malloc(n * sizeof(Entry) if n > 0 else 1)
    cdef Entry* src = a
    cdef Entry* dst = buf
    cdef Entry* tmp
    cdef Py_ssize_t width = 1, lo, mid, hi, i, j, k
    if buf == NULL:
        raise MemoryError()
    with nogil:
        while width < n:
            lo = 0
            while lo < n:
                mid = min(lo + width, n)
                hi = min(lo + 2 * width, n)
                i, j, k = lo, mid, lo
                while i < mid and j < hi:
                    if before(&src[j], &src[i]):
                        dst[k] = src[j]
                        j += 1
                    else:
                        dst[k] = src[i]
                        i += 1
                    k += 1
                while i < mid:
                    dst[k] = src[i]
                    i += 1
                    k += 1
                while j < hi:
                    dst[k] = src[j]
                    j += 1
                    k += 1
                lo = hi
            tmp = src
            src = dst
            dst = tmp
            width *= 2
    if src != a:
        memcpy(a, src, n * sizeof(Entry))
    PyMem_Free(buf)
    return 0


def sorted_keys(object items):
    """`[item[-1] for item in sorted(items)]` for live items `(*numbers, key)` whose numbers
    tell every two apart (they end with a unique tick or push number), by a C sort of their
    doubles (stable, as `sorted`); None when one is not all exact doubles (then Python sorts them)."""
    cdef ScoreHeap holder = ScoreHeap()  # converts the items and owns the references
    cdef Py_ssize_t i
    cdef list out
    if not holder.fill_unordered(items):
        return None
    merge_sort(holder.data, holder.size)
    out = [None] * holder.size
    for i in range(holder.size):
        out[i] = <object>PyTuple_GET_ITEM(<object>holder.data[i].item, PyTuple_GET_SIZE(<object>holder.data[i].item) - 1)
    return out


def _score_heap_of(items):
    heap = ScoreHeap()
    if not heap.fill(items):
        raise ValueError("score heap items that are not all numbers and a key")
    return heap
