"""The per-salt quota endpoints' part of the OpenAPI document (`quota_routes`; built into
`engine_adapter.serving.openapi`)."""

from __future__ import annotations

from engine_adapter.cache.quotas import MAX_QUOTA_SALTS
from engine_adapter.serving.openapi_types import INT, STR, Schema, nullable, obj, ref
from engine_adapter.serving.quota_routes import MAX_SALT_CHARS

__all__ = ["quota_paths", "quota_schemas"]

_CAP: Schema = nullable({"type": "integer", "minimum": 0})

_STATUSES = {
    "400": "A malformed body or salt; the message names the field.",
    "401": "Over TCP: a missing or wrong API key.",
    "404": "The salt has no quota.",
    "409": f"The salt is new and {MAX_QUOTA_SALTS} salts have a quota already.",
}


def _answer(schema: Schema, description: str, *errors: str) -> Schema:
    responses: Schema = {
        "200": {"description": description, "content": {"application/json": {"schema": schema}}}
    }
    for code in errors:
        responses[code] = {
            "description": _STATUSES[code],
            "content": {"application/json": {"schema": ref("Error")}},
        }
    return responses


def quota_paths() -> dict[str, Schema]:
    """``/v1/cache/quotas`` and ``/v1/cache/quotas/{salt}``: PUT first, then GET and DELETE (the
    order the contract test's fuzz runs them in, so its examples find the quota PUT set)."""
    salt: Schema = {
        "name": "salt",
        "in": "path",
        "required": True,
        "description": "The isolation key: requests' cache_salt (their tenant with --isolate-tenants).",
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_SALT_CHARS},
        "example": "tenant-a",
    }
    body: Schema = {
        "type": "object",
        "properties": {"device_blocks": _CAP, "host_blocks": _CAP},
        "minProperties": 1,
        "additionalProperties": False,
    }
    return {
        "/v1/cache/quotas": {
            "get": {
                "summary": "Every per-salt quota with its use now",
                "responses": _answer(
                    obj({"quotas": {"type": "array", "items": ref("SaltQuota")}, "max_salts": INT}),
                    "The quotas, by salt",
                    "401",
                ),
            }
        },
        "/v1/cache/quotas/{salt}": {
            "parameters": [salt],
            "put": {
                "summary": "Set (or replace) a salt's quota of device and host blocks (null: uncapped)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": body,
                            "example": {"device_blocks": 512, "host_blocks": None},
                        }
                    },
                },
                "responses": _answer(ref("SaltQuota"), "The quota set", "400", "401", "409"),
            },
            "get": {
                "summary": "A salt's quota and its use now",
                "responses": _answer(ref("SaltQuota"), "The quota", "400", "401", "404"),
            },
            "delete": {
                "summary": "Drop a salt's quota (what it holds stays cached)",
                "responses": _answer(
                    obj({"salt": STR, "deleted": {"const": True}}), "Deleted", "400", "401", "404"
                ),
            },
        },
    }


def quota_schemas() -> dict[str, Schema]:
    """`SaltQuota`: a quota, its use and its counters (`quotas.SaltQuotas.view`)."""
    return {
        "SaltQuota": obj(
            {
                "salt": STR,
                "device_blocks": _CAP,
                "host_blocks": _CAP,
                "device_blocks_used": INT,
                "host_blocks_used": INT,
                "device_evictions": INT,
                "not_cached_blocks": INT,
                "promotions_cut": INT,
                "host_drops": INT,
            }
        )
    }
