"""`CacheRequest`: what a request brings to the cache, built once per admission by its caller.

The scheduler (from its `Sequence`), the simulator (from a trace request), the benchmarks and the
tests build one and hand it to `CacheManager.lookup`, `allocate` and `protect_queued_prefix`.
The running sequence's state (`records.SequenceState`) holds it as it is, and the policy's
record of each block it caches is derived from it in one place (`block_meta.BlockMetaFields`).
This module imports nothing of the cache.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from engine_adapter.cache.contract import CacheContract, CacheReceipt
from engine_adapter.cache.text_marks import TextMarks

__all__ = ["CacheRequest"]


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """A request as the cache sees it: its prompt, its isolation key and what policies read.

    Give the prompt as `token_ids` (hashed into block keys), or as `block_keys` (precomputed
    chained keys, e.g. Mooncake ``hash_ids``) with `num_tokens`.

    Attributes:
        sequence_id: The request's id; `allocate` runs it under this id, and a queued request's
            protection is ended by the allocation with the same id.
        token_ids: Prompt token ids (hashed into block keys).
        num_tokens: Tokens to allocate blocks for (default: ``len(token_ids)``, or
            ``len(block_keys) * block_size``).
        block_keys: Precomputed chained keys of the prompt's blocks instead of hashing
            `token_ids`; keys past the full blocks are ignored.
        cache_salt: Isolation key: only requests with the same salt share blocks.
        tenant: Accounting key (fairness); the isolation key too with `isolate_tenants`.
        priority: Higher is more important; recorded in the blocks' meta.
        max_tokens: Maximum length of the sequence (for predictive policies).
        deadline: Absolute time it should finish by (SLO-aware policies).
        estimated_lifetime: Predicted remaining life in seconds (predictive policies).
        conversation: The conversation (session) it belongs to, recorded in its blocks' meta
            for the policies that learn from it.
        non_preemptible: Never chosen by `select_preemption_victims`.
        recompute_last_token: Never serve the prompt's last token from cache, so the model
            computes its logits in a private block (False in simulation).
        match_prefix: False computes the whole prompt even if cached (a prompt compressed after
            prefill is scored by the attention of all its queries).
        request_id: The engine's request id, named in the lookup records (`lookup_log`);
            None: the sequence id.
        contract: Its prompt-cache contract (session key, minimum lifetime, explicit writes);
            None: none asked.
        receipt: Where the cache records what it wrote and granted for this request (mutable,
            the caller's); None: not recorded.
        text_marks: Its prompt's text marks, when it came as text (the receipts tell a text
            that tokenised differently from them); None: none.
    """

    sequence_id: int
    token_ids: Sequence[int] | None = None
    num_tokens: int | None = None
    block_keys: Sequence[Hashable] | None = None
    cache_salt: str | None = None
    tenant: str | None = None
    priority: int = 0
    max_tokens: int = 0
    deadline: float | None = None
    estimated_lifetime: float | None = None
    conversation: str | None = None
    non_preemptible: bool = False
    recompute_last_token: bool = True
    match_prefix: bool = True
    request_id: str | None = None
    contract: CacheContract | None = None
    receipt: CacheReceipt | None = None
    text_marks: TextMarks | None = None
