"""The model of the engine: a Llama/Qwen2-family decoder over the paged KV pool.

    config.py     ModelConfig (from a Hugging Face config.json) and SAGE_TINY
    tokenizer.py  ByteTokenizer, HFTokenizer (tokenizer.json), IncrementalDetokenizer
    loader.py     load_model("sage-tiny" | folder | cached hub id) -> (Decoder, tokenizer, config)
    decoder.py    Decoder.forward(ForwardBatch, PagedKVPool) -> ForwardOutput
    sampling.py   SamplingParams, sample / sample_batch with per-request generators

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
