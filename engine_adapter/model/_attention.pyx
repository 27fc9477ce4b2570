# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: extra_compile_args = -O3 -ffp-contract=off
"""Batch-invariant paged attention: every query row's output depends on its own query and its own
keys and values alone, never on the other rows of the batch, the padded length of the batch or
how its prompt was chunked (mirrors `engine_adapter.model.invariant_attention.rowwise_attention`, the
pure-torch fallback; docs/concepts/exactness.md).

A row at position ``p`` attends to its sequence's keys ``0..p`` (skipping those its key mask
marks as padding), read straight from the pool by slot. The arithmetic of one row is fixed: each
score is one dot product over the head in eight interleaved lanes summed as a fixed tree, the
softmax's maximum is exact, and the exponentials, their sum and the weighted values accumulate in
key order, in float32, whatever K/V dtype the pool holds (bf16 and fp16 widen exactly). Nothing
in that order depends on the batch, and `-ffp-contract=off` keeps the compiler from fusing a
multiply and an add in one inlined copy and not in another.
"""

from libc.math cimport expf, INFINITY
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

# K/V element types, as `invariant_attention.KV_DTYPE_CODES` names them
cdef enum:
    F32 = 0
    BF16 = 1
    F16 = 2


cdef inline float _bf16(uint16_t bits) noexcept nogil:
    cdef uint32_t widened = (<uint32_t>bits) << 16
    cdef float value
    memcpy(&value, &widened, 4)
    return value


cdef inline float _f16(uint16_t bits) noexcept nogil:
    """IEEE half to float, exactly (subnormals, infinities and NaNs included)."""
    cdef uint32_t sign = (<uint32_t>(bits & 0x8000)) << 16
    cdef uint32_t exponent = (bits >> 10) & 0x1F
    cdef uint32_t mantissa = bits & 0x3FF
    cdef uint32_t out
    cdef float value
    if exponent == 0x1F:
        out = sign | 0x7F800000 | (mantissa << 13)
    elif exponent != 0:
        out = sign | ((exponent + 112) << 23) | (mantissa << 13)
    elif mantissa == 0:
        out = sign
    else:  # subnormal half: normalise it
        exponent = 113
        while (mantissa & 0x400) == 0:
            mantissa <<= 1
            exponent -= 1
        out = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13)
    memcpy(&value, &out, 4)
    return value


cdef inline const float* _row(const char* base, int dtype, int64_t offset, int dim, float* buffer) noexcept nogil:
    """Element `offset` on of a K or V tensor as `dim` floats: the pool itself when it is float32,
    else `buffer` filled by exact widening."""
    cdef int d
    cdef const uint16_t* half
    if dtype == F32:
        return (<const float*>base) + offset
    half = (<const uint16_t*>base) + offset
    if dtype == BF16:
        for d in range(dim):
            buffer[d] = _bf16(half[d])
    else:
        for d in range(dim):
            buffer[d] = _f16(half[d])
    return buffer


cdef inline float _dot(const float* a, const float* b, int dim) noexcept nogil:
    """Sum of ``a[d] * b[d]`` in eight lanes (lane ``d % 8``, in ``d`` order), then a fixed tree."""
    cdef float lanes[8]
    cdef int d, lane
    for lane in range(8):
        lanes[lane] = 0.0
    d = 0
    while d + 8 <= dim:
        for lane in range(8):
            lanes[lane] = lanes[lane] + a[d + lane] * b[d + lane]
        d += 8
    lane = 0
    while d < dim:
        lanes[lane] = lanes[lane] + a[d] * b[d]
        d += 1
        lane += 1
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))


cdef void _attend_row(
    const float* q,
    const char* k_base,
    const char* v_base,
    int dtype,
    const int64_t* slots,
    const uint8_t* keep,
    int64_t last,
    int64_t slot_stride,
    int64_t head_offset,
    int dim,
    float scale,
    float* scores,
    float* k_buffer,
    float* v_buffer,
    float* out,
) noexcept nogil:
    """One query row of one head over keys ``0..last``: softmax(q . k * scale) . v into `out`."""
    cdef int64_t j
    cdef int d
    cdef float maximum = -INFINITY
    cdef float total = 0.0
    cdef float weight, score
    cdef const float* row
    for j in range(last + 1):
        if keep != NULL and keep[j] == 0:
            scores[j] = -INFINITY
            continue
        row = _row(k_base, dtype, slots[j] * slot_stride + head_offset, dim, k_buffer)
        score = _dot(q, row, dim) * scale
        scores[j] = score
        if score > maximum:
            maximum = score
    for d in range(dim):
        out[d] = 0.0
    if maximum == -INFINITY:  # every key masked: nothing to attend to
        return
    for j in range(last + 1):
        if scores[j] == -INFINITY:
            continue
        weight = expf(scores[j] - maximum)
        total = total + weight
        row = _row(v_base, dtype, slots[j] * slot_stride + head_offset, dim, v_buffer)
        for d in range(dim):
            out[d] = out[d] + weight * row[d]
    for d in range(dim):
        out[d] = out[d] / total


def paged_attention(
    const float[:, :, ::1] q,
    uintptr_t k_pool,
    uintptr_t v_pool,
    int dtype,
    int num_kv_heads,
    const int64_t[:, ::1] key_slots,
    const int64_t[::1] starts,
    const int64_t[::1] lengths,
    keep,
    float scale,
    float[:, :, ::1] out,
):
    """Attention of every new token of a batch over its own sequence's keys in the pool.

    Args:
        q: ``[T, heads, D]`` float32, the batch's new tokens' queries (rotated), sequence by
            sequence in batch order.
        k_pool: Address of the layer's K, ``[slots, num_kv_heads, D]`` contiguous, in `dtype`.
        v_pool: Same for V.
        dtype: 0 float32, 1 bfloat16, 2 float16.
        num_kv_heads: KV heads (query head h reads KV head ``h // (heads // num_kv_heads)``).
        key_slots: ``[B, L]``: pool slot of each position of each sequence (L at least its last
            new token's position + 1).
        starts: ``[B]``: each sequence's first new position (its cached tokens).
        lengths: ``[B]``: each sequence's new tokens.
        keep: None, or ``[B, heads, L]`` uint8 (0: key is padding, skipped).
        scale: The score scale (``1 / sqrt(D)``).
        out: ``[T, heads, D]`` float32, written.
    """
    cdef int64_t num_rows = q.shape[0]
    cdef int heads = q.shape[1]
    cdef int dim = q.shape[2]
    cdef int group = heads // num_kv_heads
    cdef int64_t batch = starts.shape[0]
    cdef int64_t width = key_slots.shape[1]
    cdef int64_t slot_stride = num_kv_heads * dim
    cdef const uint8_t[:, :, ::1] keep_view
    cdef const uint8_t* keep_row = NULL
    cdef bint masked = keep is not None
    cdef int64_t b, i, row, last
    cdef int h
    cdef float* scores
    cdef float* k_buffer
    cdef float* v_buffer
    if masked:
        keep_view = keep
    if num_kv_heads <= 0 or heads % num_kv_heads != 0:
        raise ValueError(f"{heads} query heads do not group over {num_kv_heads} KV heads")
    if out.shape[0] != num_rows or out.shape[1] != heads or out.shape[2] != dim:
        raise ValueError("out must have q's shape")
    row = 0
    for b in range(batch):
        if starts[b] < 0 or lengths[b] < 0 or starts[b] + lengths[b] > width:
            raise ValueError(f"sequence {b}: positions {starts[b]}..{starts[b] + lengths[b]} exceed {width} key slots")
        row += lengths[b]
    if row != num_rows:
        raise ValueError(f"lengths add up to {row} rows, q has {num_rows}")
    scores = <float*>malloc((width + 2 * dim) * sizeof(float))
    if scores == NULL:
        raise MemoryError()
    k_buffer = scores + width
    v_buffer = k_buffer + dim
    with nogil:
        row = 0
        for b in range(batch):
            for i in range(lengths[b]):
                last = starts[b] + i
                for h in range(heads):
                    if masked:
                        keep_row = &keep_view[b, h, 0]
                    _attend_row(
                        &q[row, h, 0], <const char*>k_pool, <const char*>v_pool, dtype,
                        &key_slots[b, 0], keep_row, last, slot_stride, (h // group) * dim, dim, scale,
                        scores, k_buffer, v_buffer, &out[row, h, 0],
                    )
                row += 1
    free(scores)
