"""The API key of the TCP listener: ``Authorization: Bearer KEY`` on every request but ``/health``.

The Unix socket needs no key: it is mode 0600, so only its owner reaches it. Over TCP anyone who
reaches the port could, so `serve` wraps the app in `ApiKeyGate` for that listener only. The
comparison is constant-time (`hmac.compare_digest`), so response timing does not leak how much
of a guessed key was right.
"""

from __future__ import annotations

import hmac
from typing import Any

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
        values = [value for name, value in headers if name.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS or self.authorized(scope["headers"]):
            await self.app(scope, receive, send)
            return
        body = error_json("unauthorized", "missing or wrong API key (Authorization: Bearer KEY)")
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
