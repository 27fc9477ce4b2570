# The accounting of the simulator's compiled radix loop: `Accounting`, `CacheAccounting`
# (engine_adapter/cache/accounting.py) for one row. Part of engine_adapter/sim/_radix_run.pyx.
#
# `lookup` is `CacheAccounting.on_lookup` (the hits' ages and reuse distances, each missed key
# against the ghost set, the regret window), `victim` and `evicted` are `on_evict` (the victims'
# ages summed per tenant as it groups them, each victim a ghost). The histograms are C arrays by
# (kind, tenant, bucket) with their float sums, added in the reference's order; the ghost set is
# the compiled `IntGhostSet` through its C API (engine_adapter/cache/_ghosts.pxd); a full regret
# window goes to `CacheAccounting.close_window` (its thrashing state and log).

# The histograms of `engine_adapter.cache.ages.HISTOGRAM_KINDS`, in the order radix_run.py gives
# their bounds
cdef enum:
    H_HIT = 0  # age_at_hit_seconds
    H_EVICT = 1  # age_at_eviction_seconds
    H_REUSE = 2  # reuse_distance_blocks
    H_REGRET = 3  # regret_age_seconds
    N_KINDS = 4
    MAX_BOUNDS = 32


cdef class Accounting:
    """One row's ages, reuse distances, ghosts and regrets (radix_run.py reads the figures)."""

    cdef readonly object hist_counts, hist_sums, hist_seen  # numpy: by (kind, tenant[, bucket])
    cdef int64_t[:, :, ::1] counts
    cdef double[:, ::1] sums
    cdef uint8_t[:, ::1] seen
    cdef double bounds[N_KINDS][MAX_BOUNDS]
    cdef Py_ssize_t n_bounds[N_KINDS]
    cdef readonly object ghosts  # the compiled ghost set
    cdef object close_window, new_eviction, policy_name
    cdef int64_t window, horizon
    cdef readonly list tenant_names  # by the ghost set's id: the histograms' tenant ("-": None)
    cdef double* call_sum  # per tenant, one eviction call's ages (NaN: none of it yet)
    cdef int32_t* call_tenants  # the tenants of one eviction call's victims, first seen first
    cdef int n_call_tenants
    cdef int64_t* times  # one lookup's reuse times
    cdef GhostFound* found  # one lookup's ghosts
    cdef Py_ssize_t lookup_cap
    cdef readonly int64_t missed, ghost_hits, regrets, window_missed, window_regrets

    def __cinit__(self):
        self.call_sum = self.times = NULL
        self.call_tenants = NULL
        self.found = NULL

    def __dealloc__(self):
        free(self.call_sum)
        free(self.call_tenants)
        free(self.times)
        free(self.found)

    def __init__(self, settings, tenant_objects):
        """`settings`: `radix_run.RadixSettings`; `tenant_objects`: the workload's tenants."""
        cdef Py_ssize_t k, j, n_tenants
        self.ghosts, self.close_window = settings.ghosts, settings.close_window
        self.new_eviction, self.policy_name = settings.new_eviction, settings.policy_name
        self.window, self.horizon = settings.window, settings.horizon
        if len(settings.bounds) != N_KINDS:
            raise ValueError("one bounds tuple per histogram kind")
        for k, bounds in enumerate(settings.bounds):
            if len(bounds) > MAX_BOUNDS - 1:
                raise ValueError("too many histogram bounds")
            self.n_bounds[k] = len(bounds)
            for j, bound in enumerate(bounds):
                self.bounds[k][j] = bound
        # the tenants by the ghost set's ids (None is 0): the histograms' index too
        ids = [ghosts_tenant_id(self.ghosts, t) for t in tenant_objects]
        self.tenant_names = ["-"] * (max(ids + [0]) + 1)
        for tenant, i in zip(tenant_objects, ids):
            self.tenant_names[i] = tenant
        n_tenants = len(self.tenant_names)
        self.hist_counts = numpy.zeros((N_KINDS, n_tenants, MAX_BOUNDS), dtype=numpy.int64)
        self.hist_sums = numpy.zeros((N_KINDS, n_tenants), dtype=numpy.float64)
        self.hist_seen = numpy.zeros((N_KINDS, n_tenants), dtype=numpy.uint8)
        self.counts, self.sums, self.seen = self.hist_counts, self.hist_sums, self.hist_seen
        self.call_sum = <double*>_alloc((n_tenants + 1) * sizeof(double))
        self.call_tenants = <int32_t*>_alloc((n_tenants + 1) * sizeof(int32_t))
        for k in range(n_tenants):
            self.call_sum[k] = NAN

    def tenant_ids(self, tenant_objects):
        """Each tenant's id (the ghost set's; None is 0)."""
        return [ghosts_tenant_id(self.ghosts, t) for t in tenant_objects]

    cdef int _room(self, Py_ssize_t n) except -1:
        # one lookup's buffers for n keys
        if n + 1 <= self.lookup_cap:
            return 0
        free(self.times)
        free(self.found)
        self.times = NULL
        self.found = NULL
        self.lookup_cap = 0
        self.times = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
        self.found = <GhostFound*>_alloc(2 * (n + 1) * sizeof(GhostFound))
        self.lookup_cap = 2 * (n + 1)
        return 0

    cdef inline void _observe(self, int kind, int32_t tenant, double value) noexcept:
        # one value in its bucket: bisect_left over the kind's bounds
        cdef Py_ssize_t j = 0, nb = self.n_bounds[kind]
        while j < nb and self.bounds[kind][j] < value:
            j += 1
        self.counts[kind, tenant, j] += 1

    cdef inline void _add_sum(self, int kind, int32_t tenant, double total) noexcept:
        # AgeHistograms.observe_many's `sums[key] += sum(values)` (the histogram exists now)
        self.sums[kind, tenant] += total
        self.seen[kind, tenant] = 1

    cdef int lookup(self, const int64_t* keys, int64_t n, const int32_t* path, int64_t n_hit, const double* created,
                    int32_t tenant, double now) except -1:
        # CacheAccounting.on_lookup: `path` the hit nodes, `created` the nodes' creation times
        cdef double total = 0.0, value
        cdef Py_ssize_t j, n_found = 0
        cdef GhostFound* ghost
        self._room(n)
        if n_hit:  # age_at_hit_seconds
            for j in range(n_hit):
                value = now - created[path[j]]
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

    cdef void victim(self, int32_t tenant, double age) noexcept:
        # one victim's age, summed per tenant as on_evict groups them
        self._observe(H_EVICT, tenant, age)
        if isnan(self.call_sum[tenant]):
            self.call_sum[tenant] = 0.0
            self.call_tenants[self.n_call_tenants] = tenant
            self.n_call_tenants += 1
        self.call_sum[tenant] += age

    cdef int evicted(self, const int64_t* keys, const int32_t* tenants, Py_ssize_t n, int64_t first_id, double now,
                     Py_ssize_t kept) except -1:
        # the rest of on_evict for one eviction call's victims (their ages told by `victim`):
        # each tenant's sum, and each victim a ghost sharing the call's fields
        cdef Py_ssize_t j
        cdef int32_t tenant
        for j in range(self.n_call_tenants):
            tenant = self.call_tenants[j]
            self._add_sum(H_EVICT, tenant, self.call_sum[tenant])
            self.call_sum[tenant] = NAN
        self.n_call_tenants = 0
        call = self.new_eviction(now, ghosts_stamp(self.ghosts), kept, self.policy_name)
        return ghosts_add_evicted(self.ghosts, keys, n, first_id, tenants, call)
