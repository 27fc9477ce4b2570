"""The HTTP layer's limits: what uvicorn does not bound by itself (docs/architecture.md, "Control API").

uvicorn closes idle keep-alive connections, but a client that sends half its headers, or its
headers and then a trickle of body, holds a connection (and a file descriptor) for ever; a few
hundred such clients starve everyone else. And its answer to a malformed request (a
``Content-Length: abc``) is plain text, where every other error of the API is JSON. The protocol
class here, a small subclass of uvicorn's h11 protocol, adds:

- a deadline for the headers (from the connection, or from the previous answer on a keep-alive
  connection) and one for the body once the headers are in: past it a JSON 408, then close;
- a cap on open connections: one over it gets a JSON 503 at once and is closed;
- JSON for the 400 that uvicorn sends on a request h11 cannot parse.

The body size limit sits in `engine_adapter.serving.requests.json_body`, which reads the body
as a stream and stops at the limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine_adapter.serving.requests import error_json

if TYPE_CHECKING:
    from engine_adapter.serving.config import EngineConfig

__all__ = ["HttpLimits", "LimitedH11Protocol", "limited_protocol", "raise_open_file_limit"]

log = structlog.get_logger("sage.server")

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The per-engine limits of its HTTP server: the `EngineConfig` keys of the same names, where
    their defaults live."""

    max_body_bytes: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    max_connections: int

    @classmethod
    def from_config(cls, config: EngineConfig) -> HttpLimits:
        return cls(
            max_body_bytes=config.max_body_bytes,
            header_timeout=config.header_timeout,
            body_timeout=config.body_timeout,
            keep_alive_timeout=config.keep_alive_timeout,
            max_connections=config.max_connections,
        )


def _raw_error(status: int, type_: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer with the API's JSON body, closing the connection.

    Written as bytes because h11 cannot send an answer to a request it has not seen whole.
    """
    body = error_json(type_, message)
    head = (
        f"HTTP/1.1 {status} {_REASONS[status].decode()}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body deadlines, a connection cap and JSON errors;
    `limited_protocol` gives it its `limits`."""

    limits: HttpLimits
    _deadline: asyncio.TimerHandle | None = None
    _phase = "headers"
    _over_cap = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Over the cap, the 503 goes out once the client's first bytes are read: closing
        # with its request unread would reset the connection and lose the answer.
        self._over_cap = len(self.connections) > self.limits.max_connections
        self._arm("headers", self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            if not self.transport.is_closing():
                log.warning("connection refused: too many open", limit=self.limits.max_connections)
                self._disarm()
                self._close_with(503, "unavailable", f"over {self.limits.max_connections} open connections")
            return
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm("headers", self.limits.header_timeout)  # for the next request on this connection

    def send_400_response(self, msg: str) -> None:
        # h11 refused the request (bad request line, header, Content-Length...): the API's
        # JSON error instead of uvicorn's plain text.
        log.info("malformed HTTP request")
        self._disarm()
        self._write_and_close(
            _raw_error(400, "invalid_request", "malformed HTTP request: bad request line or headers")
        )

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            self._close_with(
                408, "timeout", f"no complete request headers within {self.limits.header_timeout:g} s"
            )
        elif state is h11.SEND_BODY:
            if self._phase == "headers":  # the headers came in time; now the body's deadline
                self._arm("body", self.limits.body_timeout)
            else:
                self._close_with(
                    408, "timeout", f"request body not received within {self.limits.body_timeout:g} s"
                )
        # Otherwise the request is in and being answered (a generation may take minutes).

    def _close_with(self, status: int, type_: str, message: str) -> None:
        log.info("connection closed", status=status, reason=message)
        self._write_and_close(_raw_error(status, type_, message))

    def _write_and_close(self, data: bytes) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's own answer, if any, goes nowhere
        self.transport.write(data)
        self.transport.close()


def limited_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with `limits` (pass it as ``uvicorn.Config(http=...)``)."""

    class WithLimits(LimitedH11Protocol):
        pass

    WithLimits.limits = limits
    return WithLimits


def raise_open_file_limit(wanted: int) -> None:
    """Raise this process's soft limit of open files towards `wanted` (never above the hard one).

    Each connection holds a descriptor; with the usual soft limit of 1024 a few hundred slow
    clients plus the model's files would leave none for the next request.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
