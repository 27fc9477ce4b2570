"""The static decode step: a pure decode batch padded to fixed shapes, replayed from a CUDA graph.

An eager decode step of a 1B model on a GPU is launch-bound: the GPU works about 2 ms of a
~50 ms step, the rest is Python and some 570 kernel launches. Like vLLM, `DecodeGraphs` captures
the whole step (embedding, every layer with its paged attention, final norm, lm head) once per
shape bucket with `torch.cuda.CUDAGraph` and replays it: one launch per step.

A graph fixes every shape and address, so a batch is padded to a bucket:

- batch size B: the next of 1, 2, 4, 8, ... (for ``max_batch`` sequences at most). Padded rows
  read token 0 at position 0, write their K/V into the pool's scratch block
  (`PagedKVPool.scratch_slots`: past the allocator's blocks, owned by no sequence), attend to
  one scratch key, and are dropped.
- context L: the next multiple of ``min_context`` up to 8 of them, then powers of two (the last
  one ``max_context``), at least every sequence's context plus its new token. Key slots past a
  sequence's end point at its own first slot (as `step_index._key_slots` does: masked keys are
  never stale NaN) and the mask hides them.

The host fills one int64 buffer per bucket (token ids, RoPE positions, cache positions, write
slots, key slots) with one copy; everything after it is shape-static and free of host syncs:
RoPE from the positions, the mask from the cache positions, then the eager layers: the same
dense math as `Decoder.forward`, the new K/V written with `PagedKVPool.write` (index_copy_), the
key slots gathered with `step_index._context_kv` (index_select) and SDPA with the mask. With one
query per sequence, the query heads that share a KV head are folded into the query length
(``[B, kv_heads, group, D]``), so SDPA needs no enable_gqa: a masked SDPA with enable_gqa may
leave the fused CUDA kernels for the math one, which repeats K/V per query head.

On CUDA each bucket is captured on first use: two warm-up runs on a side stream (torch's rule),
then the capture into one memory pool shared by all buckets; the step replays the graph and
clones the logits before anything else can run it again. Sharing the pool is safe because only a
step's logits outlive it and they are cloned at once. On the CPU the same static step runs
eagerly (no graph): that is how the tests check it against `Decoder.forward`'s own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from engine_adapter.model.decoder import (
    Attention,
    DecoderLayer,
    ForwardBatch,
    ForwardOutput,
    _after_attention,
    _before_attention,
    _compiled_math,
    _input_ids,
)
from engine_adapter.model.step_index import _context_kv, _key_slots, _StepIndex

if TYPE_CHECKING:
    from engine_adapter.model.decoder import Decoder
    from engine_adapter.model.kv_pool import PagedKVPool

__all__ = ["DecodeGraphs", "batch_bucket", "context_bucket", "enable_cuda_graphs"]

_WARMUPS = 2  # eager runs on a side stream before a capture


def enable_cuda_graphs(
    decoder: Decoder, pool: PagedKVPool, *, compiled_math: bool = False, **buckets: int
) -> DecodeGraphs:
    """Route `decoder`'s pure decode batches of `pool` through the static step (`Decoder.graphs`):
    a CUDA graph per (batch, context) bucket on CUDA, the same padded step run eagerly elsewhere.
    Other batches (prefill, observers, pooling, past the buckets) stay eager.

    Args:
        decoder: The model.
        pool: The pool whose decode steps are graphed (its tensors are captured).
        compiled_math: Run each layer's dense math through inductor's kernels (compiled in the
            warm-up before a capture) inside the step: fewer, fused kernels per layer.
        buckets: ``max_batch``, ``max_context``, ``min_context``, ``max_keys`` of `DecodeGraphs`.
    """
    graphs = DecodeGraphs(decoder, pool, compiled_math=compiled_math, **buckets)
    decoder.graphs = graphs
    return graphs


def batch_bucket(n: int, max_batch: int) -> int | None:
    """The padded batch size of `n` sequences: the next power of two; None past `max_batch`."""
    return 1 << max(n - 1, 0).bit_length() if n <= max_batch else None


def context_bucket(total: int, min_context: int, max_context: int) -> int | None:
    """The padded context of a batch whose longest sequence holds `total` tokens (the new one
    included): a multiple of `min_context` up to 8 of them (fine steps where a context is short
    and the gather's waste would show), then powers of two; capped at `max_context`, None past it."""
    if total > max_context:
        return None
    bucket = min_context
    while bucket < total:
        bucket = bucket + min_context if bucket < 8 * min_context else bucket * 2
    return min(bucket, max_context)


@dataclass(slots=True, eq=False)
class _Bucket:
    """The static buffers of one (batch, context) bucket, and on CUDA its graph and output.

    `index` is int64 ``[4B + B * L]``: ids, RoPE positions, cache positions (= the context
    before the new token), write slots, key slots; the others are views of it.
    """

    batch: int
    context: int
    index: torch.Tensor
    key_pos: torch.Tensor  # [L] 0 .. L-1
    rows: torch.Tensor  # [B] 0 .. B-1: each sequence's last (only) new token
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    logits: torch.Tensor | None = None  # the graph's output, [B, vocab] float32

    def part(self, i: int) -> torch.Tensor:
        """Part `i` of the first four ``[B]`` parts of `index`."""
        return self.index[i * self.batch : (i + 1) * self.batch]

    @property
    def kv_slots(self) -> torch.Tensor:
        return self.index[4 * self.batch :].view(self.batch, self.context)


class DecodeGraphs:
    """Runs pure decode batches of one pool through the static step, replayed from CUDA graphs
    on CUDA (eagerly elsewhere). Made by `enable_cuda_graphs`.

    Args:
        decoder: The model.
        pool: The KV pool the graphs write and read (its tensors' addresses are captured).
        max_batch: The most sequences of a graphed batch; larger batches run eagerly.
        max_context: The largest context bucket (tokens); longer contexts run eagerly.
        min_context: The smallest context bucket.
        max_keys: The largest B * L: the gathered K/V of a bucket grow with it.
    """

    def __init__(
        self,
        decoder: Decoder,
        pool: PagedKVPool,
        *,
        max_batch: int = 256,
        max_context: int = 4096,
        min_context: int = 256,
        max_keys: int = 1 << 18,
        compiled_math: bool = False,
    ) -> None:
        if min(max_batch, max_context, min_context, max_keys) < 1 or min_context > max_context:
            raise ValueError("cuda graph buckets need 1 <= min_context <= max_context, max_batch >= 1")
        self.decoder, self.pool = decoder, pool
        self.max_batch, self.max_context, self.min_context = max_batch, max_context, min_context
        self.max_keys = max_keys
        self.use_graphs = pool.device.type == "cuda"
        # inductor's default mode (no CUDA graphs of its own, which cannot nest in this capture):
        # its fused kernels are compiled in the warm-up runs and then captured like any other.
        self.math = _compiled_math(None) if compiled_math else (_before_attention, _after_attention)
        self._memory = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._buckets: dict[tuple[int, int], _Bucket] = {}

    @property
    def captured(self) -> list[tuple[int, int]]:
        """The (batch, context) buckets captured so far."""
        return sorted(k for k, b in self._buckets.items() if b.graph is not None)

    def _shape(self, batch: ForwardBatch) -> tuple[int, int] | None:
        b = batch_bucket(len(batch), self.max_batch)
        ctx = context_bucket(max(batch.start_positions) + 1, self.min_context, self.max_context)
        if b is None or ctx is None or b * ctx > self.max_keys:
            return None
        return b, ctx

    def fits(self, batch: ForwardBatch, pool: PagedKVPool) -> bool:
        """Whether `batch` (validated) is a pure decode batch of this pool within the buckets: one
        new token per sequence, no observer, no pooled hidden state, only the last logits."""
        if pool is not self.pool or batch.return_all_logits:
            return False
        if batch.observers is not None and any(o is not None for o in batch.observers):
            return False
        if batch.pool_hidden is not None and any(batch.pool_hidden):
            return False
        return all(len(t) == 1 for t in batch.token_ids) and self._shape(batch) is not None

    def run(self, batch: ForwardBatch) -> ForwardOutput:
        """The logits of a batch that `fits`, its K/V written into the pool."""
        shape = self._shape(batch)
        assert shape is not None, "DecodeGraphs.run needs a batch that fits"
        bucket = self._bucket(*shape)
        bucket.index.copy_(self._host_index(batch, bucket))
        if not self.use_graphs:
            logits = self._step(bucket)
        else:
            if bucket.graph is None:
                self._capture(bucket)
            bucket.graph.replay()
            assert bucket.logits is not None
            logits = bucket.logits
        # The next replay overwrites the graph's output: hand out a copy.
        return ForwardOutput(logits=logits[: len(batch)].clone())

    def capture(self, batch_sizes: list[int], context: int) -> None:
        """Capture the buckets of `batch_sizes` at `context` tokens now (warm-up) rather than on
        first use; their buffers hold padding only, so nothing but the scratch block is written."""
        with torch.inference_mode():
            for n in batch_sizes:
                b = batch_bucket(n, self.max_batch)
                ctx = context_bucket(context, self.min_context, self.max_context)
                if b is None or ctx is None:
                    raise ValueError(f"batch {n} at context {context} is past the largest bucket")
                bucket = self._bucket(b, ctx)
                bucket.index.copy_(self._padding_index(b, ctx))
                if self.use_graphs and bucket.graph is None:
                    self._capture(bucket)

    def _bucket(self, batch: int, context: int) -> _Bucket:
        bucket = self._buckets.get((batch, context))
        if bucket is None:
            device = self.pool.device
            bucket = _Bucket(
                batch=batch,
                context=context,
                index=torch.zeros(4 * batch + batch * context, dtype=torch.long, device=device),
                key_pos=torch.arange(context, device=device),
                rows=torch.arange(batch, device=device),
            )
            self._buckets[(batch, context)] = bucket
        return bucket

    def _padding_index(self, batch: int, context: int) -> torch.Tensor:
        """The host index of a bucket with no real row: token 0 at position 0, K/V written to
        the scratch block (a slot per row, cycling), the one key a scratch slot."""
        scratch = self.pool.scratch_slots
        index = torch.zeros(4 * batch + batch * context, dtype=torch.long)
        rows = torch.arange(batch)
        index[3 * batch : 4 * batch] = scratch.start + rows % len(scratch)
        index[4 * batch :] = scratch.start
        return index

    def _host_index(self, batch: ForwardBatch, bucket: _Bucket) -> torch.Tensor:
        """The bucket's index for `batch`: its rows first, padding after."""
        n, size, ctx = len(batch), bucket.batch, bucket.context
        index = self._padding_index(size, ctx)
        starts = torch.tensor(batch.start_positions, dtype=torch.long)
        starts_list = list(batch.start_positions)
        kv = _key_slots(batch.block_tables, starts_list, [1] * n, self.pool.block_size, width=ctx)
        offsets = torch.tensor(batch.position_offsets or [0] * n, dtype=torch.long)
        index[:n] = _input_ids(batch, self.decoder.config.vocab_size)
        index[size : size + n] = starts + offsets
        index[2 * size : 2 * size + n] = starts
        index[3 * size : 3 * size + n] = kv.gather(1, starts[:, None]).squeeze(1)
        index[4 * size :].view(size, ctx)[:n] = kv
        return index

    def _step(self, bucket: _Bucket) -> torch.Tensor:
        """The static step over the bucket's buffers: logits ``[B, vocab]`` float32. Shape-static
        and free of host syncs, so it can be captured."""
        decoder, pool, size, ctx = self.decoder, self.pool, bucket.batch, bucket.context
        ids, positions, starts, slots = (bucket.part(i) for i in range(4))
        cos, sin = decoder.rotary.cos_sin(positions, decoder.dtype)
        mask = (bucket.key_pos[None, :] <= starts[:, None]).view(size, 1, 1, ctx)
        step = _StepIndex(  # what _context_kv reads: the key slots (never a view of one run)
            input_ids=ids, cos=cos, sin=sin, slots=slots, last_index=bucket.rows, fresh_single=False
        )
        step.kv_slots = bucket.kv_slots
        h = decoder.embed_tokens(ids)
        for i, layer in enumerate(decoder.layers):
            assert isinstance(layer, DecoderLayer)
            q, k, v = self.math[0](layer, h, cos, sin)
            pool.write(i, slots, k, v)
            attended = _decode_attention(layer.self_attn, q, *_context_kv(pool, i, step, q.dtype), mask)
            h = self.math[1](layer, h, attended)
        logits: torch.Tensor = decoder.lm_head(decoder.norm(h)).float()
        return logits

    def _capture(self, bucket: _Bucket) -> None:
        """Warm the step up on a side stream, then capture it into the shared memory pool."""
        device = self.pool.device
        side = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUPS):  # the same K/V to the same slots: harmless to repeat
                self._step(bucket)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call of another thread (a memory monitor) does not void the capture
        with torch.cuda.graph(graph, pool=self._memory, capture_error_mode="thread_local"):
            bucket.logits = self._step(bucket)
        bucket.graph = graph


def _decode_attention(
    attn: Attention, q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """One query per sequence over its keys: q ``[B, heads, D]``, K/V ``[B, kv_heads, L, D]``,
    mask ``[B, 1, 1, L]``; returns ``[B, heads * D]``. Query head h reads KV head h // group (as
    enable_gqa does), so the group's heads become the query length of their KV head."""
    batch = q.shape[0]
    group = attn.num_heads // attn.num_kv_heads
    folded = q.view(batch, attn.num_kv_heads, group, attn.head_dim)
    out = F.scaled_dot_product_attention(folded, k_ctx, v_ctx, attn_mask=mask)
    return out.reshape(batch, -1)
