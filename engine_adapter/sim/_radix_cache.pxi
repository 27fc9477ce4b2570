# The cache of the simulator's compiled radix loop: `CacheCore`, the `CacheManager` of one row
# (engine_adapter/cache/cache_manager.py with its admission, running sequences and eviction
# step). Part of engine_adapter/sim/_radix_run.pyx, included after the tree, the policy kinds and
# the accounting.
#
# Its sequences are the run's requests by index: a running one holds its cached path (matched,
# then committed) and a table length; `allocate`, `reserve`, `release` and `select_victims` are
# `CacheManager.allocate` + `commit_blocks`, `reserve_tokens`, `free_sequence` / `preempt` and
# `select_preemption_victims(1, exclude)`, with `EvictionStep.evict`'s counters (calls, blocks,
# the policy's decision time, memory utilization), the re-prefill tracker's evicted keys (the
# core's `KeySet`) and the accounting (`Accounting`); with `protect_queued`, the waiting
# requests' protected prefixes (`QueueProtection`, engine_adapter/cache/queue_protection.py:
# `protect`, `release`, `reclaimable_for`, `yield_for`, each ported below).

cdef enum:
    # the preemption order's key over running sequences (its name in radix_run._CANDIDATE_KEYS)
    C_LRU = 0
    C_FIFO = 1
    C_MRU = 2
    C_FILO = 3
    C_GDSF = 4

cdef int BAIL = -3  # where the Python code raises: the Python loop runs the row instead


cdef inline int64_t _ceil_div(int64_t a, int64_t b) noexcept:
    # -(-a // b) for a >= 0
    return (a + b - 1) // b


cdef class CacheCore:
    """One row's radix cache, its sequences' blocks, its counters and its accounting."""

    cdef Tree tree
    cdef readonly Accounting acct
    cdef object evicted_keys
    cdef int64_t block_size, num_free
    cdef readonly int64_t num_blocks
    cdef int candidates  # the policy's candidate key (C_LRU ...)
    cdef double seconds_per_tick
    cdef Py_ssize_t n
    cdef int32_t** path  # per sequence: its cached path while it runs
    cdef int64_t* path_len
    cdef int64_t* table_len  # blocks it holds
    cdef double* admitted_at  # its SequenceState's last_access (the preemption order)
    cdef int64_t* seq_tokens  # its SequenceState's num_tokens (gdsf's candidate key)
    cdef int64_t* run_prev  # the running sequences in admission order, a linked list
    cdef int64_t* run_next
    cdef int64_t run_head, run_tail
    cdef int64_t* victims  # one eviction call's keys
    cdef int32_t* victim_tenant
    cdef readonly object latency_ring  # numpy: the decision times' window (LatencyRecorder's ring)
    cdef double[::1] ring
    cdef readonly int64_t preemptions, total_evictions, eviction_calls, re_prefilled
    cdef readonly int64_t latency_count, latency_next
    cdef readonly bint needs_order  # a tree without an order (P_NONE) had to evict: the run bailed
    cdef readonly double utilization_sum
    # queue protection (QueueProtection; off when `max_protected` is 0, and nothing allocated):
    # each waiting request's protected path, the protections in the order they were made (a
    # list by request: the newest yields first), the protections holding each node (its
    # `_refs`: a protected node is locked, so it keeps its key), the distinct protected nodes
    cdef readonly int64_t max_protected, num_protected, protections_yielded
    cdef int32_t** prot_path
    cdef int64_t* prot_len
    cdef int64_t* prot_prev
    cdef int64_t* prot_next
    cdef int64_t prot_head, prot_tail
    cdef int32_t* prot_refs  # by node
    cdef uint8_t* prot_mark  # by node: reclaimable_for's scratch (1: in the path, 2: counted)

    def __cinit__(self):
        self.path = NULL
        self.path_len = self.table_len = self.seq_tokens = self.run_prev = self.run_next = self.victims = NULL
        self.admitted_at = NULL
        self.victim_tenant = NULL
        self.prot_path = NULL
        self.prot_len = self.prot_prev = self.prot_next = NULL
        self.prot_refs = NULL
        self.prot_mark = NULL

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.path != NULL:
            for i in range(self.n):
                free(self.path[i])
            free(self.path)
        if self.tree.parent != NULL:  # built (`_tree_free` clears it)
            _tree_free(&self.tree)
        free(self.path_len)
        free(self.table_len)
        free(self.seq_tokens)
        free(self.run_prev)
        free(self.run_next)
        free(self.victims)
        free(self.admitted_at)
        free(self.victim_tenant)
        if self.prot_path != NULL:
            for i in range(self.n):
                free(self.prot_path[i])
            free(self.prot_path)
        free(self.prot_len)
        free(self.prot_prev)
        free(self.prot_next)
        free(self.prot_refs)
        free(self.prot_mark)

    def __init__(self, settings, Accounting acct, Py_ssize_t n):
        """`settings`: `radix_run.RadixSettings`; `n` sequences (the run's requests)."""
        cdef Py_ssize_t i
        self.acct, self.evicted_keys, self.n = acct, settings.evicted_keys, n
        self.block_size, self.num_blocks = settings.block_size, settings.num_blocks
        self.num_free, self.candidates = self.num_blocks, settings.candidates
        self.seconds_per_tick = tick_seconds()
        self.latency_ring = numpy.empty(settings.latency_window, dtype=numpy.float64)
        self.ring = self.latency_ring
        _tree_init(&self.tree, self.num_blocks, self.block_size, settings.policy_kind, settings.policy_flags,
                   settings.policy, settings.distinct_keys)
        self.path = <int32_t**>_alloc((n + 1) * sizeof(int32_t*))
        for i in range(n):
            self.path[i] = NULL
        self.path_len = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.table_len = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.seq_tokens = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.admitted_at = <double*>_alloc((n + 1) * sizeof(double))
        self.run_prev = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.run_next = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.run_head = self.run_tail = -1
        self.victims = <int64_t*>_alloc((self.num_blocks + 1) * sizeof(int64_t))
        self.victim_tenant = <int32_t*>_alloc((self.num_blocks + 1) * sizeof(int32_t))
        for i in range(n):
            self.path_len[i] = self.table_len[i] = 0
        self.max_protected = settings.max_protected
        self.prot_head = self.prot_tail = -1
        if self.max_protected > 0:
            self.prot_path = <int32_t**>_alloc((n + 1) * sizeof(int32_t*))
            self.prot_len = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
            self.prot_prev = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
            self.prot_next = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
            self.prot_refs = <int32_t*>calloc(self.num_blocks + 1, sizeof(int32_t))
            self.prot_mark = <uint8_t*>calloc(self.num_blocks + 1, sizeof(uint8_t))
            if self.prot_refs == NULL or self.prot_mark == NULL:
                raise MemoryError()
            for i in range(n):
                self.prot_path[i] = NULL
                self.prot_len[i] = 0

    @property
    def order_kind(self) -> int:
        """The policy kind of its tree's eviction order (_kinds.pxi: P_NONE, 12, keeps none)."""
        return self.tree.nodes.kind

    cdef int _needs_order(self) noexcept:
        # the unbounded row's pool is every block of its run, so it never evicts, save where a
        # key recurs under another prefix (a tree node per place, one pool block per key): the
        # run stops, and `radix_run` runs the row again with its policy's order
        self.needs_order = True
        return BAIL

    # ---- CacheManager.allocate and commit_blocks ------------------------------------------------

    cdef int64_t allocate(self, int64_t i, const int64_t* keys, int64_t n_keys, int64_t tokens,
                          int64_t prompt_tokens, int64_t end, int32_t tenant, double now) except -2:
        # RadixModel.allocate: the prompt's blocks served from cache; -1: the cache cannot give
        # it its blocks now (the head of the queue waits); BAIL: the Python code raises
        cdef int64_t bs = self.block_size, n_blocks = _ceil_div(tokens, bs), n_full = min(n_keys, tokens // bs)
        cdef int64_t n_path, n_new, deficit, reclaimable, j
        cdef int32_t* path
        _pol_serve(&self.tree.nodes, keys, n_keys, end)  # Belady's cursor (`RadixModel.allocate`)
        if n_blocks > self.num_blocks:
            return BAIL  # RequestTooLargeError
        path = <int32_t*>_alloc((n_keys + 1) * sizeof(int32_t))
        n_path = _match(&self.tree, keys, n_full, path)
        n_new = n_blocks - n_path
        deficit = n_new - self.num_free  # EvictionStep.deficit
        if deficit > 0:
            reclaimable = self.tree.num_reclaimable - _reclaimable_in(&self.tree, path, n_path)
            if deficit > reclaimable and self.prot_head >= 0:  # the protections yield if that is enough
                reclaimable = self._yield_for(deficit, path, n_path)
            if deficit > reclaimable:
                free(path)
                return -1  # NoEvictableBlocksError
            if self.tree.nodes.kind == P_NONE:
                free(path)
                return self._needs_order()
        self.release_protection(i)  # it leaves the queue; its protected head is in `path`
        _lock(&self.tree, path, n_path)
        _touch(&self.tree, path, n_path)
        if deficit > 0:
            self._evict(deficit, n_new, now)
        self.num_free -= n_new
        self.path[i], self.path_len[i], self.table_len[i] = path, n_path, n_blocks
        self.admitted_at[i], self.seq_tokens[i] = now, tokens
        self._run_append(i)
        for j in range(n_path, n_full):  # CacheMetrics.record_lookup: the missed keys come back?
            self.re_prefilled += keyset_discard_int(self.evicted_keys, keys[j])
        self.acct.lookup(keys, n_full, path, n_path, self.tree.created, tenant, now)
        self._commit(i, keys, min(n_keys, prompt_tokens // bs, n_blocks), tenant, now)
        return n_path

    cdef int _commit(self, int64_t i, const int64_t* keys, int64_t n_keys, int32_t tenant, double now) except -1:
        # RadixCache.commit: the sequence's blocks past its path cached, locked, each under the
        # last, up to the first key cached already
        cdef int32_t* path = self.path[i]
        cdef int64_t n = self.path_len[i], j
        cdef int32_t parent = path[n - 1] if n else -1
        for j in range(n, n_keys):
            if _map_get(&self.tree.index, keys[j]) != _ABSENT:
                break
            parent = _insert(&self.tree, parent, keys[j], <int32_t>j, now, tenant, True, True)
            path[n] = parent
            n += 1
        self.path_len[i] = n
        return 0

    # ---- reserve_tokens, free_sequence and preempt ----------------------------------------------

    cdef int reserve(self, int64_t i, int64_t tokens, double now) except -2:
        # RunningSequences.reserve_tokens: 1 when its blocks cover `tokens`, 0 when not even
        # eviction gives the blocks (nothing changed), BAIL when the Python code raises
        cdef int64_t needed = _ceil_div(tokens, self.block_size) - self.table_len[i], deficit
        if needed > 0:
            if self.table_len[i] + needed > self.num_blocks:
                return BAIL  # RequestTooLargeError
            deficit = needed - self.num_free  # EvictionStep.room_for
            if deficit > 0:
                if deficit > self.tree.num_reclaimable and self.prot_head >= 0:
                    self._yield_for(deficit, NULL, 0)
                if deficit > self.tree.num_reclaimable:
                    return 0
                if self.tree.nodes.kind == P_NONE:
                    return self._needs_order()
                self._evict(deficit, needed, now)
            self.num_free -= needed
            self.table_len[i] += needed
        self.seq_tokens[i] = max(self.seq_tokens[i], tokens)
        return 1

    cdef int release(self, int64_t i, const int64_t* keys, int64_t n_keys, int64_t prompt_tokens, int32_t tenant,
                     double now, bint preempted) except -1:
        # RunningSequences.release (free_sequence, preempt): its computed blocks past its path
        # cached as an unlocked chain (a duplicate of a cached block freed), its path unlocked,
        # the rest of its table freed
        cdef int64_t n_cache = min(n_keys, prompt_tokens // self.block_size, self.table_len[i])
        cdef int32_t* path = self.path[i]
        cdef int64_t n = self.path_len[i], stop = max(n_cache, n), to_free = 0, j, existing
        cdef int32_t parent = path[n - 1] if n else -1, last_new = -1
        for j in range(n, n_cache):
            existing = _map_get(&self.tree.index, keys[j])
            if existing == _ABSENT:
                parent = last_new = _insert(&self.tree, parent, keys[j], <int32_t>j, now, tenant, False, False)
            elif self.tree.parent[existing] == parent:
                to_free += 1  # a duplicate of a cached block: the cached one stays
                parent = <int32_t>existing
            else:
                stop = j
                break
        if last_new >= 0:
            _refresh(&self.tree, last_new)
        to_free += max(self.table_len[i] - stop, 0)
        _unlock(&self.tree, path, n)
        free(path)
        self.path[i] = NULL
        self.path_len[i] = self.table_len[i] = 0
        self._run_remove(i)
        self.num_free += to_free
        self.preemptions += preempted
        return 0

    # ---- queue protection (QueueProtection and Admission.protect) ------------------------------

    cdef int64_t protect(self, int64_t i, const int64_t* keys, int64_t n_keys, int64_t tokens) except -1:
        # Admission.protect: the waiting request's cached prefix (the path `allocate` would hit)
        # protected from its head as far as the budget goes, replacing its earlier protection;
        # blocks another protection holds cost nothing of the budget. Returns blocks protected.
        cdef int64_t n_full = min(n_keys, tokens // self.block_size), n_path, room, end = 0, j
        cdef int32_t* path
        cdef int32_t node
        if self.max_protected <= 0:
            return 0
        self.release_protection(i)
        path = <int32_t*>_alloc((n_full + 1) * sizeof(int32_t))
        n_path = _match(&self.tree, keys, n_full, path)
        room = self.max_protected - self.num_protected
        for j in range(n_path):  # the longest head of the path within the budget
            if self.prot_refs[path[j]] == 0:
                if room <= 0:
                    break
                room -= 1
            end += 1
        if end == 0:
            free(path)
            return 0
        _lock(&self.tree, path, end)
        for j in range(end):
            node = path[j]
            if self.prot_refs[node] == 0:
                self.num_protected += 1
            self.prot_refs[node] += 1
        self.prot_path[i], self.prot_len[i] = path, end
        self.prot_prev[i], self.prot_next[i] = self.prot_tail, -1  # the newest, at the tail
        if self.prot_tail >= 0:
            self.prot_next[self.prot_tail] = i
        else:
            self.prot_head = i
        self.prot_tail = i
        return end

    cdef int64_t release_protection(self, int64_t i) except -1:
        # QueueProtection.release: the request's protection ends; returns blocks it held
        cdef int32_t* path
        cdef int64_t n, j
        cdef int32_t node
        if self.prot_path == NULL or self.prot_path[i] == NULL:
            return 0
        path, n = self.prot_path[i], self.prot_len[i]
        if self.prot_prev[i] >= 0:
            self.prot_next[self.prot_prev[i]] = self.prot_next[i]
        else:
            self.prot_head = self.prot_next[i]
        if self.prot_next[i] >= 0:
            self.prot_prev[self.prot_next[i]] = self.prot_prev[i]
        else:
            self.prot_tail = self.prot_prev[i]
        _unlock(&self.tree, path, n)  # `_unprotect`
        for j in range(n):
            node = path[j]
            self.prot_refs[node] -= 1
            if self.prot_refs[node] == 0:
                self.num_protected -= 1
        free(path)
        self.prot_path[i], self.prot_len[i] = NULL, 0
        return n

    cdef int64_t _reclaimable_for(self, const int32_t* path, int64_t n_path) except -1:
        # QueueProtection.reclaimable_for: blocks eviction could reclaim for a request that locks
        # `path` once every protection has yielded: a protected block held by protections alone
        # counts, unless the request locks it
        cdef int64_t reclaimable = self.tree.num_reclaimable - _reclaimable_in(&self.tree, path, n_path)
        cdef int64_t i, j
        cdef int32_t node
        if self.num_protected == 0:
            return reclaimable
        for j in range(n_path):
            self.prot_mark[path[j]] = 1
        i = self.prot_head
        while i >= 0:
            for j in range(self.prot_len[i]):
                node = self.prot_path[i][j]
                if self.prot_mark[node] == 0:
                    self.prot_mark[node] = 2  # each protected node counted once
                    reclaimable += self.tree.ref[node] == self.prot_refs[node]
            i = self.prot_next[i]
        i = self.prot_head
        while i >= 0:
            for j in range(self.prot_len[i]):
                self.prot_mark[self.prot_path[i][j]] = 0
            i = self.prot_next[i]
        for j in range(n_path):
            self.prot_mark[path[j]] = 0
        return reclaimable

    cdef int64_t _yield_for(self, int64_t deficit, const int32_t* path, int64_t n_path) except -1:
        # QueueProtection.yield_for: the newest protections yield until `deficit` blocks are
        # reclaimable beside the locked `path`, only when yielding can make enough; returns the
        # blocks reclaimable then (protection never fails an allocation that could succeed)
        cdef int64_t reclaimable = self.tree.num_reclaimable - _reclaimable_in(&self.tree, path, n_path)
        if deficit > reclaimable and self.prot_head >= 0 and deficit <= self._reclaimable_for(path, n_path):
            while deficit > reclaimable:
                self.release_protection(self.prot_tail)  # `_yield_newest`
                self.protections_yielded += 1
                reclaimable = self.tree.num_reclaimable - _reclaimable_in(&self.tree, path, n_path)
        return reclaimable

    cdef void _run_append(self, int64_t i) noexcept:
        self.run_prev[i], self.run_next[i] = self.run_tail, -1
        if self.run_tail >= 0:
            self.run_next[self.run_tail] = i
        else:
            self.run_head = i
        self.run_tail = i

    cdef void _run_remove(self, int64_t i) noexcept:
        if self.run_prev[i] >= 0:
            self.run_next[self.run_prev[i]] = self.run_next[i]
        else:
            self.run_head = self.run_next[i]
        if self.run_next[i] >= 0:
            self.run_prev[self.run_next[i]] = self.run_prev[i]
        else:
            self.run_tail = self.run_prev[i]

    # ---- select_preemption_victims ---------------------------------------------------------------

    cdef inline bint _candidate_before(self, int64_t i, int64_t j) noexcept:
        # the preemption order's key(i) < key(j); the simulator never touches a
        # running sequence (`touch_sequence`), so every candidate's access count is 0 and the
        # keys of sieve, arc, slru ("seen once first"), s3fifo and lfu order as lru's
        cdef double a, b
        if self.candidates == C_LRU:
            return self.admitted_at[i] < self.admitted_at[j]
        if self.candidates == C_FIFO:
            return i < j
        if self.candidates == C_MRU:
            return -self.admitted_at[i] < -self.admitted_at[j]
        if self.candidates == C_FILO:
            return -i < -j
        # gdsf: (accesses + 1) * tokens / blocks, then lru
        a = <double>self.seq_tokens[i] / <double>max(self.table_len[i], 1)
        b = <double>self.seq_tokens[j] / <double>max(self.table_len[j], 1)
        return a < b or (a == b and self.admitted_at[i] < self.admitted_at[j])

    cdef Py_ssize_t select_victims(self, int64_t asking, const int64_t* admitted, Py_ssize_t n_admitted,
                                   int64_t* out) except -1:
        # CacheManager.select_preemption_victims(1, exclude=[asking, *admitted]): the running
        # sequences in the policy's order (ties: admission order) until they free a block (all
        # of them when together they cannot), into `out`
        cdef Py_ssize_t m = 0, j, k, count
        cdef int64_t i = self.run_head, freed = 0
        cdef bint skip
        while i >= 0:
            skip = i == asking
            for j in range(n_admitted):
                skip = skip or admitted[j] == i
            if not skip:  # a stable insertion sort by key
                k = m
                while k > 0 and self._candidate_before(i, out[k - 1]):
                    out[k] = out[k - 1]
                    k -= 1
                out[k] = i
                m += 1
            i = self.run_next[i]
        for count in range(m):
            freed += self.table_len[out[count]]
            if freed >= 1:
                return count + 1
        return m

    # ---- EvictionStep.evict with its counters, the re-prefill tracker and the accounting -------

    cdef int64_t _evict(self, int64_t n, int64_t pending, double now) except -1:
        cdef int64_t count = 0, j, used, first_id
        cdef int32_t node
        cdef unsigned long long took = 0, t0
        while count < n:
            t0 = sage_ticks()
            node = _evict_one(&self.tree)
            took += sage_ticks() - t0
            if node < 0:
                break
            self.victims[count] = self.tree.nodes.key[node]
            self.victim_tenant[count] = self.tree.tenant[node]
            self.acct.victim(self.tree.tenant[node], now - self.tree.created[node])
            count += 1
        if count == 0:
            return 0
        self.num_free += count
        first_id = self.total_evictions + 1  # the victims' eviction ids
        self.eviction_calls += 1
        self.total_evictions += count
        self._record_latency(<double>took * self.seconds_per_tick)
        used = self.num_blocks - self.num_free
        self.utilization_sum += <double>min(used + pending, self.num_blocks) / <double>self.num_blocks
        for j in range(count):  # ReprefillTracker.on_evicts
            keyset_add_int(self.evicted_keys, self.victims[j])
        self.acct.evicted(self.victims, self.victim_tenant, count, first_id, now, self.tree.num_reclaimable)
        return count

    cdef void _record_latency(self, double seconds) noexcept:
        # LatencyRecorder.record (its count; the total is not in the row)
        cdef Py_ssize_t window = self.ring.shape[0]
        self.latency_count += 1
        if self.latency_count <= window:
            self.ring[self.latency_count - 1] = seconds
        else:
            self.ring[self.latency_next] = seconds
            self.latency_next = (self.latency_next + 1) % window
