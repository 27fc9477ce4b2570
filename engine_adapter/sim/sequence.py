"""`SimSequence`: a request in flight in the simulator (queued, running or preempted).

The event loop (`engine_adapter.sim.simulator`) and the cache models
(`engine_adapter.sim.cache_models`) both read it, so it lives below both; it imports only the
workload records.
"""

from __future__ import annotations

from collections.abc import Hashable

from engine_adapter.sim.workloads import SimRequest

__all__ = ["SimSequence"]


class SimSequence:
    """A request in flight (the simulator's bookkeeping).

    Attributes:
        request: The workload's request.
        sid: Its sequence id in the cache (its index in the workload).
        keys: The prompt's block keys.
        prompt_tokens: Tokens of the blocks the prompt occupies (a partial last block of a
            trace's hash ids counts whole).
        tokens: Tokens to (re-)prefill: the prompt and, after a preemption, its regenerated output.
        decoded: Decode steps done before its latest preemption.
        first_token_s: When its first token came (None before).
        group: The tenant or session its hits are counted under (fairness).
        lookup_end: Its blocks' end in the run's whole lookup sequence (Belady's cursor).
        epoch: Preemptions so far; heap entries of an older epoch are stale.
        start_step: The step of its (latest) prefill.
        context_base: Its KV tokens at step 0 of the decoding sum (``tokens - start_step``).
    """

    __slots__ = (
        "context_base",
        "decoded",
        "epoch",
        "first_token_s",
        "group",
        "keys",
        "lookup_end",
        "prompt_tokens",
        "request",
        "sid",
        "start_step",
        "tokens",
    )

    def __init__(
        self, request: SimRequest, sid: int, block_size: int, group: Hashable, lookup_end: int
    ) -> None:
        self.request = request
        self.sid = sid
        self.keys = request.block_hashes
        # The blocks the prompt occupies: a partial last block of a trace's hash ids counts whole.
        self.prompt_tokens = max(request.input_len, len(self.keys) * block_size)
        self.tokens = self.prompt_tokens  # tokens to (re-)prefill: prompt and regenerated output
        self.decoded = 0  # decode steps done
        self.first_token_s: float | None = None
        self.group = group
        self.lookup_end = lookup_end
        self.epoch = 0
        self.start_step = 0  # the step of its (latest) prefill
        self.context_base = 0
