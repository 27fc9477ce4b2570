"""The OpenAPI parts of the request receipts (issue 51 item 5): ``GET /v1/cache/requests/{id}``,
its answer (`CacheReceipt`) and the per tenant-and-salt totals of the stats (`CacheAccount`).
The reasons are `engine_adapter.cache.receipts.MISS_REASONS`."""

from __future__ import annotations

from engine_adapter.cache.receipts import MISS_REASONS, TOTAL_FIELDS
from engine_adapter.serving.openapi_types import BOOL, INT, MAP, NUM, STR, Schema, nullable, obj, ref

__all__ = ["receipt_paths", "receipt_schemas"]


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def receipt_paths() -> dict[str, Schema]:
    """``GET /v1/cache/requests/{request_id}``."""
    return {
        "/v1/cache/requests/{request_id}": {
            "get": {
                "summary": "What the cache did for a recent request, and why it missed each block it missed",
                "description": "The engine keeps the last 4,096 requests' receipts (the oldest dropped); "
                "the reasons come from bounded windows (the ghost set's length): past them a block's "
                "reason is 'unknown'. Salts are shown as 'sha256:' and 12 hex digits of their SHA-256.",
                "parameters": [
                    {
                        "name": "request_id",
                        "in": "path",
                        "required": True,
                        "schema": STR,
                        "description": "A completion's, chat's or message's id; 'latest': the last admitted.",
                        "example": "latest",
                    },
                ],
                "responses": {
                    "200": _json(ref("CacheReceipt"), "The receipt"),
                    "401": _json(ref("Error"), "Over TCP: a missing or wrong API key."),
                    "404": _json(ref("Error"), "No receipt: an unknown request, or one past the window."),
                },
            }
        }
    }


def receipt_schemas() -> dict[str, Schema]:
    """`CacheReceipt` (with its `CacheMiss` runs) and `CacheAccount`."""
    tier_tokens = obj({"device": INT, "host": INT, "disk": INT})
    return {
        "CacheReceipt": obj(
            {
                "id": STR,
                "tenant": nullable(STR),
                "salt": nullable(STR),
                "session_key": nullable(STR),
                "admitted_at": NUM,
                "block_size": INT,
                "prompt_tokens": INT,
                "read_tokens": tier_tokens,
                "cached_tokens": INT,
                "written_tokens": INT,
                "uncached_tokens": INT,
                "retention_ttl_s": nullable(NUM),
                "retention_refused": BOOL,
                "retention_broken_tokens": INT,
                "misses": {"type": "array", "items": ref("CacheMiss")},
                "window": obj({"requests": INT, "blocks": INT}),
            }
        ),
        "CacheMiss": obj(
            {"first_block": INT, "blocks": INT, "tokens": INT, "reason": {"enum": list(MISS_REASONS)}},
            {
                "at": NUM,
                "policy": STR,
                "eviction_id": INT,
                "block": STR,
                "lapsed_at": NUM,
                "tier": STR,
                "why": STR,
                "salt": nullable(STR),
                "cached": BOOL,
                "note": STR,
                "explanation": nullable(MAP),
            },
        ),
        "CacheAccount": obj(
            {"tenant": nullable(STR), "salt": nullable(STR), **dict.fromkeys(TOTAL_FIELDS, INT)}
        ),
    }
