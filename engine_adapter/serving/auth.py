"""The API key of the TCP listener: ``Authorization: Bearer KEY`` (OpenAI's clients) or
``x-api-key: KEY`` (Anthropic's) on every request but ``/health``.

The Unix socket needs no key: it is mode 0600, so only its owner reaches it. Over TCP anyone who
reaches the port could, so `serve` wraps the app in `ApiKeyGate` for that listener only. The
comparison is constant-time (`hmac.compare_digest`), so response timing does not leak how much
of a guessed key was right.
"""

from __future__ import annotations

import hmac
from typing import Any

from engine_adapter.serving.messages import anthropic_error_json
from engine_adapter.serving.requests import error_json

__all__ = ["ApiKeyGate"]

_OPEN_PATHS = frozenset({"/health"})


class ApiKeyGate:
    """ASGI middleware: a JSON 401 unless the request carries the key as a bearer token."""

    def __init__(self, app: Any, api_key: str) -> None:
        if not api_key:
            raise ValueError("ApiKeyGate needs a non-empty key")
        self.app = app
        self._key = api_key.encode()

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """The key as a bearer token or as ``x-api-key`` (a client may send both): every key
        presented must be right, and at most one of each header."""
        bearer = [value for name, value in headers if name.lower() == b"authorization"]
        api_key = [value for name, value in headers if name.lower() == b"x-api-key"]
        if len(bearer) > 1 or len(api_key) > 1 or not bearer + api_key:
            return False
        keys = [value.strip() for value in api_key]
        for value in bearer:
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() != b"bearer":
                return False
            keys.append(token.strip())
        return all([hmac.compare_digest(key, self._key) for key in keys])  # each compared, in constant time

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS or self.authorized(scope["headers"]):
            await self.app(scope, receive, send)
            return
        message = "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"
        # Anthropic's clients read their own error shape
        anthropic = scope["path"].startswith("/v1/messages")
        body = anthropic_error_json(401, message) if anthropic else error_json("unauthorized", message)
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="sage"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
