# The two clocks of the ghost set for int64 keys, over the core's int64 table (I64Map): part of
# engine_adapter/cache/_ghosts.pyx, included after sage_eviction/_core_i64map.pxi. Each mirrors
# the class of the same name in ghosts.py (ReuseClock, ReuseTimes) step for step, quirks
# included (a key given twice in one `access_many` counts twice, as there), so that the rows are
# the same whichever runs.

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free, qsort, realloc
from libc.string cimport memset

cdef enum:
    _RUN = 1024  # positions per run of the marks (ghosts._RUN)


cdef struct Pair:
    int64_t position
    int64_t key


cdef int _by_position(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const Pair*>a).position, y = (<const Pair*>b).position
    return (x > y) - (x < y)


cdef void _map_each(I64Map* m, int64_t* per_run, Pair* pairs, int64_t start) noexcept:
    # over the (key, position) entries of a clock's map: count them per run of positions
    # (`per_run`), or copy those at or after `start` into `pairs` (in slot order)
    cdef Py_ssize_t i, n = 0
    cdef int64_t key, position
    for i in range(m.mask + 2):
        if i <= m.mask:
            if m.keys[i] == _FREE:
                continue
            key, position = m.keys[i], m.vals[i]
        elif m.holds_min:  # the key INT64_MIN, kept aside
            key, position = _FREE, m.min_val
        else:
            break
        if per_run != NULL:
            per_run[position // _RUN] += 1
        elif position >= start:
            pairs[n].position = position
            pairs[n].key = key
            n += 1


cdef int64_t _select(int64_t* a, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    # the k-th smallest of a[:n] (distinct values), reordering `a`: Hoare's selection, O(n)
    # expected; `sorted(values)[k]` without the sort (ReuseTimes' halving cut)
    cdef Py_ssize_t lo = 0, hi = n - 1, i, j
    cdef int64_t pivot, t
    while lo < hi:
        pivot = a[lo + (hi - lo) // 2]
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                t = a[i]
                a[i] = a[j]
                a[j] = t
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]
    return a[k]


cdef class IntReuseClock:
    """`ghosts.ReuseClock` for int64 keys: the marks in a C byte array, the runs' counts in an
    int64 array, the keys' last positions in an I64Map (16 bytes a slot instead of a dict
    entry and an int object). The marks grow past `size` only for a lookup longer than the
    whole clock, as the bytearray's slice assignment does there."""

    cdef readonly Py_ssize_t horizon
    cdef Py_ssize_t size  # positions before a compaction (`ghosts.ReuseClock._size`)
    cdef Py_ssize_t cap  # positions the arrays hold (size, or more after an over-long lookup)
    cdef Py_ssize_t now
    cdef uint8_t* marks
    cdef int64_t* runs
    cdef I64Map last
    cdef int64_t* old  # the last compaction's kept positions, ascending (its remap)
    cdef Py_ssize_t n_old
    cdef bint dropped

    def __cinit__(self, Py_ssize_t horizon):
        self.horizon = horizon if horizon > 1 else 1
        self.size = self.cap = 8 * self.horizon + 64  # as ReuseClock: compactions stay rare
        self.marks = <uint8_t*>calloc(self.cap, 1)
        self.runs = <int64_t*>calloc(self.cap // _RUN + 1, sizeof(int64_t))
        self.old = NULL
        _map_init(&self.last, 16, True)
        if self.marks == NULL or self.runs == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.marks)
        free(self.runs)
        free(self.old)
        _map_free(&self.last)

    def stamp(self) -> int:
        """The position the next access takes."""
        return self.now

    def distinct_since(self, int64_t stamp) -> int:
        """Distinct keys accessed at or after `stamp` (capped at `horizon`)."""
        return self._distinct_since(stamp)

    def room(self, Py_ssize_t n) -> bool:
        """Whether `n` more accesses fit before `compact` is needed."""
        return self.now + n <= self.size

    @property
    def full(self) -> bool:
        """The next access needs `compact` first."""
        return self.now >= self.size

    def access_many(self, keys) -> None:
        """`access` of each key in order."""
        cdef int64_t[::1] buf = _int64s(keys)
        self._access_many(&buf[0] if buf.shape[0] else NULL, buf.shape[0])

    def access(self, int64_t key) -> None:
        """Record an access of `key`."""
        self._access_many(&key, 1)

    def compact(self):
        """Keep the `horizon` most recent keys, renumbered from 0; the remap of old stamps."""
        self._compact()
        return Remap(self)

    cdef Py_ssize_t _distinct_since(self, int64_t stamp) noexcept:
        cdef Py_ssize_t i, end, last_run, count = 0
        if stamp < 0:
            return self.horizon
        end = (stamp // _RUN + 1) * _RUN
        if end >= self.now:
            for i in range(stamp, self.now):
                count += self.marks[i]
            return count if count < self.horizon else self.horizon
        for i in range(stamp, end):
            count += self.marks[i]
        last_run = (self.now - 1) // _RUN  # the runs after it are empty
        for i in range(end // _RUN, last_run + 1):
            count += self.runs[i]
        return count if count < self.horizon else self.horizon

    cdef int _reserve(self, Py_ssize_t n) except -1:
        # arrays for positions up to now + n (only a lookup longer than the clock needs more)
        cdef Py_ssize_t want = self.now + n, cap = self.cap, runs_before = self.cap // _RUN + 1
        if want <= cap:
            return 0
        while cap < want:
            cap *= 2
        self.marks = <uint8_t*>_resized(self.marks, cap)
        memset(self.marks + self.cap, 0, cap - self.cap)
        self.runs = <int64_t*>_resized(self.runs, (cap // _RUN + 1) * sizeof(int64_t))
        memset(self.runs + runs_before, 0, (cap // _RUN + 1 - runs_before) * sizeof(int64_t))
        self.cap = cap
        return 0

    cdef int _access_many(self, const int64_t* keys, Py_ssize_t n) except -1:
        # ReuseClock.access_many: the previous marks cleared first (all of them read before any
        # is written, as its map(last.get, keys)), then the new positions marked and recorded
        cdef Py_ssize_t i, pos = self.now, end = self.now + n, step
        cdef int64_t prev
        self._reserve(n)
        for i in range(n):
            prev = _map_get(&self.last, keys[i])
            if prev != _ABSENT:
                self.marks[prev] = 0
                self.runs[prev // _RUN] -= 1
        memset(self.marks + pos, 1, n)
        while pos < end:  # each run the new positions fall in
            step = min(end, (pos // _RUN + 1) * _RUN) - pos
            self.runs[pos // _RUN] += step
            pos += step
        for i in range(n):
            _map_put(&self.last, keys[i], end - n + i)
        self.now = end
        return 0

    cdef int _compact(self) except -1:
        # ReuseClock.compact: the `horizon` most recent keys (positions are distinct: one key
        # each), renumbered from 0. Only the runs of positions that hold them are gathered and
        # sorted (a count of keys per run says which): scratch of about `horizon` pairs, not of
        # every key the clock remembers (up to 8 * horizon)
        cdef Py_ssize_t n_runs = self.now // _RUN + 1, r, total = 0, k, i
        cdef int64_t* per_run = <int64_t*>calloc(n_runs, sizeof(int64_t))
        cdef Pair* pairs = NULL
        cdef int64_t* keys = NULL
        try:
            if per_run == NULL:
                raise MemoryError()
            _map_each(&self.last, per_run, NULL, 0)
            r = n_runs
            while r > 0 and total < self.horizon:
                r -= 1
                total += per_run[r]
            pairs = <Pair*>malloc((total + 1) * sizeof(Pair))
            if pairs == NULL:
                raise MemoryError()
            _map_each(&self.last, NULL, pairs, r * _RUN)
            qsort(pairs, total, sizeof(Pair), _by_position)
            k = min(total, self.horizon)
            free(self.old)
            self.old = <int64_t*>malloc((k + 1) * sizeof(int64_t))
            keys = <int64_t*>malloc((k + 1) * sizeof(int64_t))
            if self.old == NULL or keys == NULL:
                raise MemoryError()
            for i in range(k):  # the newest k, oldest first
                self.old[i] = pairs[total - k + i].position
                keys[i] = pairs[total - k + i].key
            self.n_old, self.dropped = k, k == self.horizon
            _map_free(&self.last)
            _map_init(&self.last, 2 * k, True)
            memset(self.marks, 0, self.now)
            memset(self.runs, 0, (self.cap // _RUN + 1) * sizeof(int64_t))
            self.now = 0
            self._access_many(keys, k)
        finally:
            free(per_run)
            free(pairs)
            free(keys)
        return 0

    cdef int64_t _remap(self, int64_t stamp) noexcept:
        # ReuseClock.compact's remap: -1 before every key kept (when some were forgotten),
        # else bisect_left(old, stamp)
        cdef Py_ssize_t lo = 0, hi = self.n_old, mid
        if stamp < 0 or (self.dropped and stamp < self.old[0]):
            return -1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.old[mid] < stamp:
                lo = mid + 1
            else:
                hi = mid
        return lo


cdef class Remap:
    """What `IntReuseClock.compact` returns: an old stamp -> its new one (valid until the next
    compaction, which is also what ReuseClock's closure is used for)."""

    cdef IntReuseClock clock

    def __cinit__(self, IntReuseClock clock):
        self.clock = clock

    def __call__(self, int64_t stamp) -> int:
        return self.clock._remap(stamp)


cdef class IntReuseTimes:
    """`ghosts.ReuseTimes` for int64 keys: the last positions in an I64Map; past 2 * `horizon`
    keys those below the median position go (the same cut, `sorted(values)[len // 2]`, found
    by selection instead of a sort)."""

    cdef readonly Py_ssize_t horizon
    cdef I64Map last
    cdef int64_t now

    def __cinit__(self, Py_ssize_t horizon, Py_ssize_t keys=0):
        # `keys`: the distinct keys it will hold, when known (the simulator's unbounded row: its
        # pool); the table is sized to them once, instead of doubling (the old and the new table
        # held at once) as they come
        self.horizon = horizon if horizon > 1 else 1
        _map_init(&self.last, max(16, (min(keys, 2 * self.horizon) * 4) // 3 + 1), True)

    def __dealloc__(self):
        _map_free(&self.last)

    def access(self, int64_t key):
        """Record a lookup of `key`; lookups since its previous one (None: new or forgotten)."""
        return self._access_many(&key, 1, 1)[0]

    def access_many(self, keys, n_timed=None) -> list:
        """`access` of each key in order; the reuse times of the first `n_timed` (all by
        default; a slice's bounds, as keys[:n_timed])."""
        cdef int64_t[::1] buf = _int64s(keys)
        cdef Py_ssize_t n = buf.shape[0]
        timed = n if n_timed is None else len(range(n)[:n_timed])
        return self._access_many(&buf[0] if n else NULL, n, timed)

    cdef list _access_many(self, const int64_t* keys, Py_ssize_t n, Py_ssize_t n_timed):
        cdef Py_ssize_t i
        cdef int64_t* times = <int64_t*>malloc((n_timed + 1) * sizeof(int64_t))
        if times == NULL:
            raise MemoryError()
        try:
            self._access_into(keys, n, n_timed, times)
            return [None if times[i] < 0 else times[i] for i in range(n_timed)]
        finally:
            free(times)

    cdef int _access_into(self, const int64_t* keys, Py_ssize_t n, Py_ssize_t n_timed, int64_t* times) except -1:
        # `_access_many` into `times` (-1 for None): the simulator's compiled loop reads it
        cdef Py_ssize_t i
        cdef int64_t prev, now = self.now
        for i in range(n_timed):  # every previous position read before any is written
            prev = _map_get(&self.last, keys[i])
            times[i] = -1 if prev == _ABSENT else now + i - prev - 1
        for i in range(n):
            _map_put(&self.last, keys[i], now + i)
        self.now = now + n
        if self.last.size > 2 * self.horizon:
            self._halve()
        return 0

    cdef int _halve(self) except -1:
        # keep the keys at or after the median position (ReuseTimes: its dict comprehension),
        # deleting the others in place: scratch of one position per key, no second table
        cdef I64Map* m = &self.last
        cdef Py_ssize_t n = m.size, i, j = 0
        cdef int64_t cut
        cdef int64_t* sel = <int64_t*>malloc((n + 1) * sizeof(int64_t))
        if sel == NULL:
            raise MemoryError()
        for i in range(m.mask + 1):
            if m.keys[i] != _FREE:
                sel[j] = m.vals[i]
                j += 1
        if m.holds_min:
            sel[j] = m.min_val
        cut = _select(sel, n, n // 2)
        free(sel)
        if m.holds_min and m.min_val < cut:
            _map_del(m, _FREE)
        i = 0
        while i <= m.mask:  # a deletion shifts a later entry into slot i: look at it again
            if m.keys[i] != _FREE and m.vals[i] < cut:
                _map_del(m, m.keys[i])
            else:
                i += 1
        return 0
