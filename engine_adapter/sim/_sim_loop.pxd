# What the simulator's compiled event loops (_flat_run.pyx and _radix_run.pyx) share: a first
# admission's counts (`Tally`, `count_lookup`: `Simulator._count_lookup`), and the cost model in C,
# `CostModel`'s step times (engine_adapter/sim/cost_model.py) and the decode-only stretches of
# engine_adapter/sim/decode_steps.py, with the SAME float operations in the SAME order
# as the Python code (int operands converted to double where Python converts them). The modules
# that cimport this are built with `-ffp-contract=off`, so that no multiply and add are fused and
# the times are bit-identical to the Python loop's.

from libc.stdint cimport int64_t


cdef struct Cost:
    # `CostModel`'s coefficients (engine_adapter/sim/cost_model.py), as floats
    double prefill_base
    double prefill_per_token
    double prefill_attn
    double decode_base
    double decode_per_seq
    double decode_per_ctx


cdef inline double _prefill_time(const Cost* c, int64_t tokens, int64_t batch, int64_t cached) noexcept:
    # CostModel.prefill_time: tokens * (cached + tokens / 2) / max(batch, 1)
    cdef double pairs
    if tokens <= 0:
        return 0.0
    pairs = <double>tokens * (<double>cached + <double>tokens / 2.0) / <double>(batch if batch > 1 else 1)
    return c.prefill_base + c.prefill_per_token * <double>tokens + c.prefill_attn * pairs


cdef inline double _decode_step_time(const Cost* c, int64_t batch, int64_t context) noexcept:
    # CostModel.decode_step_time
    if batch <= 0:
        return 0.0
    return c.decode_base + c.decode_per_seq * <double>batch + c.decode_per_ctx * <double>context


cdef inline double _step_time(const Cost* c, int64_t prefill_tokens, int64_t prefill_batch, int64_t cached,
                       int64_t decode_batch, int64_t context) noexcept:
    # CostModel.step_time: one base paid when the step mixes prefill and decode (Python's
    # min(a, b) is b only when b < a)
    cdef double prefill = _prefill_time(c, prefill_tokens, prefill_batch, cached)
    cdef double decode = _decode_step_time(c, decode_batch, context)
    cdef double base
    if prefill != 0.0 and decode != 0.0:
        base = c.decode_base if c.decode_base < c.prefill_base else c.prefill_base
        return prefill + decode - base
    return prefill + decode


cdef inline double _decode_time(const Cost* c, int64_t batch, int64_t context_sum, int64_t step, int64_t k) noexcept:
    # decode_steps.decode_time: k decode-only steps from `step`, the context growing by `batch`
    cdef int64_t contexts
    if batch <= 0:
        return 0.0
    contexts = k * (context_sum + batch * step) + batch * k * (k - 1) // 2
    return <double>k * (c.decode_base + c.decode_per_seq * <double>batch) + c.decode_per_ctx * <double>contexts


cdef inline int64_t _steps_until(const Cost* c, double arrival, double clock, int64_t batch, int64_t context_sum,
                          int64_t step, int64_t k_max) noexcept:
    # decode_steps.steps_until: the fewest steps (at most k_max) after which the clock reaches
    # `arrival`, by the same bisection
    cdef int64_t lo = 1, hi = k_max, mid
    if batch <= 0 or arrival <= clock:
        return 1
    if clock + _decode_time(c, batch, context_sum, step, k_max) < arrival:
        return k_max
    while lo < hi:
        mid = (lo + hi) // 2
        if clock + _decode_time(c, batch, context_sum, step, mid) >= arrival:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef struct Tally:
    # `Simulator._count_lookup`'s counters: the row's block lookups and hits, its prompt tokens
    # looked up and served, and per group (a tenant or a session, by code) the tokens served and
    # looked up, the groups in the order of their first admission (the reference's dict order);
    # the arrays are the loop's (one slot a group)
    int64_t block_lookups, block_hits, tokens_looked_up, tokens_hit
    int64_t* group_served
    int64_t* group_looked
    int64_t* group_order
    unsigned char* group_seen
    Py_ssize_t n_groups_seen


cdef inline void count_lookup(Tally* t, int64_t group, int64_t n_keys, int64_t hits, int64_t input_len,
                              int64_t served) noexcept:
    # a request's first admission (a re-admission after preemption is re-prefill, no lookup)
    t.block_lookups += n_keys
    t.block_hits += hits
    t.tokens_looked_up += input_len
    t.tokens_hit += served
    if not t.group_seen[group]:
        t.group_seen[group] = 1
        t.group_order[t.n_groups_seen] = group
        t.n_groups_seen += 1
    t.group_served[group] += served
    t.group_looked[group] += input_len
