"""The model of the engine: a Llama/Qwen2-family decoder over the paged KV pool.

    config.py         ModelConfig (from a Hugging Face config.json or GGUF metadata), SAGE_TINY
    builtin.py        the built-in models by name (sage-tiny, smollm2-135m when installed)
    tokenizer.py      ByteTokenizer, HFTokenizer (tokenizer.json), IncrementalDetokenizer
    chat_template.py  chat templates rendered with jinja2, as transformers' apply_chat_template
    gguf_file.py      a GGUF file's metadata, tokenizer and tensors (the gguf package dequantizes)
    loader.py         load_model("sage-tiny" | file.gguf | folder | cached hub id)
                      -> (Decoder, tokenizer, config)
    kv_pool.py        PagedKVPool: one K and one V tensor per layer, indexed by the block ids of
                      the cache core's BlockAllocator (pool.allocator)
    host_pool.py      HostKVPool: the host tier's K/V (--host-kv-cache), pinned beside CUDA
    disk_store.py     DiskKVStore: the disk tier (--disk-kv-cache), a checksummed file per block
    tier_copy.py      execute_moves: the cache core's TierMoves, batched per pair of tiers
    decoder.py        Decoder.forward(ForwardBatch, PagedKVPool) -> ForwardOutput;
                      Decoder.compile_step (torch.compile of the layers' dense math)
    graphs.py         enable_cuda_graphs: pure decode steps padded to buckets and replayed from
                      one CUDA graph each (the same static step runs eagerly on the CPU)
    step_index.py     one forward's index: new tokens' slots, key slots, the padded batch's mask
    invariance.py     --batch-invariant: every linear on one kernel at every row count (probed)
    invariant_attention.py  attention over each row's own keys in key order (_attention.pyx)
    layers.py         RMSNorm (torch's fused rms_norm), the rotary embedding
    observer.py       the AttentionObserver token-level eviction reads
    precision.py      the run dtype: auto (bf16 on CUDA or a CPU with AMX/AVX512-BF16), names
    quant.py          weight-only int8/int4 linears on torch's CPU kernels (a GGUF's Q4_1 as stored)
    packed.py         --packed-weights: dense linears on weights reordered once for oneDNN
    key_masks.py      key masks: padded keys of head-varying budgets get no attention weight
    sampling.py       SamplingParams, sample / sample_batch with per-request generators
    penalties.py      apply_penalties: OpenAI's frequency and presence penalties
    pooling.py        MeanPool: embeddings from the hidden states of chunked prefills

Imports torch, numpy, tokenizers, gguf, safetensors and jinja2, and of sage only the cache core
(`engine_adapter.cache`: the allocator and block sizes); never the serving layer or the
simulator.

A step of the engine::

    decoder, tokenizer, config = load_model("sage-tiny", device="cpu")
    pool = decoder.make_pool(num_blocks=64, block_size=16)
    ids = tokenizer.encode("hello")
    table = pool.allocator.allocate(1)
    out = decoder(ForwardBatch(token_ids=[ids], start_positions=[0], block_tables=[table]), pool)
    next_id = sample(out.logits[0], SamplingParams())            # prefill -> first token
    out = decoder(ForwardBatch([[next_id]], [len(ids)], [table]), pool)  # one decode step
"""

from __future__ import annotations

from engine_adapter.model.config import SAGE_TINY, ModelConfig
from engine_adapter.model.decoder import Decoder, ForwardBatch, ForwardOutput
from engine_adapter.model.loader import ModelLoadError, load_model
from engine_adapter.model.sampling import SamplingParams, make_generator, sample, sample_batch
from engine_adapter.model.tokenizer import ByteTokenizer, HFTokenizer, IncrementalDetokenizer, Tokenizer

__all__ = [
    "SAGE_TINY",
    "ByteTokenizer",
    "Decoder",
    "ForwardBatch",
    "ForwardOutput",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "ModelConfig",
    "ModelLoadError",
    "SamplingParams",
    "Tokenizer",
    "load_model",
    "make_generator",
    "sample",
    "sample_batch",
]
