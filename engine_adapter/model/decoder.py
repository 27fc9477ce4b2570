"""A Llama/Qwen2-family decoder whose attention reads keys and values from the paged KV pool.

One forward runs a batch of sequences, each with a slice of new tokens: a prefill chunk or one
decode token. For every layer it computes q/k/v of the new tokens, writes the new K/V into the
pool (`PagedKVPool.write`, slots from the block table), then lets each sequence attend causally
over all its tokens read back from the pool. Nothing else holds K/V: a sequence whose first
blocks were written by another sequence (a shared prefix) or by an earlier chunk attends to them
exactly as to its own.

Reading the pool: one sequence whose slots are one ascending run (a fresh sequence's blocks come
off the allocator in order) attends over a view of the pool; other batches gather their slots.
The K/V dtype may differ from the model's (`make_pool(kv_dtype=...)`): K/V are cast on write and
on read. `Decoder.compile_step` compiles the dense math on both sides of the paged attention;
`graphs.enable_cuda_graphs` replays pure decode steps from CUDA graphs (`Decoder.graphs`).

Parameter names follow Hugging Face's ``LlamaForCausalLM`` without the ``model.`` prefix, so a
checkpoint loads by name (see `engine_adapter.model.loader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine_adapter.model.config import ModelConfig
from engine_adapter.model.invariant_attention import paged_attention
from engine_adapter.model.key_masks import padding_masks
from engine_adapter.model.layers import RMSNorm, RotaryEmbedding, apply_rotary
from engine_adapter.model.observer import AttentionObserver
from engine_adapter.model.step_index import (
    _add_padded_attention,
    _context_kv,
    _key_slots,
    _new_token_slots,
    _StepIndex,
)

if TYPE_CHECKING:
    from engine_adapter.model.kv_pool import PagedKVPool

__all__ = ["AttentionObserver", "Decoder", "ForwardBatch", "ForwardOutput"]


@dataclass(slots=True)
class ForwardBatch:
    """The sequences of one forward, in parallel lists (one entry per sequence).

    Attributes:
        token_ids: The new tokens of each sequence (a prefill chunk, or one decode token); none empty.
        start_positions: How many tokens of each sequence are already in the pool: the position
            of its first new token. 0 for a fresh prefill; the cached prefix length after a prefix
            cache hit; the context length for a decode step.
        block_tables: Each sequence's block ids in order, covering at least
            ``start_positions[i] + len(token_ids[i])`` tokens (longer tables are fine).
        return_all_logits: Also return the logits of every new token, not only the last.
        position_offsets: Per sequence, how many of its tokens token-level eviction removed
            from the pool: its new tokens take RoPE positions ``start + offset ...`` while they
            sit at cache index ``start ...`` (None: all 0, nothing evicted).
        observers: Per sequence, an `AttentionObserver` to feed, or None.
        pool_hidden: Per sequence, whether to return the sum of its new tokens' last hidden
            states (after the final norm) in `ForwardOutput.hidden_sums`: an embedding request's
            chunk rides in the same forward as the LLM's decodes (None: no sequence).
        key_masks: Per sequence, ``[layers, kv_heads, M]`` bool or None: False where cache index
            ``j < M`` of that layer and KV head is padding left by a head-varying compaction,
            which no query may attend to (None: no sequence has padding).
    """

    token_ids: list[list[int]]
    start_positions: list[int]
    block_tables: list[list[int]]
    return_all_logits: bool = False
    position_offsets: list[int] | None = None
    observers: list[AttentionObserver | None] | None = None
    pool_hidden: list[bool] | None = None
    key_masks: list[torch.Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_new_tokens(self) -> int:
        """New tokens over all sequences."""
        return sum(len(t) for t in self.token_ids)


@dataclass(slots=True)
class ForwardOutput:
    """Logits of one forward, float32, on the model's device.

    Attributes:
        logits: ``[num_sequences, vocab_size]``: the logits after each sequence's last new token,
            i.e. the distribution of its next token.
        all_logits: With ``return_all_logits``: per sequence ``[num_new_tokens, vocab_size]``.
        hidden_sums: With ``pool_hidden``: ``[num_sequences, hidden_size]`` float32, the sum of
            the final-normed hidden states of each pooled sequence's new tokens (0 elsewhere);
            mean pooling divides by the token count once the last chunk is in.
    """

    logits: torch.Tensor
    all_logits: list[torch.Tensor] | None = None
    hidden_sums: torch.Tensor | None = None


class StepRunner(Protocol):
    """Runs the batches it `fits` in place of the eager forward: `Decoder.graphs`, set by
    `engine_adapter.model.graphs.enable_cuda_graphs` (the static decode step)."""

    def fits(self, batch: ForwardBatch, pool: PagedKVPool) -> bool: ...

    def run(self, batch: ForwardBatch) -> ForwardOutput: ...


class Attention(nn.Module):
    """Grouped-query attention over the paged pool."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, q_size, kv_size = (
            config.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        self.q_proj = nn.Linear(hidden, q_size, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, kv_size, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.attention_out_bias)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[n, heads, D]``, k and v ``[n, kv_heads, D]`` of the new tokens, q and k rotated."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        step: _StepIndex,
        pool: PagedKVPool,
    ) -> torch.Tensor:
        """Write the new K/V into the pool and attend over each sequence's context: ``[n, heads * D]``
        (before the output projection). The paged part: it stays eager under `Decoder.compile_step`."""
        n = q.shape[0]
        pool.write(layer, step.slots, k, v)

        if step.invariant is not None:
            if step.observed:
                k_ctx, _ = _context_kv(pool, layer, step, q.dtype)
                for b, observer, first, n_new, start in step.observed:
                    observer.observe(layer, q[first : first + n_new], k_ctx[b, :, : start + n_new], start)
            keep = None if step.key_masks is None else step.key_masks[layer, :, :, 0]
            return paged_attention(q, pool, layer, step.kv_slots, *step.invariant, keep)  # type: ignore[arg-type]

        if step.fresh_single:
            # One sequence with nothing cached: its keys are exactly the new ones.
            if step.observed:
                step.observed[0][1].observe(layer, q, k.transpose(0, 1), 0)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
            )
            return out.transpose(0, 1).reshape(n, -1)

        k_ctx, v_ctx = _context_kv(pool, layer, step, q.dtype)
        for b, observer, first, n_new, start in step.observed:
            observer.observe(layer, q[first : first + n_new], k_ctx[b, :, : start + n_new], start)
        q_pad = q[step.q_index].transpose(1, 2)  # [B, heads, Tq, D]
        mask = step.mask
        if step.key_masks is not None:  # padding of head-varying compactions, this layer's
            mask = step.key_masks[layer] if mask is None else mask & step.key_masks[layer]
        out = F.scaled_dot_product_attention(q_pad, k_ctx, v_ctx, attn_mask=mask, enable_gqa=True)
        batch, _, tq, _ = out.shape
        out = out.transpose(1, 2).reshape(batch * tq, -1)
        if step.q_unpad is not None:
            out = out[step.q_unpad]
        return out


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each with a residual connection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

        self.compiled: tuple[Any, Any] | None = None  # set by compile_math
        self.cuda_graphs = False

    def forward(self, h: torch.Tensor, layer: int, step: _StepIndex, pool: PagedKVPool) -> torch.Tensor:
        before, after = self.compiled or (_before_attention, _after_attention)
        q, k, v = before(self, h, step.cos, step.sin)
        out: torch.Tensor = after(self, h, self.self_attn.attend(q, k, v, layer, step, pool))
        # Under CUDA graphs every layer replays the same graph into the same output buffer: the
        # next layer's replay would overwrite the residual stream it reads, so it gets a copy.
        return out.clone() if self.cuda_graphs else out

    def compile_math(self, mode: str | None) -> None:
        """torch.compile the dense math on both sides of the paged attention (norms, projections,
        rotary, MLP, residuals). Every layer calls the same two compiled functions with itself as
        an argument (dynamo takes a module's parameters as graph inputs), so one graph serves all
        layers; the token count is dynamic, so one graph serves every batch."""
        self.compiled = _compiled_math(mode)
        self.cuda_graphs = mode == "reduce-overhead"


def _before_attention(
    layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer.self_attn.project(layer.input_layernorm(h), cos, sin)


def _after_attention(layer: DecoderLayer, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    h = h + layer.self_attn.o_proj(attended)
    out: torch.Tensor = h + layer.mlp(layer.post_attention_layernorm(h))
    return out


_COMPILED: dict[str | None, tuple[Any, Any]] = {}


def _compiled_math(mode: str | None) -> tuple[Any, Any]:
    """The compiled `_before_attention` and `_after_attention` of `mode`, made once per process."""
    if mode not in _COMPILED:
        _COMPILED[mode] = (
            torch.compile(_before_attention, dynamic=True, mode=mode),
            torch.compile(_after_attention, dynamic=True, mode=mode),
        )
    return _COMPILED[mode]


class Decoder(nn.Module):
    """Llama/Qwen2 decoder: embeddings, layers, final norm, lm head.

    Build it with `engine_adapter.model.loader.load_model`, then run `forward` with a
    `ForwardBatch` and a `PagedKVPool` made by `make_pool` (same layers, heads, dtype, device).

    Args:
        config: The model's shape.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # nn.Module: weight-only quantization swaps in its own linear (engine_adapter.model.quant)
        self.lm_head: nn.Module = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.rotary = RotaryEmbedding(config)
        self.compiled: str | None = None  # set by compile_step
        self.quantization = "none"  # set by engine_adapter.model.quant.quantize_decoder
        self.packed_weights = "no"  # or "N of M linears": set by model.packed.pack_decoder
        # every row's logits independent of its batch: set by model.invariance.make_invariant
        self.batch_invariant = False
        self.invariant_kernels: str | None = None  # what the invariant forward runs, for the info
        self.graphs: StepRunner | None = None  # set by graphs.enable_cuda_graphs
        self.tokenizer: Any = None  # set by the loader: kvzip builds its replay prompt with it

    def precision(self, pool: PagedKVPool) -> dict[str, str | None]:
        """How this model runs with `pool`, for the engine's info: dtype, KV dtype, quantization,
        packed weights ("no" or "N of M linears"), compile (None when not compiled), and batch
        invariance ("on", or "off": outputs may depend on batching)."""
        return {
            "batch_invariant": "on" if self.batch_invariant else "off",
            "batch_invariant_kernels": self.invariant_kernels,
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_dtype": str(pool.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "packed_weights": self.packed_weights,
            "compile": self.compiled,
        }

    def compile_step(self, mode: str | None = None) -> str:
        """torch.compile every layer's dense math (`DecoderLayer.compile_math`); the paged
        attention between stays eager, so the pool's changing block tables and context lengths
        cause no recompilation. Graphs are built on the first forwards.

        Args:
            mode: torch.compile's mode; None: ``reduce-overhead`` (CUDA graphs) on CUDA, the
                default (inductor's C++ kernels) on the CPU.

        Returns:
            A description for the engine's info: ``inductor`` or ``inductor:reduce-overhead``.
        """
        if mode is None and self.device.type == "cuda":
            mode = "reduce-overhead"
        for block in self.layers:
            assert isinstance(block, DecoderLayer)
            block.compile_math(mode)
        self.compiled = "inductor" + (f":{mode}" if mode else "")
        return self.compiled

    def tie_weights(self) -> None:
        """Share the embedding matrix with the lm head when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def make_pool(
        self, *, num_blocks: int, block_size: int, kv_dtype: torch.dtype | str | None = None
    ) -> PagedKVPool:
        """A `PagedKVPool` that fits this model (layers, kv heads, head size, device), its K/V
        in `kv_dtype` (None: the model's dtype; another one is cast on write and on read)."""
        from engine_adapter.model.kv_pool import PagedKVPool, resolve_dtype

        cfg = self.config
        return PagedKVPool(
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
            dtype=self.dtype if kv_dtype is None else resolve_dtype(kv_dtype),
            device=str(self.device),
        )

    def forward(self, batch: ForwardBatch, pool: PagedKVPool) -> ForwardOutput:
        """Write the new tokens' K/V into `pool` and return the next-token logits.

        Runs under `torch.inference_mode`.

        Raises:
            ValueError: The batch is empty or inconsistent (list lengths, an empty slice, a
                negative start, a block table too short, a token id outside the vocab), or the
                pool does not fit the model.
        """
        with torch.inference_mode():
            self._check_pool(pool)
            self._check_batch(batch, pool.block_size)
            masked = batch.key_masks is not None and any(m is not None for m in batch.key_masks)
            if self.graphs is not None and not masked and self.graphs.fits(batch, pool):
                return self.graphs.run(batch)
            step = self._index(batch, pool.block_size)
            if self.compiled is not None and self.compiled.endswith("reduce-overhead"):
                # A new step: the CUDA graphs' outputs of the last one are dead.
                torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
            h = self.embed_tokens(step.input_ids)
            for layer, block in enumerate(self.layers):
                h = block(h, layer, step, pool)
            sums = self._hidden_sums(batch, h) if batch.pool_hidden is not None else None
            if batch.return_all_logits:
                logits_all = self.lm_head(self.norm(h)).float()
                splits = [len(t) for t in batch.token_ids]
                return ForwardOutput(
                    logits=logits_all[step.last_index],
                    all_logits=list(logits_all.split(splits)),
                    hidden_sums=sums,
                )
            return ForwardOutput(logits=self.lm_head(self.norm(h[step.last_index])).float(), hidden_sums=sums)

    def _hidden_sums(self, batch: ForwardBatch, h: torch.Tensor) -> torch.Tensor:
        """Per sequence, the sum of its new tokens' final-normed hidden states where
        `batch.pool_hidden` asks for it (only those rows are normed)."""
        assert batch.pool_hidden is not None
        if len(batch.pool_hidden) != len(batch.token_ids):
            raise ValueError("ForwardBatch pool_hidden differs in length from token_ids")
        rows: list[int] = []
        owners: list[int] = []
        first = 0
        for b, (pooled, ids) in enumerate(zip(batch.pool_hidden, batch.token_ids, strict=True)):
            if pooled:
                rows.extend(range(first, first + len(ids)))
                owners.extend([b] * len(ids))
            first += len(ids)
        sums = torch.zeros(len(batch.token_ids), h.shape[-1], dtype=torch.float32, device=h.device)
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=h.device)
            normed = self.norm(h.index_select(0, index)).float()
            sums.index_add_(0, torch.tensor(owners, dtype=torch.long, device=h.device), normed)
        return sums

    def _check_pool(self, pool: PagedKVPool) -> None:
        cfg = self.config
        expected = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.device)
        found = (pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.device)
        # Any floating K/V dtype fits: the attention casts what it reads to the model's dtype.
        if (
            expected[:3] != found[:3]
            or not pool.dtype.is_floating_point
            or not _same_device(self.device, pool.device)
        ):
            raise ValueError(
                "KV pool does not fit the model: (layers, kv heads, head_dim, device) are "
                f"{found} in the pool, {expected} in the model; build it with Decoder.make_pool"
            )

    def _check_batch(self, batch: ForwardBatch, block_size: int) -> None:
        """Raise ValueError naming what is wrong with `batch`: lengths, positions, block tables."""
        num_seqs = len(batch.token_ids)
        if num_seqs == 0:
            raise ValueError("empty ForwardBatch: no sequence to run")
        if not (len(batch.start_positions) == len(batch.block_tables) == num_seqs):
            raise ValueError(
                f"ForwardBatch lists differ in length: {num_seqs} token_ids, "
                f"{len(batch.start_positions)} start_positions, {len(batch.block_tables)} block_tables"
            )
        lengths = [len(t) for t in batch.token_ids]
        starts = list(batch.start_positions)
        for i, (start, n, table) in enumerate(zip(starts, lengths, batch.block_tables, strict=True)):
            if n == 0:
                raise ValueError(f"sequence {i} of the batch has no new token")
            if start < 0:
                raise ValueError(f"sequence {i}: start_position={start} is negative")
            needed = -(-(start + n) // block_size)
            if len(table) < needed:
                raise ValueError(
                    f"sequence {i}: block table of {len(table)} blocks cannot hold {start + n} tokens "
                    f"(block_size={block_size})"
                )
        offsets = batch.position_offsets or [0] * num_seqs
        if len(offsets) != num_seqs or (batch.observers is not None and len(batch.observers) != num_seqs):
            raise ValueError("ForwardBatch position_offsets / observers differ in length from token_ids")
        if any(o < 0 for o in offsets):
            raise ValueError("ForwardBatch position_offsets must not be negative")
        max_total = max(s + o + n for s, o, n in zip(starts, offsets, lengths, strict=True))
        if max_total > self.config.max_position_embeddings:
            raise ValueError(
                f"a sequence reaches {max_total} tokens, beyond max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )

    def _index(self, batch: ForwardBatch, block_size: int) -> _StepIndex:
        """The index tensors of a validated `batch`'s forward (on CPU, then one copy each)."""
        lengths = [len(t) for t in batch.token_ids]
        starts = list(batch.start_positions)
        kv_slots = _key_slots(batch.block_tables, starts, lengths, block_size)
        positions, slots = _new_token_slots(kv_slots, starts, lengths)
        if batch.position_offsets is not None and any(batch.position_offsets):
            # Token-level eviction compacted the cache: cache index != RoPE position.
            positions = positions + torch.repeat_interleave(
                torch.tensor(batch.position_offsets, dtype=torch.long), torch.tensor(lengths)
            )
        device = self.device
        cos, sin = self.rotary.cos_sin(positions.to(device), self.dtype)
        step = _StepIndex(
            input_ids=_input_ids(batch, self.config.vocab_size).to(device),
            cos=cos,
            sin=sin,
            slots=slots.to(device),
            last_index=(torch.tensor(lengths).cumsum(0) - 1).to(device),
            fresh_single=len(lengths) == 1 and starts[0] == 0,
        )
        if self.batch_invariant:  # the invariant kernel reads each sequence's slots itself
            step.kv_slots, step.fresh_single = kv_slots, False
            step.invariant = (torch.tensor(starts, dtype=torch.long), torch.tensor(lengths, dtype=torch.long))
        elif not step.fresh_single:
            _add_padded_attention(step, kv_slots, starts, lengths, device)
        masked = batch.key_masks is not None and any(m is not None for m in batch.key_masks)
        if masked and not step.fresh_single:
            assert batch.key_masks is not None
            step.key_masks = padding_masks(batch.key_masks, kv_slots.shape[1], self.config).to(device)
        if batch.observers is not None:
            first = 0
            for b, (observer, n) in enumerate(zip(batch.observers, lengths, strict=True)):
                if observer is not None:
                    step.observed.append((b, observer, first, n, starts[b]))
                    observer.note_forward(self, batch.token_ids[b], positions[first : first + n], starts[b])
                first += n
        return step


def _input_ids(batch: ForwardBatch, vocab: int) -> torch.Tensor:
    """The new tokens of every sequence, flat ``[T]``; ValueError names an id outside the vocab."""
    input_ids = torch.tensor([t for ids in batch.token_ids for t in ids], dtype=torch.long)
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        bad = next(t for t in input_ids.tolist() if not 0 <= t < vocab)
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
    return input_ids


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device when 0 is the current one."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
