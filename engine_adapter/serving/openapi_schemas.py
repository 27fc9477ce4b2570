"""The control API's answer schemas (components of the OpenAPI document, engine_adapter.serving.openapi):
the engine's info, the eviction and token-eviction stats with the KV tiers, the cache's views."""

from __future__ import annotations

from engine_adapter.serving.openapi_types import BOOL, INT, MAP, NUM, STR, Schema, nullable, obj, ref

__all__ = ["cache_schemas", "engine_schemas", "eviction_schemas", "tier_and_token_schemas"]


def engine_schemas() -> dict[str, Schema]:
    policy_ref = obj({"name": STR, "params": MAP})
    return {
        "Error": obj({"error": obj({"type": STR, "message": STR})}),
        "PolicyRef": policy_ref,
        "Policy": obj(
            {"name": STR, "strategy": STR, "offline": BOOL, "params": MAP}, {"idea": STR, "paper": STR}
        ),
        "Engine": obj(
            {
                "name": STR,
                "model": nullable(STR),
                "pid": INT,
                "device": STR,
                "policy": policy_ref,
                "num_blocks": INT,
                "block_size": INT,
                "requests": obj({"running": INT, "waiting": INT, "finished": INT}),
            },
            {
                "started_at": NUM,
                "uptime_s": NUM,
                "socket": nullable(STR),
                "loop_error": nullable(STR),
                "implementation": STR,
                "dtype": STR,
                "kv_dtype": STR,
                "quantization": STR,
                "packed_weights": STR,
                "batch_invariant": STR,
                "batch_invariant_kernels": nullable(STR),
                "compile": nullable(STR),
                "threads": obj(
                    {
                        "threads": INT,
                        "cores": INT,
                        "omp_num_threads": nullable(STR),
                        "torch_threads": INT,
                        "warnings": {"type": "array", "items": STR},
                    }
                ),
            },
        ),
    }


def eviction_schemas() -> dict[str, Schema]:
    return {
        "EvictionStats": obj(
            {
                "policy": STR,
                "total_evictions": INT,
                "hit_rate": NUM,
                "re_prefill_rate": NUM,
                "memory_utilization": NUM,
                "total_blocks": INT,
                "used_blocks": INT,
                "free_blocks": INT,
                "evictions_by_reason": MAP,
                "evictions_by_policy": MAP,
                "preemptions": INT,
                "policy_swaps": INT,
            },
            {
                "token_eviction": ref("TokenEviction"),
                "reserved_blocks": INT,
                "colocation": MAP,
                "tiers": {"type": "array", "items": ref("TierStats")},
                "prefetched_blocks": INT,
                "prefetch_hits": INT,
                # ages and regret (docs/architecture.md, "Ages and regret")
                "missed_blocks": INT,
                "ghost_hits": INT,
                "regrets": INT,
                "regret_ratio": NUM,
                "ghost_capacity": INT,
                "thrashing": BOOL,
                "thrashing_threshold": NUM,
                "window_regret_ratio": nullable(NUM),
                "re_prefill_window": INT,
                "age_histograms": {"type": "array", "items": ref("AgeHistogram")},
                # the prompt-cache contract (issue 51): lifetimes, and totals per tenant and salt
                "retained_blocks": INT,
                "retention_granted_blocks": INT,
                "retention_refused_blocks": INT,
                "retention_broken_blocks": INT,
                "retention_expired_blocks": INT,
                "cache_accounts": {"type": "array", "items": ref("CacheAccount")},
            },
        ),
        "AgeHistogram": obj(
            {
                "kind": STR,
                "policy": STR,
                "tenant": STR,
                "le": {"type": "array", "items": NUM},
                "counts": {"type": "array", "items": INT},
                "sum": NUM,
                "count": INT,
            }
        ),
    }


def tier_and_token_schemas() -> dict[str, Schema]:
    """A KV tier's figures (in the stats' ``tiers``) and the token-level eviction's."""
    return {
        "TierStats": obj(
            {
                "tier": STR,
                "policy": STR,
                "capacity_blocks": INT,
                "used_blocks": INT,
                "hits": INT,
                "demotions": INT,
                "promotions": INT,
                "drops": INT,
                "blocks_moved_in": INT,
                "blocks_moved_out": INT,
                "policy_swaps": INT,
                "loads": INT,
                "load_time_p50_ms": NUM,
                "load_time_p99_ms": NUM,
                "prefetched_blocks": INT,
                "prefetch_hits": INT,
            }
        ),
        "TokenEviction": obj(
            {
                "policy": STR,
                "params": MAP,
                "eviction_window": INT,
                "memory_threshold_bytes": INT,
                "target_ratio": NUM,
                "available_bytes": INT,
                "compressions": INT,
                "tokens_evicted": MAP,
                "bytes_freed": MAP,
                "tokens_evicted_total": INT,
                "bytes_freed_total": INT,
                "by_reason": MAP,
                "compress_s": NUM,
                "attention_fallbacks": MAP,
                "attention_fallbacks_total": INT,
            }
        ),
    }


def cache_schemas() -> dict[str, Schema]:
    return {
        "CacheTree": obj(
            {
                "policy": STR,
                "num_blocks": INT,
                "block_size": INT,
                "cached_blocks": INT,
                "shown_nodes": INT,
                "depth": INT,
                "max_nodes": INT,
                "truncated": BOOL,
                "hidden": obj({"nodes": INT, "blocks": INT}),
                "roots": {"type": "array", "items": MAP},
                "ghost_blocks": INT,
            }
        ),
        "CacheUsage": obj(
            {
                "policy": STR,
                "num_blocks": INT,
                "used_blocks": INT,
                "free_blocks": INT,
                "cached_blocks": INT,
                "evictable_blocks": INT,
                "pinned_blocks": INT,
                "reserved_blocks": INT,
                "by_tenant": MAP,
                "by_class": MAP,
                "running": INT,
                "waiting": INT,
                "max_running_batch": INT,
                "adaptive_batch": BOOL,
                "explain_evictions": BOOL,
            }
        ),
    }
