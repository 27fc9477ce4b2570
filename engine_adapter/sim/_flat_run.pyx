# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""The simulator's flat row in one compiled call: `Simulator.run()` of the flat cache model.

`engine_adapter.sim.flat_run` prepares the requests as arrays and calls `run_flat`; the Python
event loop (`Simulator.advance` and its steps in engine_adapter/sim/simulator.py) is the
reference, ported step for step for what the flat model does:

- arrivals queue in order; FCFS admission within `max_running` and `max_prefill_tokens` (the
  first admission always fits), each admitted request looked up block by block in the
  `FlatState` (`sage_eviction._core.flat_state_lookup`, int64 keys, no Python object a block);
- a step's time is the `CostModel`'s `step_time`, decode-only stretches `decode_time` over
  `steps_to_next` / `steps_until` (engine_adapter/sim/decode_steps.py);
- finishes in (last step, request) order, TTFT and TPOT as the reference computes them.

The flat model neither preempts nor reserves blocks, so no sequence is ever stale: the admitted
requests of a step are a contiguous run of the arrival order, and a heap of finishes is the
only queue. Floats are computed with the SAME operations in the SAME order as the Python code
(int operands converted to double where Python converts them), and `-ffp-contract=off` keeps the
compiler from fusing a multiply and an add, so TTFTs are bit-identical (tests/test_flat_run.py).
"""

from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc

from engine_adapter.sim._sim_loop cimport Cost, Tally, _decode_time, _step_time, _steps_until, count_lookup
from sage_eviction._core cimport flat_state_close, flat_state_lookup, flat_state_open


cdef class _FlatLoop:
    """One run's state: `RunState`'s fields that the flat model uses, over the request arrays."""

    cdef object state, progress
    cdef const int32_t[::1] keys32
    cdef const int64_t[::1] keys64
    cdef bint wide  # the keys are int64 (else int32, widened a request at a time into `scratch`)
    cdef int64_t* scratch
    cdef Py_ssize_t scratch_size
    cdef const int64_t[::1] ends, input_len, output_len, groups
    cdef const double[::1] arrivals
    cdef double[::1] ttfts, tpots, first_token
    cdef int64_t[::1] context_base, group_served, group_looked, group_order
    cdef unsigned char[::1] group_seen
    cdef Cost cost
    cdef int64_t block_size, max_running, max_prefill, progress_every
    cdef int64_t* heap_last  # the finishes: (last step, request), a binary heap
    cdef int64_t* heap_req
    cdef Py_ssize_t heap_size
    # the run: the clock, the step counter, the decoding sums, the queue (head .. next_arrival:
    # arrived, not admitted), the counters
    cdef double clock
    cdef int64_t step, decoding, context_sum, running
    cdef Py_ssize_t n, next_arrival, head, finished, n_ttfts, n_tpots
    cdef Tally tally  # the first admissions' counts
    cdef int64_t total_tokens
    cdef int64_t prefill_tokens, prefill_batch, cached_tokens  # the step's admissions

    def __cinit__(self):
        self.scratch = self.heap_last = self.heap_req = NULL

    def __dealloc__(self):
        free(self.scratch)
        free(self.heap_last)
        free(self.heap_req)

    # ---- the finishes heap (heapq's order of (last, request) tuples) -----------------------

    cdef inline bint _before(self, Py_ssize_t a, Py_ssize_t b) noexcept:
        return self.heap_last[a] < self.heap_last[b] or (
            self.heap_last[a] == self.heap_last[b] and self.heap_req[a] < self.heap_req[b])

    cdef inline void _swap(self, Py_ssize_t a, Py_ssize_t b) noexcept:
        self.heap_last[a], self.heap_last[b] = self.heap_last[b], self.heap_last[a]
        self.heap_req[a], self.heap_req[b] = self.heap_req[b], self.heap_req[a]

    cdef void _push(self, int64_t last, int64_t request) noexcept:
        cdef Py_ssize_t i = self.heap_size, parent
        self.heap_last[i] = last
        self.heap_req[i] = request
        self.heap_size += 1
        while i > 0:
            parent = (i - 1) // 2
            if not self._before(i, parent):
                break
            self._swap(i, parent)
            i = parent

    cdef int64_t _pop(self) noexcept:
        # the smallest entry's request
        cdef int64_t request = self.heap_req[0]
        cdef Py_ssize_t i = 0, child
        self.heap_size -= 1
        self.heap_last[0] = self.heap_last[self.heap_size]
        self.heap_req[0] = self.heap_req[self.heap_size]
        while True:
            child = 2 * i + 1
            if child >= self.heap_size:
                break
            if child + 1 < self.heap_size and self._before(child + 1, child):
                child += 1
            if not self._before(child, i):
                break
            self._swap(i, child)
            i = child
        return request

    # ---- the steps of a run (Simulator's methods of the same names) ------------------------

    cdef inline Py_ssize_t _start(self, Py_ssize_t i) noexcept:
        return self.ends[i - 1] if i > 0 else 0

    cdef int _lookup(self, Py_ssize_t i, int64_t* hits, int64_t* served) except -1:
        # FlatModel.lookup: the hit blocks, and the tokens served (a partial last block that
        # hit serves only the prompt's part of it)
        cdef Py_ssize_t start = self._start(i), n_keys = self.ends[i] - start, j, found = 0
        cdef const int64_t* keys
        cdef int last = 0
        if n_keys > 0:
            if self.wide:
                keys = &self.keys64[start]
            else:
                if n_keys > self.scratch_size:
                    free(self.scratch)
                    self.scratch = <int64_t*>malloc(n_keys * sizeof(int64_t))
                    if self.scratch == NULL:
                        self.scratch_size = 0
                        raise MemoryError()
                    self.scratch_size = n_keys
                for j in range(n_keys):
                    self.scratch[j] = self.keys32[start + j]
                keys = self.scratch
            last = flat_state_lookup(self.state, keys, n_keys, &found)
        hits[0] = found
        served[0] = found * self.block_size
        if last:
            served[0] -= max(n_keys * self.block_size - self.input_len[i], 0)
        served[0] = max(served[0], 0)
        return 0

    cdef int _admit(self) except -1:
        # Simulator._admit: first come first served within the running and prefill limits
        cdef int64_t hits, served
        cdef Py_ssize_t i
        self.prefill_tokens = self.prefill_batch = self.cached_tokens = 0
        while (self.head < self.next_arrival and self.running < self.max_running
               and self.prefill_tokens < self.max_prefill):
            i = self.head
            self._lookup(i, &hits, &served)
            self.head += 1
            count_lookup(&self.tally, self.groups[i], self.ends[i] - self._start(i), hits, self.input_len[i], served)
            self.prefill_tokens += self.input_len[i] - served
            self.cached_tokens += served
            self.prefill_batch += 1
            self.running += 1
        return 0

    cdef void _start_decoding(self, Py_ssize_t i, int64_t step) noexcept:
        # Simulator._start_decoding: its first token now; its finish scheduled
        cdef int64_t n_keys = self.ends[i] - self._start(i)
        cdef int64_t prompt = max(self.input_len[i], n_keys * self.block_size)
        cdef int64_t remaining = self.output_len[i]
        self.first_token[i] = self.clock
        self.ttfts[self.n_ttfts] = self.clock - self.arrivals[i]
        self.n_ttfts += 1
        self.context_base[i] = prompt - step
        self._push(step + max(remaining, 1) - 1, i)
        if remaining > 1:
            self.decoding += 1
            self.context_sum += self.context_base[i]

    cdef int64_t _steps_to_next(self, int64_t step) noexcept:
        # decode_steps.steps_to_next: through the next finish (the flat model has no block needs)
        if self.heap_size == 0:
            return 1
        return max(self.heap_last[0] - step + 1, 1)

    cdef int64_t _run_steps(self, Py_ssize_t first) noexcept:
        # Simulator._run_steps: one step when something was admitted (requests first .. head),
        # else decode-only steps up to the next event; returns the last step run
        cdef int64_t step = self.step, k
        cdef double duration
        cdef Py_ssize_t i
        if self.head > first:
            k = 1
            duration = _step_time(&self.cost, self.prefill_tokens, self.prefill_batch, self.cached_tokens,
                                  self.decoding, self.context_sum + self.decoding * step)
        else:
            k = self._steps_to_next(step)
            if self.head == self.next_arrival and self.next_arrival < self.n:  # nothing waits
                k = _steps_until(&self.cost, self.arrivals[self.next_arrival], self.clock, self.decoding,
                                 self.context_sum, step, k)
            duration = _decode_time(&self.cost, self.decoding, self.context_sum, step, k)
        if 0.0 > duration:  # max(duration, prefetch_s) with no prefetch
            duration = 0.0
        self.clock += duration
        for i in range(first, self.head):
            self._start_decoding(i, step)
        self.step = step + k
        return step + k - 1

    cdef int _finish(self, int64_t end_step) except -1:
        # Simulator._finish: the completions at the end of the steps just run
        cdef Py_ssize_t i
        cdef int64_t out
        while self.heap_size and self.heap_last[0] <= end_step:
            i = self._pop()
            out = self.output_len[i]
            self.running -= 1
            if out > 1:  # _stop_decoding, and its TPOT
                self.decoding -= 1
                self.context_sum -= self.context_base[i]
                self.tpots[self.n_tpots] = (self.clock - self.first_token[i]) / <double>(out - 1)
                self.n_tpots += 1
            self.total_tokens += self.input_len[i] + out
            self.finished += 1
            if self.progress is not None and self.finished % self.progress_every == 0:
                self.progress(self.finished)
        return 0

    cdef int run(self) except -1:
        # Simulator.advance(st, math.inf) for the flat model
        cdef Py_ssize_t first
        while self.clock < INFINITY:
            while self.next_arrival < self.n and self.arrivals[self.next_arrival] <= self.clock:
                self.next_arrival += 1
            if self.running == 0 and self.head == self.next_arrival:
                if self.next_arrival >= self.n:
                    break
                self.clock = self.arrivals[self.next_arrival]
                continue
            first = self.head
            self._admit()
            if self.head == first and self.decoding == 0:
                raise RuntimeError(
                    "the simulation is stuck: nothing runs and the queue head cannot be admitted")
            self._finish(self._run_steps(first))
        return 0


def run_flat(state, keys, const int64_t[::1] ends, const double[::1] arrivals,
             const int64_t[::1] input_len, const int64_t[::1] output_len, const int64_t[::1] groups,
             double[::1] ttfts, double[::1] tpots, int64_t[::1] group_served, int64_t[::1] group_looked,
             int64_t[::1] group_order, tuple cost, int64_t block_size, int64_t max_running,
             int64_t max_prefill_tokens, progress, int64_t progress_every, double clock):
    """Run the flat row: `state` a `FlatState` (empty), `keys` the lookup sequence (int32 or
    int64 array), `ends` each request's end in it; the outputs (`ttfts`, `tpots` of one slot a
    request, the groups' served and looked-up tokens and their order of first admission) are
    filled. Returns (clock, step, TTFTs, TPOTs, groups seen, block lookups, block hits, tokens
    looked up, tokens hit, total tokens, finished)."""
    cdef _FlatLoop loop = _FlatLoop()
    cdef Py_ssize_t n = arrivals.shape[0]
    loop.state, loop.progress = state, progress
    loop.wide = keys.dtype.itemsize == 8
    if loop.wide:
        loop.keys64 = keys
    else:
        loop.keys32 = keys
    loop.ends, loop.arrivals, loop.input_len, loop.output_len, loop.groups = (
        ends, arrivals, input_len, output_len, groups)
    loop.ttfts, loop.tpots, loop.group_served, loop.group_looked, loop.group_order = (
        ttfts, tpots, group_served, group_looked, group_order)
    loop.first_token = _doubles(n)
    loop.context_base = _ints(n)
    loop.group_seen = bytearray(group_served.shape[0] + 1)
    loop.tally.group_served, loop.tally.group_looked = &group_served[0], &group_looked[0]
    loop.tally.group_order, loop.tally.group_seen = &group_order[0], &loop.group_seen[0]
    (loop.cost.prefill_base, loop.cost.prefill_per_token, loop.cost.prefill_attn, loop.cost.decode_base,
     loop.cost.decode_per_seq, loop.cost.decode_per_ctx) = cost
    loop.block_size, loop.max_running, loop.max_prefill = block_size, max_running, max_prefill_tokens
    loop.progress_every, loop.clock, loop.n = progress_every, clock, n
    loop.heap_last = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    loop.heap_req = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    if loop.heap_last == NULL or loop.heap_req == NULL:
        raise MemoryError()
    flat_state_open(state)
    try:
        loop.run()
    finally:
        flat_state_close(state)
    cdef Tally* t = &loop.tally
    return (loop.clock, loop.step, loop.n_ttfts, loop.n_tpots, t.n_groups_seen, t.block_lookups, t.block_hits,
            t.tokens_looked_up, t.tokens_hit, loop.total_tokens, loop.finished)


cdef double[::1] _doubles(Py_ssize_t n):
    import numpy
    return numpy.empty(n, dtype=numpy.float64)


cdef int64_t[::1] _ints(Py_ssize_t n):
    import numpy
    return numpy.empty(n, dtype=numpy.int64)
