"""sage's own engine scheduler, without the model: the `sage` twin's step.

`SageTwin.step` makes the decisions `engine_adapter.serving.scheduler.Scheduler.step` makes, in
the same order and through the same `CacheManager` calls, so that the cache sees the engine's
call sequence and every hit, eviction and preemption is the engine's:

1. admission (`SageSchedulerConfig.admission`): ``"priority"``, the engine's, sorts the queue by
   priority (highest first) then arrival and admits from its head while fewer than
   `max_num_seqs` run and the cache can allocate the uncached part of the prompt (the head
   blocks the rest); ``"fcfs"`` keeps the queue's order (arrival order, a preempted sequence
   at the head), as the simulator's event loop admits;
2. scheduling: the running sequences by priority then arrival, each given a chunk of the
   `max_num_batched_tokens` budget (``chunked_prefill=False``: a prefill runs whole in one
   step, started while any budget is left); a chunk that needs blocks the pool cannot give
   preempts the running sequence the block policy's `select_victims` chooses (never one already
   in this step's batch), or the sequence itself when none can give way;
3. after the forward: each chunk that filled a block commits it (concurrent requests share it at
   once), a sequence whose tokens are all computed takes its next token (the workload's: the
   engine's greedy answer), and a sequence with all its output is freed.

A preempted sequence recomputes prompt and output (its full blocks stay cached) and goes back
to the head of the queue, as in the engine. What the twin leaves out is what the engine does
only when asked: colocation's quotas and victims, token-level eviction, queue protection, KV
tiers and prefetch, adaptive batching, the queue's timeout and length cap.

Imports the cache core only (the simulator never imports the serving package or torch).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.contract import CacheReceipt
from engine_adapter.cache.errors import NoEvictableBlocksError, RequestTooLargeError
from engine_adapter.cache.request import CacheRequest

__all__ = ["ADMISSION_ORDERS", "SageSchedulerConfig", "SageSequence", "SageTwin", "StepWork"]

ADMISSION_ORDERS = ("priority", "fcfs")
"""``priority``: the engine's (highest priority, then oldest); ``fcfs``: the queue's order."""


@dataclass(frozen=True, slots=True)
class SageSchedulerConfig:
    """The engine's scheduling settings (`EngineConfig`'s names) and the twin's options.

    Attributes:
        max_num_seqs: Most sequences running at once (``--max-num-seqs``).
        max_num_batched_tokens: Tokens one step computes (``--max-num-batched-tokens``).
        admission: `ADMISSION_ORDERS`: ``priority`` is the engine's.
        chunked_prefill: True (the engine): a prefill takes what is left of the step's budget
            and goes on next step; False: it runs whole in one step.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    admission: str = "priority"
    chunked_prefill: bool = True

    def check(self) -> None:
        """Raises ValueError naming a setting the engine would refuse."""
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_seqs={self.max_num_seqs}, max_num_batched_tokens={self.max_num_batched_tokens}: "
                "give positive numbers"
            )
        if self.admission not in ADMISSION_ORDERS:
            raise ValueError(f"admission {self.admission!r}; choose one of {', '.join(ADMISSION_ORDERS)}")


@dataclass(slots=True)
class SageSequence:
    """One request in the twin, as the engine's `Sequence` tracks it.

    `token_ids` is the prompt then the whole answer (the twin takes the answer's tokens from it
    one by one); without tokens, `block_keys` are the prompt's blocks and the answer's blocks
    are never cached (as the simulator's radix model keys a trace request).
    """

    index: int
    seq_id: int
    prompt_len: int
    output_len: int
    arrival: int
    priority: int = 0
    token_ids: Sequence[int] | None = None
    block_keys: Sequence[Hashable] | None = None
    num_output: int = 0
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens served from cache at first admission
    num_preemptions: int = 0
    running: bool = False
    receipt: CacheReceipt = field(init=False)

    def __post_init__(self) -> None:
        # The engine's: one receipt a request, handed with every admission, so that a
        # re-admission's write limit is still the prompt's (its output is not cached at finish).
        self.receipt = CacheReceipt(self.prompt_len)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def cache_args(self, num_computed: int) -> dict[str, Any]:
        """The token ids (or block keys) and computed tokens the cache manager's calls take."""
        if self.token_ids is not None:
            return {"token_ids": self.token_ids[: self.num_tokens], "num_computed_tokens": num_computed}
        return {"block_keys": self.block_keys, "num_computed_tokens": min(num_computed, self.prompt_len)}

    def request(self) -> CacheRequest:
        """What `allocate` gets: the tokens so far (a re-prefill includes the answer so far)."""
        if self.token_ids is not None:
            tokens = self.token_ids[: self.num_tokens]
            return CacheRequest(
                self.seq_id,
                tokens,
                priority=self.priority,
                max_tokens=self.prompt_len + self.output_len,
                receipt=self.receipt,
            )
        return CacheRequest(
            self.seq_id,
            num_tokens=self.num_tokens,
            block_keys=self.block_keys,
            priority=self.priority,
            max_tokens=self.prompt_len + self.output_len,
            receipt=self.receipt,
        )


@dataclass(slots=True)
class StepWork:
    """What one step computed, for the cost model."""

    prefill_tokens: int = 0
    prefill_batch: int = 0
    cached_tokens: int = 0
    decode_batch: int = 0
    context_tokens: int = 0


class SageTwin:
    """The engine's scheduler over a `CacheManager` (module docstring), stepped by its caller."""

    def __init__(self, cache: CacheManager, config: SageSchedulerConfig) -> None:
        config.check()
        self.cache = cache
        self.config = config
        self.bs = cache.block_size
        self.waiting: list[SageSequence] = []
        self.running: list[SageSequence] = []
        self.preemptions = 0

    def add(self, seq: SageSequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def stuck(self) -> str:
        """Why nothing runs: the queue's head cannot get its blocks from an empty pool."""
        seq = self.waiting[0]
        return (
            f"request {seq.index} ({seq.num_tokens} tokens) cannot get its blocks from the pool's "
            f"{self.cache.num_blocks} with nothing running"
        )

    def step(self) -> tuple[StepWork, list[SageSequence]]:
        """One engine step: admit, schedule (preempting when short), advance; returns its work
        and the sequences it finished."""
        work = StepWork()
        self._admit()
        batch, chunks = self._schedule()
        for seq, n in zip(batch, chunks, strict=True):
            if seq.num_computed >= seq.prompt_len and n == 1 and seq.num_output:
                work.decode_batch += 1
                work.context_tokens += seq.num_computed
            else:
                work.prefill_batch += 1
                work.prefill_tokens += n
                work.cached_tokens += seq.num_computed
        return work, self._advance(batch, chunks)

    def _admit(self) -> None:
        if self.config.admission == "priority":
            self.waiting.sort(key=lambda s: (-s.priority, s.arrival))
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            try:
                alloc = self.cache.allocate(seq.request())
            except NoEvictableBlocksError:
                break  # wait for running sequences to finish; keep the order
            except RequestTooLargeError as exc:
                raise ValueError(f"request {seq.index}: {exc}") from None
            self.waiting.pop(0)
            seq.block_table = alloc.block_table
            seq.num_computed = alloc.num_cached_tokens
            if seq.cached_tokens is None:
                seq.cached_tokens = min(alloc.num_cached_tokens, seq.prompt_len)
            seq.running = True
            self.running.append(seq)

    def _schedule(self) -> tuple[list[SageSequence], list[int]]:
        """This step's sequences and token counts, highest priority then oldest first."""
        self.running.sort(key=lambda s: (-s.priority, s.arrival))
        budget = self.config.max_num_batched_tokens
        batch: list[SageSequence] = []
        chunks: list[int] = []
        for seq in list(self.running):
            if not seq.running:
                continue  # preempted earlier in this step
            remaining = seq.num_tokens - seq.num_computed
            if remaining <= 0 or budget <= 0:
                continue
            n = min(remaining, budget) if self.config.chunked_prefill else remaining
            if not self._reserve(seq, n, batch):
                continue
            batch.append(seq)
            chunks.append(n)
            budget -= n
        return batch, chunks

    def _reserve(self, seq: SageSequence, n_new: int, batch: list[SageSequence]) -> bool:
        """Blocks for `n_new` more tokens of `seq`, preempting others (or `seq`) when short."""
        if seq.num_computed + n_new <= len(seq.block_table) * self.bs:
            return True
        while True:
            num_tokens = seq.num_computed + n_new
            if -(-num_tokens // self.bs) <= len(seq.block_table):
                return True
            try:
                new_ids = self.cache.reserve_tokens(seq.seq_id, num_tokens)
            except RequestTooLargeError as exc:
                raise ValueError(f"request {seq.index}: {exc}") from None
            if new_ids is not None:
                seq.block_table = self.cache.block_table(seq.seq_id)
                return True
            skip = {s.seq_id for s in batch}
            skip.add(seq.seq_id)
            victim_ids = self.cache.select_preemption_victims(1, exclude=skip)
            by_id = {s.seq_id: s for s in self.running}
            victim = by_id.get(victim_ids[0]) if victim_ids else None
            if victim is None:
                self._preempt(seq)  # nothing else can give way
                return False
            self._preempt(victim)

    def _preempt(self, seq: SageSequence) -> None:
        self.cache.preempt(seq.seq_id, **seq.cache_args(seq.num_computed))
        self.running.remove(seq)
        self.preemptions += 1
        seq.num_preemptions += 1
        seq.running = False
        seq.num_computed = 0
        seq.block_table = []
        self.waiting.insert(0, seq)

    def _advance(self, batch: list[SageSequence], chunks: list[int]) -> list[SageSequence]:
        """Account the chunks (committing each block they fill), then take each finished
        chunk's next token and free the sequences that have their whole answer."""
        sampled, finished = [], []
        for seq, n in zip(batch, chunks, strict=True):
            filled = (seq.num_computed + n) // self.bs > seq.num_computed // self.bs
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:
                sampled.append(seq)
            if filled:
                self.cache.commit_blocks(seq.seq_id, **seq.cache_args(seq.num_computed))
        for seq in sampled:
            self.cache.touch_sequence(seq.seq_id)
            seq.num_output += 1
            if seq.num_output >= seq.output_len:
                if self.cache.has_sequence(seq.seq_id):
                    self.cache.free_sequence(seq.seq_id, **seq.cache_args(seq.num_computed))
                self.running.remove(seq)
                seq.running = False
                finished.append(seq)
        return finished
