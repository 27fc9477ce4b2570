"""The per-salt quota endpoints (issue 51, item 4; docs/architecture.md, "Per-salt quotas").

``PUT /v1/cache/quotas/{salt}`` with ``{"device_blocks": int | null, "host_blocks": int | null}``
sets (or replaces) a salt's quota; ``GET`` of the same path answers it with its use now,
``DELETE`` drops it, and ``GET /v1/cache/quotas`` lists them all. The salt is the requests'
isolation key (their ``cache_salt``, or their tenant with ``--isolate-tenants``). A bad body is a
400 naming the field, a salt without a quota a 404, and a new salt past the bound on quotas
(`engine_adapter.cache.quotas.MAX_QUOTA_SALTS`) a 409 that says so. Over TCP these need the API
key, as every route but ``/health`` does (`auth`).

Imports: the shared request handling (`requests`); the cache's quota bound and error.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine_adapter.cache.quotas import MAX_QUOTA_SALTS, QuotaLimitError
from engine_adapter.serving.requests import ApiError, bad_value, endpoint, json_body, json_response, opt_int

__all__ = ["MAX_SALT_CHARS", "QUOTA_FIELDS", "QUOTA_ROUTES", "quota_body"]

QUOTA_FIELDS = frozenset({"device_blocks", "host_blocks"})
MAX_SALT_CHARS = 256


def quota_body(body: dict[str, Any]) -> tuple[int | None, int | None]:
    """The caps of a ``PUT /v1/cache/quotas/{salt}`` body, checked: each null (uncapped) or a
    number of blocks, 0 or more; at least one of them given."""
    if not QUOTA_FIELDS & body.keys():
        raise ApiError(
            400, "invalid_request", "give 'device_blocks' or 'host_blocks' (a number of blocks, or null)"
        )
    return opt_int(body, "device_blocks", minimum=0), opt_int(body, "host_blocks", minimum=0)


def _salt(request: Request) -> str:
    salt = str(request.path_params["salt"])
    if not salt or len(salt) > MAX_SALT_CHARS:
        raise bad_value("salt", f"must be 1 to {MAX_SALT_CHARS} characters, got {len(salt)}")
    return salt


def _not_found(salt: str) -> ApiError:
    return ApiError(404, "not_found", f"salt {salt[:80]!r} has no quota")


@endpoint
async def quota(request: Request) -> Response:
    """GET, PUT and DELETE of one salt's quota (one route, so that a 405 lists all three)."""
    engine = request.app.state.sage.engine
    salt = _salt(request)
    if request.method == "PUT":
        device, host = quota_body(await json_body(request, QUOTA_FIELDS, "PUT /v1/cache/quotas/{salt}"))
        try:
            return json_response(await asyncio.to_thread(engine.set_quota, salt, device, host))
        except QuotaLimitError as exc:
            raise ApiError(409, "quota_limit", str(exc)) from None
    if request.method == "DELETE":
        if not await asyncio.to_thread(engine.delete_quota, salt):
            raise _not_found(salt)
        return json_response({"salt": salt, "deleted": True})
    view = await asyncio.to_thread(engine.quota, salt)
    if view is None:
        raise _not_found(salt)
    return json_response(view)


@endpoint
async def quotas(request: Request) -> Response:
    """GET /v1/cache/quotas: every quota with its use, and the bound on how many there may be."""
    views = await asyncio.to_thread(request.app.state.sage.engine.quotas)
    return json_response({"quotas": views, "max_salts": MAX_QUOTA_SALTS})


def _salt_route() -> Route:
    """The route of one salt's quota, for any salt a request may carry as its ``cache_salt``:
    Starlette's ``path`` parameter (``.*``) stops at a line break, which would make such a salt
    an undocumented 404 of the router; ``[\\s\\S]*`` takes every character."""
    route = Route("/v1/cache/quotas/{salt:path}", quota, methods=["GET", "PUT", "DELETE"])
    route.path_regex = re.compile(r"^/v1/cache/quotas/(?P<salt>[\s\S]*)$")
    return route


QUOTA_ROUTES = [Route("/v1/cache/quotas", quotas, methods=["GET"]), _salt_route()]
