"""The scheduler's records: a request as a `Sequence`, what it emits, the batch limits, a step's stats.

`Sequence` is one completion request as the scheduler tracks it (its tokens, its blocks, its
text, its SLOs); `RequestOutput` is what it hands its caller, a delta while it runs and the
whole output once it ends; `SchedulerLimits` are the batch and queue limits of the engine
config; `StepStats` is what one `Scheduler.step()` did. Embedding requests have records of
their own (`engine_adapter.serving.embedding_batch`).

Imports: the model's sampling, tokenizer and attention observer, and the token-level eviction
request (`KVCompression`); nothing of the scheduler or the engine.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.text_marks import TextMarks
from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.model.tokenizer import IncrementalDetokenizer
from engine_adapter.token_eviction import KVCompression

__all__ = ["RequestOutput", "SchedulerLimits", "Sequence", "SequenceStatus", "StepStats"]


class SequenceStatus(enum.Enum):
    """Where a sequence is."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class RequestOutput:
    """A delta while a request runs, or its final output.

    Attributes:
        request_id: The request.
        text: New text (a delta) while streaming; the whole text in the final output.
        token_ids: New token ids, or all of them in the final output.
        finished: Whether the request ended.
        finish_reason: "stop", "length", "abort", "timeout", "dropped" or "error".
        error: Why a request ended without completing (abort, timeout, dropped, error).
        prompt_tokens: Prompt length in tokens.
        cached_tokens: Prompt tokens served from the prefix cache at first admission.
        compressed_cached_tokens: Of those, tokens served from a compressed prefix
            (compress-on-evict: their K/V were compacted, not recomputed).
        completion_tokens: Tokens generated so far.
        written_tokens: Prompt tokens this request wrote to the prefix cache (a sage extension
            beside OpenAI's `cached_tokens`; Anthropic's `cache_creation_input_tokens`).
        retention_ttl_s: The minimum lifetime the cache granted its blocks, in seconds (None:
            no retention asked or granted); may be shorter than asked (`--max-cache-ttl`).
        written_short_tokens: Of `written_tokens`, those retained for the contract's shorter
            lifetime (`CacheContract.short_ttl`: Anthropic's "5m" blocks after "1h" ones).
    """

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    compressed_cached_tokens: int = 0
    written_tokens: int = 0
    retention_ttl_s: float | None = None
    written_short_tokens: int = 0


@dataclass(slots=True)
class SchedulerLimits:
    """Batch and queue limits, and the preemption order (engine config keys of the same names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_queued_requests: int | None = None
    queued_timeout: float | None = None
    embedding_chunk_tokens: int = 128
    preemption_order: str = "policy"  # a name in sage_eviction.preemption.ORDERS, or the policy's


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler tracks it."""

    seq_id: int
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    detokenizer: IncrementalDetokenizer
    emit: Callable[[RequestOutput], None]
    priority: int = 0
    tenant: str | None = None
    cache_salt: str | None = None
    cache_contract: CacheContract | None = None  # the prompt-cache fields it sent
    text_marks: TextMarks | None = None  # its prompt's text marks (it came as text)
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0  # tokens whose K/V are in the pool
    block_table: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens hit at first admission
    compressed_cached_tokens: int = 0  # of which from a compressed prefix
    text: str = ""
    emitted_chars: int = 0
    emitted_tokens: int = 0  # output ids already handed out in deltas
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    finish_reason: str | None = None
    error: str | None = None
    kv_compression: KVCompression | None = None  # compress the prompt once after prefill
    evicted_tokens: int = 0  # tokens token-level eviction removed from its cache (RoPE offset)
    observer: AttentionObserver | None = None  # what its attention exposes to its token policy
    key_mask: torch.Tensor | None = None  # padding of a head-varying compaction (SequenceKV.key_mask)
    prompt_compressed: bool = False
    # SLOs (spec 004), in milliseconds; None: no SLO given and colocation off.
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # Absolute time (the cache's clock) its blocks should be done by: the `slo` policy's
    # deadline. None: no deadline known (the policy's default slack).
    deadline: float | None = None
    # What the cache wrote and granted for it (its usage), filled by the cache across admissions.
    cache_receipt: CacheReceipt = field(init=False)

    def __post_init__(self) -> None:
        self.cache_receipt = CacheReceipt(prompt_tokens=len(self.prompt_ids))

    @property
    def cache_len(self) -> int:
        """Tokens of this sequence whose K/V are in the pool now."""
        return self.num_computed - self.evicted_tokens

    @property
    def all_ids(self) -> list[int]:
        """Prompt and output tokens: what a (re)prefill computes."""
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(slots=True)
class StepStats:
    """What one step did (for the engine's metrics and the benchmark)."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    embedding_tokens: int = 0
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    forward_s: float = 0.0
    bookkeeping_s: float = 0.0  # everything but the forward: scheduling, sampling, detokenizing
    cache_s: float = 0.0  # of which in the cache manager and the policy
    tier_moves: int = 0  # blocks copied between the pool and its host/disk tiers
    tier_failed: int = 0  # of which failed (an unreadable disk file): misses
    tier_copy_s: float = 0.0  # of the bookkeeping, in those copies
    prefetched: int = 0  # blocks loaded back for queued requests (--prefetch)
