"""The cache core: pure Python (the radix index's hot paths optionally compiled), never torch.

It imports only the policy library (`sage_eviction`), `engine_adapter.paths` (the event log's
folder) and structlog; nothing of the model, the server or the simulator. The parts, from the
front down (docs/architecture.md, "Cache core"):

    cache_manager.py    CacheManager: the one front the scheduler, server and simulator drive;
                        one re-entrant lock over every part
    queue_front.py      QueueFront: the manager's queue-protection methods (a mixin)
    tier_front.py       TierFront: the manager's KV-tier methods (take_moves, moves_failed,
                        prefetch, swap_host_policy, tier_of; a mixin)
    request.py          CacheRequest: what a request brings to the cache (built once per admission)
    contract.py         CacheContract: a request's prompt-cache contract (session, lifetime, writes)
    admission.py        Admission: a request's lookup, its admission, its queue protection
    sequences.py        RunningSequences: each running sequence's block table, admission to release
    prompt_keys.py      PromptKeys: a prompt's token count, isolation key and block keys
    queue_protection.py QueueProtection: the cached prefixes of waiting requests, held until they run
    reservations.py     Reservations: blocks held for an embedding batch's workspace
    compaction.py       a sequence compacted by token-level eviction gets a fresh table
    compressed.py       CompressedPrefixes: evicted chains compacted instead of dropped
                        (--compress-on-evict), the typed CompressMove the engine runs
    compress_front.py   CompressFront: the manager's compress-on-evict methods (a mixin)
    retention.py        Retention: prompt-cache lifetimes (demotion, retention pins, breaks)
    retention_front.py  RetentionFront: the manager's retention methods (a mixin)
    quotas.py           SaltQuotas: per-salt quotas of cached device and host blocks (bounded)
    quota_front.py      QuotaFront: the manager's quota methods (a mixin)
    pins.py             Pins: system prompts' cached prefixes held against eviction
    policy_binding.py   PolicyBinding: the policy's resolved spec, and the hot swap
    eviction.py         EvictionStep: the deficit, eviction through the index, its counters and events
    metrics.py          CacheMetrics: lookup metrics and the CacheStats snapshot
    accounting.py       CacheAccounting: ages, regret, thrashing and the lookup records
    ages.py             AgeHistograms: block age at hit and eviction, reuse distance, per policy
                        and tenant
    ghosts.py           GhostSet, ReuseClock: recently evicted keys, distinct blocks since;
                        new_ghost_set picks the compiled one for int64 keys
    _ghosts.pyx         IntGhostSet: the ghost set and its clocks in C for int64 keys (optional;
                        ghosts.py is the reference and the fallback)
    lookup_log.py       LookupLog: one JSON line per lookup (--lookup-log), rotated
    receipts.py         RequestReceipts: the last 4,096 requests' cache receipts, each missed
                        block's reason (bounded windows), totals per tenant and salt
    receipts_front.py   ReceiptsFront: the manager's receipt methods (a mixin); attach_receipts
    text_marks.py       TextMarks: a prompt's text digests every 64 characters and its tokens
                        there (the receipts tell a text that tokenised differently)
    radix_cache.py      RadixCache: full blocks keyed by chained hashes, ref counts, pins,
                        leaf-only eviction through the policy
    _core.pyx           the radix index's hot paths in C (optional; radix_cache.py is the
                        reference and the fallback)
    cached_block.py     CachedBlock: one node of the radix index
    block_meta.py       BlockMetaFields: a cached block's policy record, derived from its request
    block_keys.py       chained block hashes (root_key, block_hashes, format_block_key)
    block_allocator.py  BlockAllocator: the free list of the pool's block ids
    records.py          Allocation, LookupResult, PinnedPrefix, SwapResult, SequenceState
    stats.py            CacheStats: the metrics snapshot (GET /v1/eviction/stats)
    invariants.py       check_manager_invariants: the parts checked against each other (tests)
    explain.py          why a block was evicted (--explain)
    tree.py             the radix tree as a bounded picture (GET /v1/cache/tree)
    usage.py            pool use by tenant and priority class (GET /v1/cache/usage)
    events.py           EvictionEventLog: eviction events as JSON lines, ring buffer, subscribers
    handoff_lock.py     HandoffLock: the cache lock, handed to waiting requests after each step
    adaptive_batch.py   AdaptiveBatch: the running-batch limit from eviction pressure
    errors.py           the cache's exception tree
    sizes.py            byte sizes such as "2GiB"
    tier_moves.py       Tier, TierMove: the block copies the core decides and the engine runs
    tiers.py            TierStore, TierConfig: the host and disk tiers, demotion, promotion,
                        the tree property across tiers (docs/architecture.md, "Tiers")
    tier_level.py       TierLevel, TierEntry: one lower tier's slots, entries and policy
    promotion.py        loading blocks back into the device tree; Prefetches
    tier_failures.py    what a failed move does (a miss, never a wrong answer)

Importing this package imports no submodule; import what you need.
"""

from __future__ import annotations

__all__: list[str] = []
