# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""The simulator's radix row in one compiled call: `Simulator.run()` of the radix cache model.

`engine_adapter.sim.radix_run` prepares the requests as arrays and runs a `RadixLoop`; the Python
event loop (`Simulator.advance`, engine_adapter/sim/simulator.py) over the real `CacheManager`
is the reference, ported step for step for what a plain radix row does:

- the event loop: arrivals (each protected while it waits, with `protect_queued`), FCFS admission within `max_running` and `max_prefill_tokens` (the
  first admission always fits) while the cache can give the head its blocks, the decode steps'
  block needs (`decode_steps.grow_decoding`) with preemption by recompute (the policy's
  `select_victims` order; the preempted sequence back at the head of the queue), step times
  from the `CostModel` (_sim_loop.pxd), finishes, TTFTs and TPOTs;
- the cache (`CacheCore`, _radix_cache.pxi: `CacheManager.allocate`, `commit_blocks`,
  `reserve_tokens`, `free_sequence`, `preempt`, `select_preemption_victims`): the radix tree and
  its policy's order in C (_radix_tree.pxi over the policies' C home, sage_eviction/_kind_*.pxi), eviction of
  exactly the deficit, the counters of `EvictionStep`, the re-prefill tracker's evicted keys;
- the accounting (`Accounting`, _radix_accounting.pxi: `CacheAccounting.on_lookup` and
  `on_evict`): the age and reuse-distance histograms, the ghost set through its C API
  (engine_adapter/cache/_ghosts.pxd), the regret window.

Where the Python code raises (a request larger than the pool), `run` returns False and the
Python loop runs the row instead (and raises as it does). Floats are computed with the same operations
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
from engine_adapter.sim._sim_loop cimport Cost, Tally, _decode_time, _step_time, _steps_until, count_lookup
from sage_eviction._core cimport keyset_add_int, keyset_discard_int, sage_ticks, tick_seconds

import numpy

include "_core_memory.pxi"
include "_core_i64map.pxi"
include "_core_flat_lists.pxi"
include "_kinds.pxi"  # the policies' C home (sage_eviction/_kind_*.pxi), shared with the flat cache
include "_radix_tree.pxi"
include "_radix_triples.pxi"



cdef inline int64_t _py_mod(int64_t a, int64_t b) noexcept:
    # Python's a % b (b > 0): never negative
    cdef int64_t r = a % b
    return r + b if r < 0 else r


include "_radix_accounting.pxi"
include "_radix_cache.pxi"


cdef class RadixLoop:
    """One radix row: the requests' arrays, the simulator's sequences and queues, and the cache.

    Built by `engine_adapter.sim.radix_run` from a run's columns and settings; `run(clock)`
    runs it; the figures are its attributes, its cache's and its accounting's."""

    # ---- the requests (read only)
    cdef const int32_t[::1] keys32
    cdef const int64_t[::1] keys64
    cdef bint wide
    cdef int64_t* scratch  # one request's keys widened to int64
    cdef Py_ssize_t scratch_size
    cdef const int64_t[::1] ends, input_len, output_len, groups
    cdef const double[::1] arrivals
    cdef int32_t[::1] tenant  # per request: its tenant as the ghost set's id
    # ---- the outputs
    cdef double[::1] ttfts, tpots
    cdef int64_t[::1] group_served, group_looked, group_order
    cdef unsigned char[::1] group_seen
    # ---- settings
    cdef Cost cost
    cdef int64_t block_size, max_running, max_prefill, progress_every
    cdef object progress
    # the adaptive batch (`AdaptiveBatch`, engine_adapter/cache/adaptive_batch.py; None: off):
    # its running limit is the admission's; its decisions are its own Python method, called
    # when one is due (`next_decision`), with the steps run since the last call
    cdef object adaptive
    cdef int64_t limit, adaptive_steps, pending_steps, next_decision
    # ---- the cache
    cdef readonly CacheCore cache
    # ---- the simulator's sequences (`SimSequence`) and queues
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
    cdef int64_t* victims  # one preemption's (`CacheCore.select_victims`)
    cdef int64_t* wants  # one step's due needs: targets, then sequences
    cdef Triples finishes, needs
    # ---- the run
    cdef readonly double clock
    cdef readonly int64_t step, decoding, context_sum, n_running
    cdef readonly Py_ssize_t n, next_arrival, head, finished, n_ttfts, n_tpots
    cdef Tally tally  # the first admissions' counts
    cdef readonly int64_t total_tokens
    cdef int64_t prefill_tokens, prefill_batch, cached_tokens

    def __cinit__(self):
        self.scratch = self.decoded = self.epoch = self.start_step = self.context_base = self.tokens = NULL
        self.front = self.admitted = self.victims = self.wants = NULL
        self.first_token = NULL
        self.running_flag = NULL
        _triples_clear(&self.finishes)
        _triples_clear(&self.needs)

    def __dealloc__(self):
        free(self.scratch)
        free(self.decoded)
        free(self.epoch)
        free(self.start_step)
        free(self.context_base)
        free(self.tokens)
        free(self.first_token)
        free(self.running_flag)
        free(self.front)
        free(self.admitted)
        free(self.victims)
        free(self.wants)
        _triples_free(&self.finishes)
        _triples_free(&self.needs)

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
        self.group_served = numpy.zeros(columns.n_groups + 1, dtype=numpy.int64)
        self.group_looked = numpy.zeros(columns.n_groups + 1, dtype=numpy.int64)
        self.group_order = numpy.empty(columns.n_groups + 1, dtype=numpy.int64)
        self.group_seen = bytearray(columns.n_groups + 1)
        self.tally.group_served, self.tally.group_looked = &self.group_served[0], &self.group_looked[0]
        self.tally.group_order, self.tally.group_seen = &self.group_order[0], &self.group_seen[0]
        (self.cost.prefill_base, self.cost.prefill_per_token, self.cost.prefill_attn, self.cost.decode_base,
         self.cost.decode_per_seq, self.cost.decode_per_ctx) = settings.cost
        self.block_size, self.max_running = settings.block_size, settings.max_running
        self.adaptive = settings.adaptive
        self.limit = self.max_running if self.adaptive is None else self.adaptive.current
        if self.adaptive is not None:
            self.adaptive_steps, self.next_decision = self.adaptive.steps, self.adaptive.next_decision
        self.max_prefill = settings.max_prefill_tokens
        self.progress, self.progress_every = settings.progress, settings.progress_every
        acct = Accounting(settings, tenant_objects)
        self.cache = CacheCore(settings, acct, n)
        ids = acct.tenant_ids(tenant_objects)
        self.tenant = numpy.empty(n, dtype=numpy.int32)
        for i in range(n):
            self.tenant[i] = 0 if codes[i] < 0 else ids[codes[i]]  # None is the ghost set's 0
        self._allocate(n)

    cdef int _allocate(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t i
        self.decoded = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.epoch = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.start_step = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.context_base = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.tokens = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.first_token = <double*>_alloc((n + 1) * sizeof(double))
        self.running_flag = <uint8_t*>_alloc((n + 1) * sizeof(uint8_t))
        self.front = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.admitted = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.victims = <int64_t*>_alloc((n + 1) * sizeof(int64_t))
        self.wants = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
        for i in range(n):
            self.decoded[i] = self.epoch[i] = self.start_step[i] = self.context_base[i] = 0
            self.tokens[i] = self._prompt_tokens(i)
            self.first_token[i] = NAN
            self.running_flag[i] = 0
        return 0

    # ---- a request's keys --------------------------------------------------------------------

    cdef inline Py_ssize_t _start(self, Py_ssize_t i) noexcept:
        return self.ends[i - 1] if i > 0 else 0

    cdef inline int64_t _n_keys(self, Py_ssize_t i) noexcept:
        return self.ends[i] - self._start(i)

    cdef inline int64_t _prompt_tokens(self, Py_ssize_t i) noexcept:
        # SimSequence.prompt_tokens: a partial last block of the keys counts whole
        return max(self.input_len[i], self._n_keys(i) * self.block_size)

    cdef const int64_t* _keys(self, Py_ssize_t i) except NULL:
        # request i's keys as int64s (the int32 column widened into the scratch buffer)
        cdef Py_ssize_t start = self._start(i), n = self.ends[i] - start, j
        if n + 1 > self.scratch_size:
            free(self.scratch)
            self.scratch = NULL
            self.scratch_size = 0
            self.scratch = <int64_t*>_alloc(2 * (n + 1) * sizeof(int64_t))
            self.scratch_size = 2 * (n + 1)
        if self.wide:
            return &self.keys64[start] if n else self.scratch
        for j in range(n):
            self.scratch[j] = self.keys32[start + j]
        return self.scratch

    # ---- the cache model's calls (RadixModel's allocate, reserve, free, preempt) -----------------

    cdef inline int64_t _allocate_seq(self, Py_ssize_t i) except -2:
        return self.cache.allocate(i, self._keys(i), self._n_keys(i), self.tokens[i], self._prompt_tokens(i),
                                   self.ends[i], self.tenant[i], self.clock)

    cdef inline int64_t _protect(self, Py_ssize_t i) except -1:
        # RadixModel.protect: the waiting request's cached prefix, with its tokens now
        return self.cache.protect(i, self._keys(i), self._n_keys(i), self.tokens[i])

    cdef inline int _release(self, Py_ssize_t i, bint preempted) except -1:
        return self.cache.release(i, self._keys(i), self._n_keys(i), self._prompt_tokens(i), self.tenant[i],
                                  self.clock, preempted)

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

    cdef int _admit(self) except -2:
        # first come first served within the running and prefill limits, while the cache gives
        # the head of the queue its blocks
        cdef int64_t hits, served
        cdef Py_ssize_t i
        self.prefill_tokens = self.prefill_batch = self.cached_tokens = 0
        self.n_admitted = 0
        while self._waiting() and self.n_running < self.limit and self.prefill_tokens < self.max_prefill:
            i = self._queue_head()
            hits = self._allocate_seq(i)
            if hits == BAIL:
                return BAIL
            if hits < 0:
                break
            served = min(hits * self.block_size, self.input_len[i])
            self._dequeue()
            if self.epoch[i] == 0:
                count_lookup(&self.tally, self.groups[i], self._n_keys(i), hits, self.input_len[i], served)
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
        cdef int64_t* want_target = self.wants
        cdef int64_t* want_seq = self.wants + self.n + 1
        cdef Py_ssize_t m, done, j, n_victims
        cdef int64_t i, target, tokens
        cdef int got
        while self.needs.size and self.needs.a[0] <= self.step:
            m = self._due_needs(want_target, want_seq)
            done = 0
            while done < m:  # reserve_many: in order, up to the first that falls short
                i = want_seq[done]
                got = self.cache.reserve(i, self.tokens[i] + want_target[done] - self.start_step[i], self.clock)
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
                n_victims = self.cache.select_victims(i, self.admitted, self.n_admitted, self.victims)
                if not n_victims:
                    self._preempt(i)  # nothing else to take from: it waits and re-prefills
                    break
                for j in range(n_victims):
                    self._preempt(self.victims[j])
                got = self.cache.reserve(i, tokens, self.clock)
                if got == BAIL:
                    return BAIL
                if got:
                    self._push_next_need(i, target)
                    break
            for j in range(done + 1, m):
                _triples_push(&self.needs, want_target[j], want_seq[j], self.epoch[want_seq[j]])
        return 0

    cdef int _preempt(self, int64_t i) except -1:
        # Simulator._preempt: back to the head of the queue, its blocks cached, to re-prefill
        self.running_flag[i] = 0
        self.n_running -= 1
        self._stop_decoding(i)
        self._release(i, True)
        self.decoded[i] += self.step - self.start_step[i]
        self.tokens[i] = self._prompt_tokens(i) + self.decoded[i]
        self.epoch[i] += 1
        self.front[self.n_front] = i
        self.n_front += 1
        if self.cache.max_protected > 0:  # queued again: its cached prefix protected again
            self._protect(i)
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
            self._release(i, False)
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
        cdef int64_t before
        while self.clock < INFINITY:
            while self.next_arrival < self.n and self.arrivals[self.next_arrival] <= self.clock:
                if self.cache.max_protected > 0:  # Simulator._arrive: its cached prefix protected
                    self._protect(self.next_arrival)
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
            before = self.step
            self._finish(self._run_steps())
            if self.adaptive is not None:
                self._observe(self.step - before)
        return 0

    cdef int _observe(self, int64_t steps) except -1:
        # AdaptiveBatch.observe(the cache's evictions and re-prefills, steps) after each turn of
        # the loop, as Simulator.advance calls it; between its decisions a call only adds the
        # steps up, so the loop adds them here and calls it when a decision is due
        self.adaptive_steps += steps
        self.pending_steps += steps
        if self.adaptive_steps >= self.next_decision:
            self._tell_adaptive()
        return 0

    cdef int _tell_adaptive(self) except -1:
        self.adaptive.observe(self.cache.total_evictions, self.cache.re_prefilled, self.pending_steps)
        self.pending_steps = 0
        self.limit, self.next_decision = self.adaptive.current, self.adaptive.next_decision
        return 0

    def run(self, double clock):
        """Run the row from `clock` (the first arrival); True when it ran, False when the Python
        loop must run it instead (it raises there)."""
        self.clock = clock
        if self._loop() == BAIL:
            return False
        if self.adaptive is not None and self.pending_steps:
            self._tell_adaptive()  # the steps since its last call (no decision is due)
        return True

    def outputs(self):
        """The TTFTs and TPOTs (in order), the groups' served and looked-up tokens in the order of
        their first admission, and the block lookups, block hits, tokens looked up and served."""
        cdef Tally* t = &self.tally
        order = numpy.asarray(self.group_order)[: t.n_groups_seen]
        return (numpy.asarray(self.ttfts)[: self.n_ttfts], numpy.asarray(self.tpots)[: self.n_tpots],
                order, numpy.asarray(self.group_served)[order], numpy.asarray(self.group_looked)[order],
                (t.block_lookups, t.block_hits, t.tokens_looked_up, t.tokens_hit))


include "_radix_probe.pxi"
