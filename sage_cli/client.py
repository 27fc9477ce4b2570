"""The control client: HTTP/1.1 JSON over the engine's Unix socket (docs/architecture.md, "Control API").

Transport errors are translated once, here, into a small tree; nothing above this module
sees an httpx exception::

    SageClientError
    ├── EngineUnavailable            the engine could not be reached
    │   ├── EngineNotRunning         no socket file, or nothing listens on it (a stale socket);
    │   │                            the message says how to start one
    │   └── EngineConnectionError    the socket is there but the connection failed otherwise
    │                                (permission denied, not a socket, dropped mid-answer)
    ├── EngineTimeout                the engine did not answer in time
    ├── EngineError                  the engine answered 4xx/5xx with {"error": {"type", "message"}}
    └── EngineProtocolError          the answer is not what the control API describes

```python
with ControlClient("/tmp/sage.sock") as client:  # needs an engine on that socket
    print(client.eviction_stats()["strategy"])  # LRU
```

Two faces of the same API: the JSON methods (``eviction_stats``, ``engine``, ...) return each
answer as the engine sent it (what ``--json`` prints); the typed ones (``stats``, ``info``,
``policies``, ``swap_policy``, ``usage``, ``token_policy``) return `sage_cli.records` records
(``stats().hit_rate``; each keeps the answer in ``raw``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from sage_cli.records import (
    CacheUsage,
    EngineInfo,
    EvictionStats,
    Policies,
    PolicySwap,
    RecordError,
    TokenEviction,
)
from sage_cli.sse import StreamDecodeError, StreamErrorEvent, json_chunks

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ControlClient",
    "EngineConnectionError",
    "EngineError",
    "EngineNotRunning",
    "EngineProtocolError",
    "EngineTimeout",
    "EngineUnavailable",
    "SageClientError",
]

DEFAULT_TIMEOUT_S = 10.0
"""Seconds a call waits for the engine's answer unless the client or the call says otherwise."""
# A hot swap at 1e6 cached blocks is a target of 0.5 s; leave room for a loaded engine.
SWAP_TIMEOUT_S = 60.0

JSONObject = dict[str, Any]
R = TypeVar("R", EvictionStats, EngineInfo, Policies, PolicySwap, CacheUsage, TokenEviction)


class SageClientError(Exception):
    """Base of every error the control client raises."""


class EngineUnavailable(SageClientError):
    """The engine could not be reached."""

    def __init__(self, message: str, socket: Path | str) -> None:
        super().__init__(message)
        self.socket = socket  # the socket's path, or the URL of a TCP engine


class EngineNotRunning(EngineUnavailable):
    """No engine listens on the socket: the file is missing, or stale (connection refused)."""

    def __init__(self, socket: Path | str, *, stale: bool = False, start_hint: str = "sage llm engine start"):
        why = " (stale socket file: nothing listens on it)" if stale else ""
        super().__init__(f"no engine running on {socket}{why}; start one with `{start_hint}`", socket)
        self.stale = stale


class EngineConnectionError(EngineUnavailable):
    """The socket exists but talking to it failed for another reason."""


class EngineTimeout(SageClientError):
    """The engine did not answer within the timeout."""


class EngineError(SageClientError):
    """The engine answered with an error: ``{"error": {"type": ..., "message": ...}}``.

    Attributes:
        status_code: The HTTP status.
        error_type: The server's ``error.type``, e.g. ``"unknown_policy"``.
        message: The server's ``error.message``; ``str(exc)`` is this message.
    """

    def __init__(self, status_code: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type
        self.message = message


class EngineProtocolError(SageClientError):
    """The engine's answer is not the JSON the control API describes."""


def _os_error_in_chain(exc: BaseException) -> OSError | None:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


class ControlClient:
    """A client of one engine's control API.

    Args:
        socket: The engine's Unix socket.
        timeout: Seconds to wait for a connection and for each answer.
        start_hint: The command that starts this engine, quoted when none is running.
        transport: An httpx transport to use instead of the socket (tests).
        url: Reach the engine over TCP at this ``http(s)://host:port`` instead of the socket.
        api_key: Sent as ``Authorization: Bearer KEY`` (a TCP engine asks for it).
        ca_file: PEM file of the CA (or the self-signed certificate) an https engine is trusted by.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        start_hint: str = "sage llm engine start",
        transport: httpx.BaseTransport | None = None,
        url: str | None = None,
        api_key: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.socket = Path(socket)
        self.url = url.rstrip("/") if url else None
        self._api_key = api_key or None
        self._ca_file = ca_file or None
        self.timeout = timeout
        self.start_hint = start_hint
        self._transport = transport
        self._http_client: httpx.Client | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._http_client is not None:
            self._http_client.close()
            self._http_client = None

    # -- the API --------------------------------------------------------------------------------

    def health(self) -> JSONObject:
        """``GET /health``: ``{"status": "ok", "name", "pid"}``."""
        return self._request("GET", "/health")

    def engine(self) -> JSONObject:
        """``GET /v1/engine``: name, model, pid, socket, device, policy, pool and request counts."""
        return self._request("GET", "/v1/engine")

    def eviction_stats(self) -> JSONObject:
        """``GET /v1/eviction/stats``."""
        return self._request("GET", "/v1/eviction/stats")

    def eviction_policies(self) -> JSONObject:
        """``GET /v1/eviction/policies``: ``{"active", "policies": [...]}``."""
        return self._request("GET", "/v1/eviction/policies")

    def set_policy(self, policy: str, params: dict[str, Any] | None = None) -> JSONObject:
        """``PUT /v1/eviction/policy``: hot-swap the policy; ``{"old", "new", "swap_time_s", "entries"}``."""
        body = {"policy": policy, "params": params or {}}
        return self._request("PUT", "/v1/eviction/policy", json_body=body, timeout=SWAP_TIMEOUT_S)

    def token_eviction(self) -> JSONObject:
        """``GET /v1/eviction/token``: the token-level policy, its settings and totals."""
        return self._request("GET", "/v1/eviction/token")

    def set_token_policy(self, policy: str) -> JSONObject:
        """``PUT /v1/eviction/token``: hot-swap the token-level policy; ``{"old", "new", ...}``."""
        body = {"policy": policy}
        return self._request("PUT", "/v1/eviction/token", json_body=body, timeout=SWAP_TIMEOUT_S)

    def eviction_logs(self, tail: int) -> list[JSONObject]:
        """``GET /v1/eviction/logs?tail=N``: the last `tail` events, oldest first."""
        answer = self._request("GET", "/v1/eviction/logs", params={"tail": tail})
        events = answer.get("events")
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise EngineProtocolError("GET /v1/eviction/logs: 'events' is not a list of objects")
        return events

    def follow_eviction_logs(self, tail: int) -> Iterator[JSONObject]:
        """``GET /v1/eviction/logs?tail=N&follow=true``: the last `tail` events, then new ones as
        they happen (NDJSON), until the engine stops or the caller stops iterating."""
        params: dict[str, str | int] = {"tail": tail, "follow": "true"}
        for line in self._stream_lines("GET", "/v1/eviction/logs", params=params, read_timeout=None):
            if line.strip():
                yield self._decode_event(line)

    def cache_tree(self, depth: int = 8, max_nodes: int = 200) -> JSONObject:
        """``GET /v1/cache/tree``: the radix prefix tree, cut to `depth` and `max_nodes`."""
        return self._request("GET", "/v1/cache/tree", params={"depth": depth, "max_nodes": max_nodes})

    def cache_usage(self) -> JSONObject:
        """``GET /v1/cache/usage``: pool use by tenant and class, queue and batch limit."""
        return self._request("GET", "/v1/cache/usage")

    def cache_request(self, request_id: str) -> JSONObject:
        """``GET /v1/cache/requests/{id}``: a recent request's cache receipt, and why it missed
        each block it missed (an `EngineError` of status 404 when unknown or past the engine's window)."""
        return self._request("GET", f"/v1/cache/requests/{quote(request_id, safe='')}")

    def reset_cache(self) -> JSONObject:
        """``POST /v1/cache/reset``: drop every unreferenced cached block and the eviction history."""
        return self._request("POST", "/v1/cache/reset")

    # -- per-salt quotas (``/v1/cache/quotas``) ---------------------------------------------------

    def set_quota(self, salt: str, device_blocks: int | None, host_blocks: int | None) -> JSONObject:
        """``PUT /v1/cache/quotas/{salt}``: set (or replace) a salt's quota (None: uncapped)."""
        body = {"device_blocks": device_blocks, "host_blocks": host_blocks}
        return self._request("PUT", _quota_path(salt), json_body=body)

    def quota(self, salt: str) -> JSONObject:
        """``GET /v1/cache/quotas/{salt}``: the quota and its use now (a 404 `EngineError`: none)."""
        return self._request("GET", _quota_path(salt))

    def quotas(self) -> JSONObject:
        """``GET /v1/cache/quotas``: ``{"quotas": [...], "max_salts"}``."""
        return self._request("GET", "/v1/cache/quotas")

    def delete_quota(self, salt: str) -> JSONObject:
        """``DELETE /v1/cache/quotas/{salt}``: ``{"salt", "deleted": true}`` (a 404: none)."""
        return self._request("DELETE", _quota_path(salt))

    # -- typed records (sage_cli.records) -------------------------------------------------------

    def stats(self) -> EvictionStats:
        """The cache's figures as a record (``eviction_stats`` parsed)."""
        return self._record(EvictionStats, self.eviction_stats())

    def info(self) -> EngineInfo:
        """The engine as a record (``engine`` parsed)."""
        return self._record(EngineInfo, self.engine())

    def policies(self) -> Policies:
        """The active policy and the registry's policies (``eviction_policies`` parsed)."""
        return self._record(Policies, self.eviction_policies())

    def swap_policy(self, policy: str, params: dict[str, Any] | None = None) -> PolicySwap:
        """Hot-swap the policy (``set_policy``); the swap as a record."""
        return self._record(PolicySwap, self.set_policy(policy, params))

    def usage(self) -> CacheUsage:
        """The pool's use (``cache_usage`` parsed)."""
        return self._record(CacheUsage, self.cache_usage())

    def token_policy(self) -> TokenEviction:
        """The token-level policy (``token_eviction`` parsed)."""
        return self._record(TokenEviction, self.token_eviction())

    @staticmethod
    def _record(kind: type[R], answer: JSONObject) -> R:
        try:
            return kind.from_json(answer)
        except (RecordError, TypeError) as exc:
            raise EngineProtocolError(str(exc)) from None

    def complete(self, body: dict[str, Any], *, timeout: float | None = None) -> JSONObject:
        """``POST /v1/completions`` without streaming: the whole answer."""
        return self._request("POST", "/v1/completions", json_body=body, timeout=timeout)

    def embeddings(self, body: dict[str, Any], *, timeout: float | None = None) -> JSONObject:
        """``POST /v1/embeddings``: one vector per input (a 429 is colocation's rejection)."""
        return self._request("POST", "/v1/embeddings", json_body=body, timeout=timeout)

    def stream_completion(
        self, body: dict[str, Any], *, timeout: float | None = None
    ) -> Iterator[JSONObject]:
        """``POST /v1/completions`` with ``"stream": true``: each server-sent event's object, until
        ``[DONE]`` (read by `sage_cli.sse`, the one reader of event streams).

        Raises:
            EngineError: The engine refused the request (4xx/5xx) or sent an error event.
        """
        body = {**body, "stream": True}
        lines = self._stream_lines("POST", "/v1/completions", json_body=body, read_timeout=timeout)
        try:
            yield from json_chunks(lines)
        except StreamErrorEvent as exc:
            raise EngineError(500, exc.error_type, exc.message) from None
        except StreamDecodeError as exc:
            raise EngineProtocolError(f"completion stream: {exc}") from None

    def _stream_lines(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str | int] | None = None,
        json_body: dict[str, Any] | None = None,
        read_timeout: float | None,
    ) -> Iterator[str]:
        """The lines of a streamed answer; an error answer raises as `_request`'s do."""
        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        try:
            with self._http().stream(method, path, params=params, json=json_body, timeout=timeout) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    self._decode(answer, f"{method} {path}")
                yield from answer.iter_lines()
        except httpx.TransportError as exc:
            raise self._translate(exc) from exc

    def shutdown(self) -> JSONObject:
        """``POST /v1/engine/shutdown``: ask the engine to drain and exit; ``{"status": "draining"}``.

        An engine that closes the connection before answering has taken the request too.
        """
        try:
            return self._request("POST", "/v1/engine/shutdown")
        except EngineConnectionError as exc:
            if isinstance(exc.__cause__, httpx.RemoteProtocolError | httpx.ReadError):
                return {"status": "draining"}
            raise

    # -- the boundary ---------------------------------------------------------------------------

    @property
    def address(self) -> Path | str:
        """Where the engine is: the URL of a TCP engine, else the socket (for messages)."""
        return self.url or self.socket

    def _http(self) -> httpx.Client:
        if self._http_client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
            if self.url is not None and self._transport is None:
                verify: Any = True
                if self._ca_file is not None:
                    import ssl

                    verify = ssl.create_default_context(cafile=self._ca_file)
                self._http_client = httpx.Client(
                    base_url=self.url, timeout=self.timeout, headers=headers, verify=verify
                )
                return self._http_client
            transport = self._transport
            if transport is None:
                self._check_socket()
                # Plain HTTP on a local socket: no TLS, so skip loading the CA bundle (0.1 s).
                transport = httpx.HTTPTransport(uds=str(self.socket), verify=False)
            self._http_client = httpx.Client(
                transport=transport, base_url="http://sage", timeout=self.timeout, headers=headers
            )
        return self._http_client

    def _check_socket(self) -> None:
        try:
            mode = self.socket.stat().st_mode
        except FileNotFoundError:
            raise EngineNotRunning(self.socket, start_hint=self.start_hint) from None
        except OSError as exc:
            raise EngineConnectionError(
                f"cannot reach {self.socket}: {exc.strerror or exc}", self.socket
            ) from None
        if not stat.S_ISSOCK(mode):
            raise EngineConnectionError(f"{self.socket} is not a socket", self.socket)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str | int] | None = None,
        json_body: JSONObject | None = None,
        timeout: float | None = None,
    ) -> JSONObject:
        try:
            answer = self._http().request(
                method,
                path,
                params=params,
                json=json_body,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except httpx.TransportError as exc:
            raise self._translate(exc) from exc
        return self._decode(answer, f"{method} {path}")

    def _translate(self, exc: httpx.TransportError) -> SageClientError:
        sock = self.address
        if isinstance(exc, httpx.TimeoutException):
            return EngineTimeout(f"the engine on {sock} did not answer within {self.timeout:g} s")
        if isinstance(exc, httpx.ConnectError):
            os_error = _os_error_in_chain(exc)
            code = os_error.errno if os_error is not None else None
            if code == errno.ENOENT:
                return EngineNotRunning(sock, start_hint=self.start_hint)
            if code == errno.ECONNREFUSED:
                return EngineNotRunning(sock, stale=self.url is None, start_hint=self.start_hint)
            if code in (errno.EACCES, errno.EPERM):
                return EngineConnectionError(
                    f"permission denied on {sock}: the engine belongs to another user", sock
                )
            reason = (os_error.strerror if os_error is not None else None) or str(exc) or type(exc).__name__
            return EngineConnectionError(f"cannot connect to the engine on {sock}: {reason}", sock)
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return EngineConnectionError(
                f"the engine on {sock} closed the connection: {exc or type(exc).__name__}", sock
            )
        return EngineConnectionError(f"talking to the engine on {sock} failed: {exc!r}", sock)

    @staticmethod
    def _decode(answer: httpx.Response, what: str) -> JSONObject:
        try:
            body: Any = answer.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if answer.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return_type = error.get("type")
                raise EngineError(
                    answer.status_code,
                    return_type if isinstance(return_type, str) else "error",
                    error["message"],
                )
            text = " ".join(answer.text.split())[:200] or answer.reason_phrase
            raise EngineError(answer.status_code, "http_error", f"{what}: HTTP {answer.status_code}: {text}")
        if not isinstance(body, dict):
            raise EngineProtocolError(f"{what}: the engine's answer is not a JSON object")
        return body

    @staticmethod
    def _decode_event(line: str) -> JSONObject:
        try:
            event: Any = json.loads(line)
        except json.JSONDecodeError:
            raise EngineProtocolError(f"eviction log stream: not JSON: {line[:120]!r}") from None
        if not isinstance(event, dict):
            raise EngineProtocolError(f"eviction log stream: not a JSON object: {line[:120]!r}")
        return event


def _quota_path(salt: str) -> str:
    """The path of a salt's quota, the salt percent-encoded (a salt may hold ``/`` or ``?``)."""
    return "/v1/cache/quotas/" + quote(salt, safe="")
