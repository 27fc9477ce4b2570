# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""The simulator's radix row in one compiled call: `Simulator.run()` of the radix cache model.

`engine_adapter.sim.radix_run` prepares the requests as arrays and runs a `RadixLoop`; the Python
event loop (`Simulator.advance`, engine_adapter/sim/simulator.py) over the real `CacheManager`
is the reference, ported step for step for what a plain radix row does:

- the event loop: arrivals, FCFS admission within `max_running` and `max_prefill_tokens` (the
  first admission always fits) while the cache can give the head its blocks, the decode steps'
  block needs (`decode_steps.grow_decoding`) with preemption by recompute (the policy's
  `select_victims` order; the preempted sequence back at the head of the queue), step times
  from the `CostModel` (_sim_cost.pxd), finishes, TTFTs and TPOTs;
- the cache (`CacheManager.allocate`, `commit_blocks`, `reserve_tokens`, `free_sequence`,
  `preempt`): the radix tree and its policy's order in C (_radix_tree.pxi), eviction of exactly
  the deficit, the counters of `EvictionStep` (calls, blocks, decision times, memory
  utilization), the re-prefill tracker's evicted keys (the core's `KeySet`);
- the accounting (`CacheAccounting.on_lookup` and `on_evict`): the age and reuse-distance
  histograms in C arrays, the ghost set through its C API (engine_adapter/cache/_ghosts.pxd),
  the regret window (`CacheAccounting.close_window` told each full window).

Where the Python code raises (a request larger than the pool), `run` returns 1 and the Python
loop runs the row instead (and raises as it does). Floats are computed with the same operations
in the same order as the Python code and `-ffp-contract=off` forbids fused multiply-adds, so
the clock, TTFTs, ages and sums are bit-identical (tests/test_radix_run.py).
"""

from libc.math cimport INFINITY, isnan, NAN
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc

from engine_adapter.cache._ghosts cimport (
    GhostFound,
    ghosts_add_evicted,
    ghosts_lookup,
    ghosts_stamp,
    ghosts_tenant_id,
)
from engine_adapter.sim._sim_cost cimport Cost, _decode_time, _step_time, _steps_until
from sage_eviction._core cimport keyset_add_int, keyset_discard_int, sage_ticks, tick_seconds

import numpy

include "_core_i64map.pxi"
include "_core_flat_lists.pxi"
include "_radix_tree.pxi"
include "_radix_pol_tick.pxi"
include "_radix_pol_sieve.pxi"
include "_radix_pol_levelled.pxi"
include "_radix_pol_s3fifo.pxi"
include "_radix_pol_arc.pxi"
include "_radix_pol_score.pxi"
include "_radix_policy.pxi"
include "_radix_triples.pxi"



# The histograms of `engine_adapter.cache.ages.HISTOGRAM_KINDS`, in the order radix_run.py gives
# their bounds
cdef enum:
    H_HIT = 0  # age_at_hit_seconds
    H_EVICT = 1  # age_at_eviction_seconds
    H_REUSE = 2  # reuse_distance_blocks
    H_REGRET = 3  # regret_age_seconds
    N_KINDS = 4
    MAX_BOUNDS = 32

cdef enum:
    # the policy's candidate_key over running sequences (its `candidate_order`; radix_run.py)
    C_LRU = 0
    C_FIFO = 1
    C_MRU = 2
    C_FILO = 3
    C_GDSF = 4

cdef int BAIL = -3  # where the Python code raises: the Python loop runs the row instead


cdef void* _alloc(size_t size) except NULL:
    cdef void* p = malloc(size)
    if p == NULL:
        raise MemoryError()
    return p


cdef inline int64_t _ceil_div(int64_t a, int64_t b) noexcept:
    # -(-a // b) for a >= 0
    return (a + b - 1) // b


cdef inline int64_t _py_mod(int64_t a, int64_t b) noexcept:
    # Python's a % b (b > 0): never negative
    cdef int64_t r = a % b
    return r + b if r < 0 else r


cdef class RadixLoop:
    """One radix row: the requests' arrays, the cache, the accounting and the event loop's state.

    Built by `engine_adapter.sim.radix_run` from a run's columns and settings; `run(clock)`
    runs it; the figures are its attributes and the arrays it was given."""

    # ---- the requests (read only)
    cdef const int32_t[::1] keys32
    cdef const int64_t[::1] keys64
    cdef bint wide
    cdef int64_t* scratch
    cdef Py_ssize_t scratch_size
    cdef const int64_t[::1] ends, input_len, output_len, groups
    cdef const double[::1] arrivals
    cdef int32_t[::1] tenant  # per request: its tenant as the ghost set's id
    # ---- the outputs
    cdef double[::1] ttfts, tpots
    cdef int64_t[::1] group_served, group_looked, group_order
    cdef unsigned char[::1] group_seen
    cdef readonly object hist_counts, hist_sums, hist_seen  # numpy: (kinds, tenants, buckets) ...
    cdef int64_t[:, :, ::1] h_counts
    cdef double[:, ::1] h_sums
    cdef uint8_t[:, ::1] h_seen
    cdef double bounds[N_KINDS][MAX_BOUNDS]
    cdef Py_ssize_t n_bounds[N_KINDS]
    cdef readonly object latency_ring  # numpy: the last decision times, LatencyRecorder's ring
    cdef double[::1] ring
    # ---- settings
    cdef Cost cost
    cdef int64_t block_size, max_running, max_prefill, progress_every, num_blocks, window, horizon
    cdef object progress, ghosts, evicted_keys, close_window, new_eviction, policy_name
    cdef public list tenant_names  # by the ghost set's id: the histograms' tenant ("-": None)
    cdef double seconds_per_tick
    # ---- the cache
    cdef Tree tree
    cdef int64_t num_free
    cdef int32_t** path  # per request: its cached path while it runs (matched, then committed)
    cdef int64_t* path_len
    cdef int64_t* table_len  # blocks it holds
    cdef double* admitted_at  # its SequenceState's last_access (the preemption order)
    cdef int64_t* run_prev  # the manager's running sequences in admission order, a linked list
    cdef int64_t* run_next
    cdef int64_t run_head, run_tail
    cdef int64_t* victims  # one eviction call's: keys
    cdef int32_t* victim_tenant
    cdef double* tenant_sum  # per tenant, one eviction call's ages (NaN: none of it yet)
    cdef int32_t* tenant_order  # the tenants of one eviction call's victims
    cdef int n_call_tenants
    cdef int64_t* times  # one lookup's reuse times
    cdef GhostFound* found  # one lookup's ghosts
    # ---- the simulator's sequences
    cdef int64_t* decoded
    cdef int64_t* epoch
    cdef int64_t* start_step
    cdef int64_t* context_base
    cdef int64_t* tokens
    cdef double* first_token  # NaN: none yet
    cdef uint8_t* running_flag
    cdef int64_t* front  # preempted sequences at the head of the queue, a stack (top: next)
    cdef Py_ssize_t n_front
    cdef int64_t* admitted  # one step's admissions
    cdef Py_ssize_t n_admitted
    cdef int64_t* cand  # preemption candidates
    cdef int64_t* seq_tokens  # its SequenceState's num_tokens (gdsf's candidate key)
    cdef int candidates  # the policy's candidate key (C_LRU ...)
    cdef int64_t* cand_buf  # one step's due needs: targets, then sequences
    cdef Triples finishes, needs
    # ---- the run
    cdef readonly double clock
    cdef readonly int64_t step, decoding, context_sum, n_running
    cdef readonly Py_ssize_t n, next_arrival, head, finished, n_ttfts, n_tpots, n_groups_seen
    cdef readonly int64_t block_lookups, block_hits, tokens_looked_up, tokens_hit, total_tokens
    cdef int64_t prefill_tokens, prefill_batch, cached_tokens
    # ---- the counters (CacheManager's, EvictionStep's, CacheAccounting's)
    cdef readonly int64_t preemptions, total_evictions, eviction_calls, re_prefilled
    cdef readonly double utilization_sum, latency_total
    cdef readonly int64_t latency_count, latency_next
    cdef readonly int64_t missed, ghost_hits, regrets, window_missed, window_regrets

    def __cinit__(self):
        self.scratch = NULL
        self.path = NULL
        self.path_len = self.table_len = self.run_prev = self.run_next = self.victims = NULL
        self.admitted_at = self.tenant_sum = self.first_token = NULL
        self.seq_tokens = NULL
        self.decoded = self.epoch = self.start_step = self.context_base = self.tokens = NULL
        self.front = self.admitted = self.cand = self.times = self.cand_buf = NULL
        self.victim_tenant = self.tenant_order = NULL
        self.running_flag = NULL
        self.found = NULL
        _triples_clear(&self.finishes)
        _triples_clear(&self.needs)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.path != NULL:
            for i in range(self.n):
                free(self.path[i])
            free(self.path)
        if self.tree.key != NULL:
            _tree_free(&self.tree)
        free(self.scratch)
        free(self.path_len)
        free(self.table_len)
        free(self.run_prev)
        free(self.run_next)
        free(self.victims)
        free(self.admitted_at)
        free(self.tenant_sum)
        free(self.first_token)
        free(self.seq_tokens)
        free(self.decoded)
        free(self.epoch)
        free(self.start_step)
        free(self.context_base)
        free(self.tokens)
        free(self.front)
        free(self.admitted)
        free(self.cand)
        free(self.cand_buf)
        free(self.times)
        free(self.victim_tenant)
        free(self.tenant_order)
        free(self.running_flag)
        free(self.found)
        _triples_free(&self.finishes)
        _triples_free(&self.needs)

    # ---- set-up -----------------------------------------------------------------------------

    def __init__(self, columns, settings, tenant_codes, tenant_objects):
        """`columns`: the run's requests (`flat_run.FlatColumns`); `settings`:
        `radix_run.RadixSettings`; `tenant_codes`: per request its tenant's index in
        `tenant_objects` (-1: None)."""
        cdef Py_ssize_t i, n = columns.arrivals.shape[0]
        cdef const int32_t[::1] codes = tenant_codes
        self.n = n
        self.wide = columns.keys.dtype.itemsize == 8
        if self.wide:
            self.keys64 = columns.keys
        else:
            self.keys32 = columns.keys
        self.ends, self.arrivals = columns.ends, columns.arrivals
        self.input_len, self.output_len, self.groups = columns.input_len, columns.output_len, columns.groups
        self.ttfts = numpy.empty(n, dtype=numpy.float64)
        self.tpots = numpy.empty(n, dtype=numpy.float64)
        self.group_served = numpy.zeros(columns.n_groups, dtype=numpy.int64)
        self.group_looked = numpy.zeros(columns.n_groups, dtype=numpy.int64)
        self.group_order = numpy.empty(columns.n_groups, dtype=numpy.int64)
        self.group_seen = bytearray(columns.n_groups)
        self._set_settings(settings)
        # each tenant as the ghost set's id: the ghosts' tenants and the histograms' index
        ids = [ghosts_tenant_id(self.ghosts, t) for t in tenant_objects]
        none_id = ghosts_tenant_id(self.ghosts, None)
        self.tenant = numpy.empty(n, dtype=numpy.int32)
        for i in range(n):
            self.tenant[i] = none_id if codes[i] < 0 else ids[codes[i]]
        self.tenant_names = ["-"] * (max(ids + [none_id]) + 1)
        for t, g in zip(tenant_objects, ids):
            self.tenant_names[g] = t
        self._allocate(n, len(self.tenant_names))

    cdef int _set_settings(self, settings) except -1:
        cdef Py_ssize_t k, j
        (self.cost.prefill_base, self.cost.prefill_per_token, self.cost.prefill_attn, self.cost.decode_base,
         self.cost.decode_per_seq, self.cost.decode_per_ctx) = settings.cost
        self.block_size, self.max_running = settings.block_size, settings.max_running
        self.max_prefill, self.num_blocks = settings.max_prefill_tokens, settings.num_blocks
        self.progress, self.progress_every = settings.progress, settings.progress_every
        self.ghosts, self.evicted_keys = settings.ghosts, settings.evicted_keys
        self.window, self.horizon = settings.window, settings.horizon
        self.close_window, self.new_eviction = settings.close_window, settings.new_eviction
        self.policy_name, self.seconds_per_tick = settings.policy_name, tick_seconds()
        self.candidates = settings.candidates
        if len(settings.bounds) != N_KINDS:
            raise ValueError("one bounds tuple per histogram kind")
        for k, bounds in enumerate(settings.bounds):
            if len(bounds) > MAX_BOUNDS - 1:
                raise ValueError("too many histogram bounds")
            self.n_bounds[k] = len(bounds)
            for j, bound in enumerate(bounds):
                self.bounds[k][j] = bound
        self.latency_ring = numpy.empty(settings.latency_window, dtype=numpy.float64)
        self.ring = self.latency_ring
        _tree_init(&self.tree, self.num_blocks, self.block_size, settings.policy_kind, settings.policy_flags,
                   settings.policy)
        self.num_free = self.num_blocks
        return 0

    cdef int _allocate(self, Py_ssize_t n, Py_ssize_t n_tenants) except -1:
        cdef Py_ssize_t i
        self.hist_counts = numpy.zeros((N_KINDS, n_tenants, MAX_BOUNDS), dtype=numpy.int64)
        self.hist_sums = numpy.zeros((N_KINDS, n_tenants), dtype=numpy.float64)
        self.hist_seen = numpy.zeros((N_KINDS, n_tenants), dtype=numpy.uint8)
        self.h_counts, self.h_sums, self.h_seen = self.hist_counts, self.hist_sums, self.hist_seen
        self.path = <int32_t**>_alloc((n + 1) * sizeof(int32_t*))
        for i in range(n):
            self.path[i] = NULL
        self.path_len = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.table_len = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.admitted_at = <double*>_alloc((n + 1) * sizeof(double))
        self.run_prev = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.run_next = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.run_head = self.run_tail = -1
        self.decoded = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.epoch = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.start_step = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.context_base = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.tokens = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.first_token = <double*>_alloc((n + 1) * sizeof(double))
        self.running_flag = <uint8_t*>_alloc((n + 1) * sizeof(uint8_t))
        self.front = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.admitted = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.cand = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.seq_tokens = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.cand_buf = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
        for i in range(n):
            self.decoded[i] = self.epoch[i] = self.start_step[i] = self.context_base[i] = 0
            self.tokens[i] = self._prompt_tokens(i)
            self.first_token[i] = NAN
            self.running_flag[i] = 0
            self.path_len[i] = self.table_len[i] = 0
        self.victims = <int64_t*>_alloc((self.num_blocks + 1) * sizeof(int64_t))
        self.victim_tenant = <int32_t*>_alloc((self.num_blocks + 1) * sizeof(int32_t))
        self.tenant_sum = <double*>_alloc((n_tenants + 1) * sizeof(double))
        self.tenant_order = <int32_t*>_alloc((n_tenants + 1) * sizeof(int32_t))
        for i in range(n_tenants):
            self.tenant_sum[i] = NAN  # NaN: no victim of this tenant in the call yet
        return 0

    # ---- a request's keys --------------------------------------------------------------------

    cdef inline Py_ssize_t _start(self, Py_ssize_t i) noexcept:
        return self.ends[i - 1] if i > 0 else 0

    cdef inline int64_t _n_keys(self, Py_ssize_t i) noexcept:
        return self.ends[i] - self._start(i)

    cdef inline int64_t _prompt_tokens(self, Py_ssize_t i) noexcept:
        # SimSequence.prompt_tokens: a partial last block of the keys counts whole
        return max(self.input_len[i], self._n_keys(i) * self.block_size)

    cdef int _ensure(self, Py_ssize_t n) except -1:
        # room for one request's n keys: widened keys, reuse times, ghosts found
        if n + 1 <= self.scratch_size:
            return 0
        free(self.scratch)
        free(self.times)
        free(self.found)
        self.scratch = self.times = NULL
        self.found = NULL
        self.scratch_size = 0
        self.scratch = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
        self.times = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
        self.found = <GhostFound*>_alloc(2 * (n + 1) * sizeof(GhostFound))
        self.scratch_size = 2 * (n + 1)
        return 0

    cdef const int64_t* _keys(self, Py_ssize_t i) except NULL:
        # request i's keys as int64s (the int32 column widened into the scratch buffer)
        cdef Py_ssize_t start = self._start(i), n = self.ends[i] - start, j
        self._ensure(n)
        if self.wide:
            return &self.keys64[start] if n else self.scratch
        for j in range(n):
            self.scratch[j] = self.keys32[start + j]
        return self.scratch

    # ---- the cache: CacheManager's allocate, commit, reserve, release -------------------------

    cdef int64_t _allocate_seq(self, Py_ssize_t i) except -2:
        # RadixModel.allocate: the prompt's blocks served from cache; -1: the cache cannot give
        # it its blocks now (the head of the queue waits); BAIL: the Python code raises
        cdef int64_t bs = self.block_size, tokens = self.tokens[i], nk = self._n_keys(i)
        cdef const int64_t* keys = self._keys(i)
        cdef int64_t n_blocks = _ceil_div(tokens, bs), n_full = min(nk, tokens // bs)
        cdef int64_t n_path, n_new, deficit, reclaimable, j
        cdef double now = self.clock
        cdef int32_t* path
        _pol_serve(&self.tree, keys, nk, self.ends[i])  # Belady's cursor (`RadixModel.allocate`)
        if n_blocks > self.num_blocks:
            return BAIL  # RequestTooLargeError
        path = <int32_t*>_alloc((nk + 1) * sizeof(int32_t))
        n_path = _match(&self.tree, keys, n_full, path)
        n_new = n_blocks - n_path
        deficit = n_new - self.num_free  # EvictionStep.deficit
        if deficit > 0:
            reclaimable = self.tree.num_reclaimable - _reclaimable_in(&self.tree, path, n_path)
            if deficit > reclaimable:
                free(path)
                return -1  # NoEvictableBlocksError
        _lock(&self.tree, path, n_path)
        _touch(&self.tree, path, n_path)
        if deficit > 0:
            self._evict(deficit, n_new)
        self.num_free -= n_new
        self.path[i], self.path_len[i], self.table_len[i] = path, n_path, n_blocks
        self.admitted_at[i] = now
        self.seq_tokens[i] = tokens
        self._run_append(i)
        for j in range(n_path, n_full):  # CacheMetrics.record_lookup: the missed keys come back?
            self.re_prefilled += keyset_discard_int(self.evicted_keys, keys[j])
        self._account_lookup(keys, n_full, path, n_path, self.tenant[i], now)
        self._commit(i, keys, min(nk, self._prompt_tokens(i) // bs, n_blocks), now)
        return n_path

    cdef int _commit(self, Py_ssize_t i, const int64_t* keys, int64_t n_keys, double now) except -1:
        # RadixCache.commit: the sequence's blocks past its path cached, locked, each under the
        # last, up to the first key cached already
        cdef int32_t* path = self.path[i]
        cdef int64_t n = self.path_len[i], j
        cdef int32_t parent = path[n - 1] if n else -1
        for j in range(n, n_keys):
            if _map_get(&self.tree.index, keys[j]) != _ABSENT:
                break
            parent = _insert(&self.tree, parent, keys[j], <int32_t>j, now, self.tenant[i], True, True)
            path[n] = parent
            n += 1
        self.path_len[i] = n
        return 0

    cdef int _reserve(self, Py_ssize_t i, int64_t tokens) except -2:
        # RunningSequences.reserve_tokens: 1 when its blocks cover `tokens`, 0 when not even
        # eviction gives the blocks (nothing changed), BAIL when the Python code raises
        cdef int64_t needed = _ceil_div(tokens, self.block_size) - self.table_len[i], deficit
        if needed <= 0:
            self.seq_tokens[i] = max(self.seq_tokens[i], tokens)
            return 1
        if self.table_len[i] + needed > self.num_blocks:
            return BAIL  # RequestTooLargeError
        deficit = needed - self.num_free  # EvictionStep.room_for
        if deficit > 0:
            if deficit > self.tree.num_reclaimable:
                return 0
            self._evict(deficit, needed)
        self.num_free -= needed
        self.table_len[i] += needed
        self.seq_tokens[i] = max(self.seq_tokens[i], tokens)
        return 1

    cdef int _release(self, Py_ssize_t i) except -1:
        # RunningSequences.release (free_sequence, preempt): its computed blocks past its path
        # cached as an unlocked chain (a duplicate of a cached block freed), its path unlocked,
        # the rest of its table freed
        cdef int64_t bs = self.block_size, nk = self._n_keys(i)
        cdef const int64_t* keys = self._keys(i)
        cdef int64_t n_keys = min(nk, self._prompt_tokens(i) // bs, self.table_len[i])
        cdef int32_t* path = self.path[i]
        cdef int64_t n = self.path_len[i], stop = max(n_keys, n), to_free = 0, j, existing
        cdef int32_t parent = path[n - 1] if n else -1, last_new = -1
        for j in range(n, n_keys):
            existing = _map_get(&self.tree.index, keys[j])
            if existing == _ABSENT:
                parent = last_new = _insert(&self.tree, parent, keys[j], <int32_t>j, self.clock, self.tenant[i],
                                            False, False)
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
        return 0

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

    # ---- eviction: EvictionStep.evict with its counters, the re-prefill tracker, the accounting

    cdef int64_t _evict(self, int64_t n, int64_t pending) except -1:
        cdef int64_t count = 0, j, used
        cdef int32_t node
        cdef unsigned long long took = 0, t0
        cdef double now = self.clock
        while count < n:
            t0 = sage_ticks()
            node = _evict_one(&self.tree)
            took += sage_ticks() - t0
            if node < 0:
                break
            self.victims[count] = self.tree.key[node]
            self.victim_tenant[count] = self.tree.tenant[node]
            self._victim_age(self.tree.tenant[node], now - self.tree.created[node])
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
        self._close_victim_ages()
        # CacheAccounting.on_evict: each victim a ghost, the call's fields shared
        call = self.new_eviction(now, ghosts_stamp(self.ghosts), self.tree.num_reclaimable, self.policy_name)
        ghosts_add_evicted(self.ghosts, self.victims, count, first_id, self.victim_tenant, call)
        return count

    cdef void _record_latency(self, double seconds) noexcept:
        # LatencyRecorder.record
        cdef Py_ssize_t window = self.ring.shape[0]
        self.latency_count += 1
        self.latency_total += seconds
        if self.latency_count <= window:
            self.ring[self.latency_count - 1] = seconds
        else:
            self.ring[self.latency_next] = seconds
            self.latency_next = (self.latency_next + 1) % window

    # ---- the accounting: CacheAccounting.on_lookup and on_evict's ages -------------------------

    cdef inline void _observe(self, int kind, int32_t tenant, double value) noexcept:
        # one value in its bucket: bisect_left over the kind's bounds
        cdef Py_ssize_t j = 0, nb = self.n_bounds[kind]
        while j < nb and self.bounds[kind][j] < value:
            j += 1
        self.h_counts[kind, tenant, j] += 1

    cdef inline void _add_sum(self, int kind, int32_t tenant, double total) noexcept:
        # AgeHistograms.observe_many's `sums[key] += sum(values)` (the histogram exists now)
        self.h_sums[kind, tenant] += total
        self.h_seen[kind, tenant] = 1

    cdef void _victim_age(self, int32_t tenant, double age) noexcept:
        # one victim's age, summed per tenant as on_evict groups them
        self._observe(H_EVICT, tenant, age)
        if isnan(self.tenant_sum[tenant]):
            self.tenant_sum[tenant] = 0.0
            self.tenant_order[self.n_call_tenants] = tenant
            self.n_call_tenants += 1
        self.tenant_sum[tenant] += age

    cdef void _close_victim_ages(self) noexcept:
        cdef Py_ssize_t j
        cdef int32_t tenant
        for j in range(self.n_call_tenants):
            tenant = self.tenant_order[j]
            self._add_sum(H_EVICT, tenant, self.tenant_sum[tenant])
            self.tenant_sum[tenant] = NAN
        self.n_call_tenants = 0

    cdef int _account_lookup(self, const int64_t* keys, int64_t n, const int32_t* path, int64_t n_hit,
                             int32_t tenant, double now) except -1:
        cdef double total = 0.0, value
        cdef Py_ssize_t j, n_found = 0
        cdef GhostFound* ghost
        if n_hit:  # age_at_hit_seconds
            for j in range(n_hit):
                value = now - self.tree.created[path[j]]
                self._observe(H_HIT, tenant, value)
                total += value
            self._add_sum(H_HIT, tenant, total)
        ghosts_lookup(self.ghosts, keys, n, n_hit, self.times, self.found, &n_found)
        if n_hit:  # reuse_distance_blocks: a time forgotten or never seen counts as the horizon
            total = 0.0
            for j in range(n_hit):
                value = <double>(self.horizon if self.times[j] < 0 else self.times[j])
                self._observe(H_REUSE, tenant, value)
                total += value
            self._add_sum(H_REUSE, tenant, total)
        for j in range(n_found):
            ghost = &self.found[j]
            self.ghost_hits += 1
            if ghost.regret:
                self.regrets += 1
                self.window_regrets += 1
                value = now - ghost.evicted_at
                self._observe(H_REGRET, ghost.tenant, value)
                self._add_sum(H_REGRET, ghost.tenant, value)
        return self._count_misses(n - n_hit)

    cdef int _count_misses(self, int64_t n) except -1:
        # CacheAccounting._count_misses: a full window's ratio goes to `close_window`
        cdef double ratio
        self.missed += n
        self.window_missed += n
        if self.window_missed < self.window:
            return 0
        ratio = <double>self.window_regrets / <double>self.window_missed
        self.window_missed = self.window_regrets = 0
        self.close_window(ratio)
        return 0

    # ---- the simulator's steps (Simulator's methods of the same names) ------------------------

    cdef inline bint _waiting(self) noexcept:
        return self.n_front > 0 or self.head < self.next_arrival

    cdef inline int64_t _queue_head(self) noexcept:
        return self.front[self.n_front - 1] if self.n_front else self.head

    cdef inline void _dequeue(self) noexcept:
        if self.n_front:
            self.n_front -= 1
        else:
            self.head += 1

    cdef void _count_lookup(self, Py_ssize_t i, int64_t hits, int64_t served) noexcept:
        # a first admission (re-admissions are re-prefill, no lookup); a group joins the group
        # order at its first admission, as the reference's dict inserts it
        cdef int64_t group = self.groups[i]
        self.block_lookups += self._n_keys(i)
        self.block_hits += hits
        self.tokens_looked_up += self.input_len[i]
        self.tokens_hit += served
        if not self.group_seen[group]:
            self.group_seen[group] = 1
            self.group_order[self.n_groups_seen] = group
            self.n_groups_seen += 1
        self.group_served[group] += served
        self.group_looked[group] += self.input_len[i]

    cdef int _admit(self) except -2:
        # first come first served within the running and prefill limits, while the cache gives
        # the head of the queue its blocks
        cdef int64_t hits, served
        cdef Py_ssize_t i
        self.prefill_tokens = self.prefill_batch = self.cached_tokens = 0
        self.n_admitted = 0
        while self._waiting() and self.n_running < self.max_running and self.prefill_tokens < self.max_prefill:
            i = self._queue_head()
            hits = self._allocate_seq(i)
            if hits == BAIL:
                return BAIL
            if hits < 0:
                break
            served = min(hits * self.block_size, self.input_len[i])
            self._dequeue()
            if self.epoch[i] == 0:
                self._count_lookup(i, hits, served)
            self.prefill_tokens += self.input_len[i] + self.decoded[i] - served
            self.cached_tokens += served
            self.prefill_batch += 1
            self.running_flag[i] = 1
            self.n_running += 1
            self.admitted[self.n_admitted] = i
            self.n_admitted += 1
        return 0

    cdef int _push_next_need(self, int64_t i, int64_t target) except -1:
        # decode_steps.push_next_need: its next block, while it still decodes then
        cdef int64_t nxt = target + self.block_size
        if nxt <= self.start_step[i] + self.output_len[i] - self.decoded[i] - 1:
            _triples_push(&self.needs, nxt, i, self.epoch[i])
        return 0

    cdef Py_ssize_t _due_needs(self, int64_t* want_target, int64_t* want_seq) except -1:
        # decode_steps.due_needs: the current needs due by this step, up to a block past the first
        cdef Py_ssize_t m = 0
        cdef int64_t bound = self.needs.a[0] + self.block_size, target, i, epoch
        while self.needs.size and self.needs.a[0] <= self.step and self.needs.a[0] < bound:
            target, i, epoch = self.needs.a[0], self.needs.b[0], self.needs.c[0]
            _triples_pop(&self.needs)
            if self.running_flag[i] and self.epoch[i] == epoch:
                want_target[m], want_seq[m] = target, i
                m += 1
        return m

    cdef int _grow_decoding(self, bint* preempted) except -2:
        # decode_steps.grow_decoding: each due need its block, preempting by the policy's choice
        # (never one admitted this step) when the pool is short
        cdef int64_t* want_target = self.cand_buf
        cdef int64_t* want_seq = self.cand_buf + self.n + 1
        cdef Py_ssize_t m, done, j, n_victims
        cdef int64_t i, target, tokens
        cdef int got
        while self.needs.size and self.needs.a[0] <= self.step:
            m = self._due_needs(want_target, want_seq)
            done = 0
            while done < m:  # reserve_many: in order, up to the first that falls short
                i = want_seq[done]
                got = self._reserve(i, self.tokens[i] + want_target[done] - self.start_step[i])
                if got == BAIL:
                    return BAIL
                if not got:
                    break
                done += 1
            for j in range(done):
                self._push_next_need(want_seq[j], want_target[j])
            if done == m:
                continue
            preempted[0] = True
            target, i = want_target[done], want_seq[done]
            tokens = self.tokens[i] + target - self.start_step[i]
            while True:
                n_victims = self._select_victims(i)
                if not n_victims:
                    self._preempt(i)  # nothing else to take from: it waits and re-prefills
                    break
                for j in range(n_victims):
                    self._preempt(self.cand[j])
                got = self._reserve(i, tokens)
                if got == BAIL:
                    return BAIL
                if got:
                    self._push_next_need(i, target)
                    break
            for j in range(done + 1, m):
                _triples_push(&self.needs, want_target[j], want_seq[j], self.epoch[want_seq[j]])
        return 0

    cdef inline bint _candidate_before(self, int64_t i, int64_t j) noexcept:
        # the policy's candidate_key(i) < candidate_key(j); the simulator never touches a
        # running sequence (`touch_sequence`), so every candidate's access count is 0 and the
        # keys of sieve, arc, slru ("seen once first") and s3fifo order as lru's
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

    cdef Py_ssize_t _select_victims(self, int64_t asking) except -1:
        # CacheManager.select_preemption_victims(1, exclude=[asking, *admitted]): the running
        # sequences in the policy's order (ties: admission order) until they free a block (all
        # of them when together they cannot), into `cand`
        cdef Py_ssize_t m = 0, j, k, count
        cdef int64_t i = self.run_head, freed = 0
        cdef bint skip
        while i >= 0:
            skip = i == asking
            for j in range(self.n_admitted):
                skip = skip or self.admitted[j] == i
            if not skip:  # a stable insertion sort by key
                k = m
                while k > 0 and self._candidate_before(i, self.cand[k - 1]):
                    self.cand[k] = self.cand[k - 1]
                    k -= 1
                self.cand[k] = i
                m += 1
            i = self.run_next[i]
        for count in range(m):
            freed += self.table_len[self.cand[count]]
            if freed >= 1:
                return count + 1
        return m

    cdef int _preempt(self, int64_t i) except -1:
        # Simulator._preempt: back to the head of the queue, its blocks cached, to re-prefill
        self.running_flag[i] = 0
        self.n_running -= 1
        self._stop_decoding(i)
        self._release(i)
        self.preemptions += 1
        self.decoded[i] += self.step - self.start_step[i]
        self.tokens[i] = self._prompt_tokens(i) + self.decoded[i]
        self.epoch[i] += 1
        self.front[self.n_front] = i
        self.n_front += 1
        return 0

    cdef inline void _stop_decoding(self, int64_t i) noexcept:
        if self.output_len[i] - self.decoded[i] > 1:
            self.decoding -= 1
            self.context_sum -= self.context_base[i]

    cdef int _start_decoding(self, int64_t i, int64_t step) except -1:
        # its first token at this step (TTFT at the first only); its finish and first block
        # need scheduled
        cdef int64_t remaining = self.output_len[i] - self.decoded[i], last, first, spill
        if isnan(self.first_token[i]):
            self.first_token[i] = self.clock
            self.ttfts[self.n_ttfts] = self.clock - self.arrivals[i]
            self.n_ttfts += 1
        self.start_step[i] = step
        self.context_base[i] = self.tokens[i] - step
        last = step + max(remaining, 1) - 1
        _triples_push(&self.finishes, last, i, self.epoch[i])
        if remaining > 1:
            self.decoding += 1
            self.context_sum += self.context_base[i]
            # after decode step j it holds tokens + j tokens; the first j that spills
            spill = _py_mod(1 - self.tokens[i], self.block_size)
            first = step + (spill if spill else self.block_size)
            if first <= last:
                _triples_push(&self.needs, first, i, self.epoch[i])
        return 0

    cdef bint _current_head(self, Triples* heap) noexcept:
        # pop the stale heads (a sequence no longer running, or of an older epoch); any left?
        while heap.size:
            if self.running_flag[heap.b[0]] and self.epoch[heap.b[0]] == heap.c[0]:
                return True
            _triples_pop(heap)
        return False

    cdef int64_t _steps_to_next(self, int64_t step) noexcept:
        # decode_steps.steps_to_next: through the next finish or up to the next need
        cdef int64_t k = 1 << 62
        if self._current_head(&self.finishes):
            k = min(k, self.finishes.a[0] - step + 1)
        if self._current_head(&self.needs):
            k = min(k, self.needs.a[0] - step)
        return max(k, 1) if k != (1 << 62) else 1

    cdef int64_t _run_steps(self) except -1:
        # one step when something was admitted, else decode-only steps up to the next event;
        # returns the last step run
        cdef int64_t step = self.step, k
        cdef double duration
        cdef Py_ssize_t j
        if self.n_admitted:
            k = 1
            duration = _step_time(&self.cost, self.prefill_tokens, self.prefill_batch, self.cached_tokens,
                                  self.decoding, self.context_sum + self.decoding * step)
        else:
            k = self._steps_to_next(step)
            if not self._waiting() and self.next_arrival < self.n:
                k = _steps_until(&self.cost, self.arrivals[self.next_arrival], self.clock, self.decoding,
                                 self.context_sum, step, k)
            duration = _decode_time(&self.cost, self.decoding, self.context_sum, step, k)
        if 0.0 > duration:  # max(duration, prefetch_s) with no prefetch
            duration = 0.0
        self.clock += duration
        for j in range(self.n_admitted):
            self._start_decoding(self.admitted[j], step)
        self.step = step + k
        return step + k - 1

    cdef int _finish(self, int64_t end_step) except -1:
        # the completions at the end of the steps just run: their blocks released, their times
        cdef int64_t i, epoch, out
        while self.finishes.size and self.finishes.a[0] <= end_step:
            i, epoch = self.finishes.b[0], self.finishes.c[0]
            _triples_pop(&self.finishes)
            if not self.running_flag[i] or self.epoch[i] != epoch:
                continue
            self.running_flag[i] = 0
            self.n_running -= 1
            self._stop_decoding(i)
            self._release(i)
            out = self.output_len[i]
            if out > 1 and not isnan(self.first_token[i]):
                self.tpots[self.n_tpots] = (self.clock - self.first_token[i]) / <double>(out - 1)
                self.n_tpots += 1
            self.total_tokens += self.input_len[i] + out
            self.finished += 1
            if self.progress is not None and self.finished % self.progress_every == 0:
                self.progress(self.finished)
        return 0

    cdef int _loop(self) except -2:
        # Simulator.advance(st, math.inf) for the radix model
        cdef bint preempted
        while self.clock < INFINITY:
            while self.next_arrival < self.n and self.arrivals[self.next_arrival] <= self.clock:
                self.next_arrival += 1
            if self.n_running == 0 and not self._waiting():
                if self.next_arrival >= self.n:
                    break
                self.clock = self.arrivals[self.next_arrival]
                continue
            if self._admit() == BAIL:
                return BAIL
            preempted = False
            if self._grow_decoding(&preempted) == BAIL:
                return BAIL
            if not self.n_admitted and not self.decoding:
                if preempted or (self.n_running == 0 and not self._waiting()):
                    continue
                raise RuntimeError("the simulation is stuck: nothing runs and the queue head cannot be admitted")
            self._finish(self._run_steps())
        return 0

    def run(self, double clock):
        """Run the row from `clock` (the first arrival); True when it ran, False when the Python
        loop must run it instead (it raises there)."""
        self.clock = clock
        return self._loop() != BAIL

    def outputs(self):
        """The TTFTs and TPOTs (in order), and the groups' served and looked-up tokens in the
        order of their first admission."""
        order = numpy.asarray(self.group_order)[: self.n_groups_seen]
        return (numpy.asarray(self.ttfts)[: self.n_ttfts], numpy.asarray(self.tpots)[: self.n_tpots],
                order, numpy.asarray(self.group_served)[order], numpy.asarray(self.group_looked)[order])


include "_radix_probe.pxi"
include "_radix_probe_score.pxi"
