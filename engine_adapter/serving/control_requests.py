"""The control endpoints' requests: the policy swaps' bodies and the queries of the logs and the tree.

``PUT /v1/eviction/policy`` (`policy_swap`), ``PUT /v1/eviction/token``
(`token_policy_swap`), ``GET /v1/eviction/logs`` (`logs_query`: ``tail`` and ``follow``) and
``GET /v1/cache/tree`` (`tree_query`: ``depth`` and ``max_nodes``), each checked with the
shared `ApiError` answers.

Imports: the shared request handling (`requests`); the cache tree's bounds, inside `tree_query`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from engine_adapter.serving.requests import ApiError, bad_value

__all__ = [
    "LOGS_QUERY",
    "MAX_LOG_TAIL",
    "POLICY_FIELDS",
    "TOKEN_POLICY_FIELDS",
    "TREE_QUERY",
    "logs_query",
    "policy_swap",
    "token_policy_swap",
    "tree_query",
]

MAX_LOG_TAIL = 1_000_000
POLICY_FIELDS = frozenset({"policy", "params"})
TOKEN_POLICY_FIELDS = frozenset({"policy"})
LOGS_QUERY = frozenset({"tail", "follow"})
TREE_QUERY = frozenset({"depth", "max_nodes"})


def token_policy_swap(body: dict[str, Any]) -> str:
    """The policy name of a ``PUT /v1/eviction/token`` body, checked."""
    policy = body.get("policy")
    if not isinstance(policy, str) or not policy:
        raise bad_value("policy", f"must be a token policy name, got {policy!r:.80}")
    return policy


def policy_swap(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The policy name and params of a ``PUT /v1/eviction/policy`` body, checked."""
    policy = body.get("policy")
    if not isinstance(policy, str) or not policy:
        raise bad_value("policy", f"must be a policy name, got {policy!r}")
    params = body.get("params")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_value("params", f"must be an object of policy params, got {params!r}")
    return policy, params


def logs_query(request: Request) -> tuple[int, bool]:
    """``tail`` and ``follow`` of ``GET /v1/eviction/logs``, checked."""
    unknown = sorted(set(request.query_params) - LOGS_QUERY)
    if unknown:
        raise ApiError(
            400,
            "unknown_field",
            f"unknown query parameter {', '.join(map(repr, unknown))}; accepted: follow, tail",
        )
    raw_tail = request.query_params.get("tail", "100")
    try:
        tail = int(raw_tail)
    except ValueError:
        raise bad_value("tail", f"must be an integer, got {raw_tail!r}") from None
    if not 0 <= tail <= MAX_LOG_TAIL:
        raise bad_value("tail", f"must be between 0 and {MAX_LOG_TAIL}, got {tail}")
    raw_follow = request.query_params.get("follow", "false").lower()
    if raw_follow not in ("true", "false", "1", "0"):
        raise bad_value("follow", f"must be true or false, got {raw_follow!r}")
    return tail, raw_follow in ("true", "1")


def tree_query(request: Request) -> tuple[int, int]:
    """``depth`` (default 8) and ``max_nodes`` (default 200) of ``GET /v1/cache/tree``, checked
    against the bounds of `engine_adapter.cache.tree`."""
    from engine_adapter.cache.tree import MAX_DEPTH, MAX_NODES

    unknown = sorted(set(request.query_params) - TREE_QUERY)
    if unknown:
        raise ApiError(
            400,
            "unknown_field",
            f"unknown query parameter {', '.join(map(repr, unknown))}; accepted: depth, max_nodes",
        )
    values = []
    for name, default, top in (("depth", 8, MAX_DEPTH), ("max_nodes", 200, MAX_NODES)):
        raw = request.query_params.get(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise bad_value(name, f"must be an integer, got {raw[:40]!r}") from None
        if not 1 <= value <= top:
            raise bad_value(name, f"must be between 1 and {top}, got {value}")
        values.append(value)
    return values[0], values[1]
