"""The engine's control server: a Starlette app over a Unix socket (docs/architecture.md, "Control API").

    GET  /health                   {"status", "name", "pid"}
    GET  /v1/engine                engine info, plus "socket" and "pid"
    GET  /v1/eviction/stats        eviction statistics (docs/architecture.md, "Metrics")
    GET  /v1/eviction/policies     the policies and their params, and the active one
    PUT  /v1/eviction/policy       hot swap: {"policy", "params"} -> {"old", "new", "swap_time_s", "entries"}
    GET  /v1/eviction/logs         ?tail=N (default 100) -> {"events"}; &follow=true streams NDJSON
    POST /v1/completions           OpenAI-compatible text completion; "stream": true sends SSE
                                   (sage extensions: priority, tenant, cache_salt, ignore_eos)
    POST /v1/chat/completions      OpenAI-compatible chat, rendered with the model's chat template
    GET  /v1/models                the served model
    POST /v1/cache/reset           drop every unreferenced cached block -> {"freed_blocks"}
    POST /v1/engine/shutdown       {"status": "draining"}, then a draining shutdown
    GET  /metrics                  Prometheus text
    GET  /openapi.json             the OpenAPI 3.1 document of all of this (docs/openapi.json)

The app itself (one handler per endpoint) is `engine_adapter.serving.app`, its request parsing
`engine_adapter.serving.requests`, its NDJSON and SSE streams `engine_adapter.serving.streams`;
this module is the process around it.

`serve(config)` is the engine process: it binds the socket itself (mode 0600 from the moment it
exists), writes ``<stem>.pid`` next to it, builds and starts the `Engine`, runs uvicorn on the
bound socket, and on SIGTERM, SIGINT or ``POST /v1/engine/shutdown`` drains the engine, stops
uvicorn, removes the socket and the pid file and returns 0. Run it as
``python -m engine_adapter.serving.server --config-json '{"name": "default", ...}'``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from engine_adapter.serving.app import build_app
from engine_adapter.serving.auth import ApiKeyGate
from engine_adapter.serving.http_limits import HttpLimits, limited_protocol, raise_open_file_limit

if TYPE_CHECKING:
    from engine_adapter.serving.config import EngineConfig
    from engine_adapter.serving.engine import Engine

__all__ = ["main", "serve"]

log = structlog.get_logger("sage.server")

# --------------------------------------------------------------------------------------------
# The process


class SocketInUseError(RuntimeError):
    """A live engine already answers on the socket."""


def _socket_is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # A timeout or EAGAIN means someone holds it (a full backlog): better not steal it.
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    else:
        return True
    finally:
        probe.close()


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 from its creation.

    A stale socket file (nothing accepts on it: a crashed engine) is replaced; a live one is
    never taken over.

    Raises:
        SocketInUseError: An engine answers on `path`.
        OSError: `path` exists and is not a socket, or it cannot be bound.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if len(os.fsencode(path)) >= 108:
        raise OSError(
            errno.ENAMETOOLONG, f"socket path is {len(os.fsencode(path))} bytes, the limit is 107", str(path)
        )
    with contextlib.suppress(FileNotFoundError):
        mode = path.lstat().st_mode
        if not stat.S_ISSOCK(mode):
            raise OSError(errno.EEXIST, "exists and is not a socket; not replacing it", str(path))
        if _socket_is_live(path):
            raise SocketInUseError(f"an engine is already serving on {path}")
        log.info("replacing stale socket", socket=str(path))
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600: never readable by others, not even briefly
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SocketInUseError(f"an engine is already serving on {path}") from None
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)  # listen at once, so that a second server probing the path sees it live
    return sock


def _remove_if_ours(path: Path, inode: int | None) -> None:
    """Remove `path` if it is still the file we created (a successor may have replaced it)."""
    with contextlib.suppress(FileNotFoundError):
        if inode is None or path.lstat().st_ino == inode:
            path.unlink()


def _uvicorn_server(config: Any, on_signal: Callable[[int], None]) -> Any:
    """A uvicorn Server whose SIGINT/SIGTERM call `on_signal` on the event loop.

    uvicorn's own handlers set `should_exit` at once (in-flight requests would then race the
    engine's drain) and re-raise the signal after `serve` returns (the process would die by it
    before removing its socket); ours drain first and let `serve` return normally.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            loop = asyncio.get_running_loop()

            def handler(sig: int, _frame: Any) -> None:
                loop.call_soon_threadsafe(on_signal, sig)

            original = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, previous in original.items():
                    signal.signal(sig, previous)

    return DrainingServer(config)


class _Stopper:
    """Drains the engine, then tells uvicorn to exit; a second signal aborts what is left."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.servers: list[Any] = []  # the socket's server first, then the TCP one if any
        self._lock = threading.Lock()
        self._draining = False

    def request(self, reason: str) -> None:
        with self._lock:
            if self._draining:
                return
            self._draining = True
        log.info("draining", reason=reason)
        threading.Thread(target=self._drain, name="sage-drain", daemon=True).start()

    def _drain(self) -> None:
        try:
            self.engine.shutdown(drain=True)
        except Exception as exc:
            log.error("engine shutdown failed", exc_info=exc)
        finally:
            for server in self.servers:
                server.should_exit = True

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self._draining:
            self.request(name)
            return
        log.warning("second signal: aborting the requests in flight", signal=name)
        threading.Thread(
            target=lambda: self.engine.shutdown(drain=False, timeout=5.0), name="sage-abort", daemon=True
        ).start()
        for server in self.servers:
            server.should_exit = True
            server.force_exit = True


class _StartupInterrupted(Exception):
    """SIGTERM while the model loads (before uvicorn's handlers are in place)."""


def _interrupt_startup(sig: int, _frame: Any) -> None:
    raise _StartupInterrupted(signal.Signals(sig).name)


def _configure_logging(level: str) -> None:
    import logging

    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)


def serve(config: EngineConfig, *, log_level: str | None = None) -> int:
    """Run the engine described by `config` behind the control API until it is told to stop.

    Logs go to stderr through structlog: a startup line (socket, model, policy) at info, one
    line per request at debug. `log_level` defaults to ``$SAGE_LOG_LEVEL``, else info.

    Returns:
        0 after a clean (drained) shutdown; 1 when the socket is held by a live engine or
        cannot be bound, or the engine fails to start.
    """
    _configure_logging(log_level or os.environ.get("SAGE_LOG_LEVEL", "info"))
    socket_path = config.socket_path  # EngineConfig fills $SAGE_HOME/run/<name>.sock when unset
    pid_path = config.pid_path
    try:
        sock = bind_unix_socket(socket_path)
    except SocketInUseError as exc:
        print(
            f"sage engine: {exc} (pid file {pid_path}); stop it first or pick another --name/--socket",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"sage engine: cannot bind {socket_path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    socket_inode = socket_path.lstat().st_ino
    pid_inode: int | None = None
    engine: Engine | None = None
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    tcp_sock: socket.socket | None = None
    try:
        pid_inode = _write_pid_file(pid_path)
        opened = _open_tcp(config)
        if isinstance(opened, int):
            return opened
        tcp_sock = opened
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _interrupt_startup)
        started = _start_engine(config)
        if isinstance(started, int):
            return started
        engine = started
        _serve_until_stopped(engine, sock, socket_path, tcp_sock)
        return 0
    finally:
        if tcp_sock is not None:
            tcp_sock.close()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_sigterm)
        if engine is not None and not engine.stopped:
            with contextlib.suppress(Exception):
                engine.shutdown(drain=False, timeout=5.0)
        sock.close()
        _remove_if_ours(socket_path, socket_inode)
        _remove_if_ours(pid_path, pid_inode)


def _open_tcp(config: EngineConfig) -> socket.socket | int | None:
    """The bound TCP listener when the config asks for one (None when not), or the exit code 1
    when the address cannot be bound or the TLS files cannot be loaded (the error is printed)."""
    if not config.serves_tcp or config.port is None:
        return None
    where = f"{config.host}:{config.port}"
    if config.ssl_certfile:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                config.ssl_certfile, config.ssl_keyfile
            )
        except (OSError, ssl.SSLError) as exc:
            print(f"sage engine: cannot load the TLS certificate and key: {exc}", file=sys.stderr)
            return 1
    try:
        return bind_tcp_socket(config.host, config.port)
    except OSError as exc:
        print(f"sage engine: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _write_pid_file(pid_path: Path) -> int:
    """Write our pid atomically next to the socket; returns the file's inode (to remove only ours)."""
    tmp = pid_path.with_name(f".{pid_path.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n", encoding="utf-8")
    os.replace(tmp, pid_path)
    return pid_path.lstat().st_ino


def _start_engine(config: EngineConfig) -> Engine | int:
    """The started engine, or the exit code: 0 when a signal stopped it while starting, 1 when
    it failed (the error is logged and printed)."""
    from engine_adapter.serving.engine import Engine

    try:
        engine = Engine(config)
        engine.start()
    except _StartupInterrupted as exc:
        log.info("stopped while starting", signal=str(exc))
        return 0
    except Exception as exc:
        log.error("engine failed to start", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        # One line (a message may have several): `sage llm engine start --detach` shows the log's last.
        one_line = " ".join(str(exc).split())
        print(f"sage engine: failed to start: {type(exc).__name__}: {one_line}", file=sys.stderr)
        return 1
    return engine


def bind_tcp_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (IPv4 or IPv6), bound before the model loads.

    Raises:
        OSError: The address is taken or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128)
    sock.set_inheritable(False)
    return sock


def _uvicorn_config(app: Any, limits: HttpLimits, **extra: Any) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        http=limited_protocol(limits),
        timeout_graceful_shutdown=30,  # after the drain: time for the answers to be written
        timeout_keep_alive=int(max(1, round(limits.keep_alive_timeout))),
        **extra,
    )


def _tcp_server(config: EngineConfig, app: Any, limits: HttpLimits) -> Any:
    """The uvicorn server of the TCP listener: the same app behind the API key, TLS when asked."""
    import uvicorn

    class TcpServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the socket's server handles the signals for both

    gated = ApiKeyGate(app, config.api_key) if config.api_key else app
    tls = (
        {"ssl_certfile": config.ssl_certfile, "ssl_keyfile": config.ssl_keyfile}
        if config.ssl_certfile
        else {}
    )
    return TcpServer(_uvicorn_config(gated, limits, **tls))


def _serve_until_stopped(
    engine: Engine, sock: socket.socket, socket_path: Path, tcp_sock: socket.socket | None = None
) -> None:
    """Run uvicorn on the bound socket (and TCP listener) until a signal or the API stops it, then drain."""
    config = engine.config
    limits = HttpLimits.from_config(config)
    raise_open_file_limit(limits.max_connections * (2 if tcp_sock is not None else 1) + 256)
    stopper = _Stopper(engine)
    app = build_app(engine, socket_path=socket_path, request_shutdown=lambda: stopper.request("api"))
    stopper.servers.append(_uvicorn_server(_uvicorn_config(app, limits), stopper.on_signal))
    listeners = [(stopper.servers[0], sock)]
    if tcp_sock is not None:
        stopper.servers.append(_tcp_server(config, app, limits))
        listeners.append((stopper.servers[1], tcp_sock))
    info = engine.info()
    log.info(
        "engine serving",
        socket=str(socket_path),
        tcp=f"{config.host}:{config.port}{' (TLS)' if config.ssl_certfile else ''}" if tcp_sock else None,
        pid=os.getpid(),
        name=engine.name,
        model=info.get("model"),
        policy=(info.get("policy") or {}).get("name"),
        device=info.get("device"),
        num_blocks=info.get("num_blocks"),
    )

    async def serve_all() -> None:
        await asyncio.gather(*(server.serve(sockets=[listener]) for server, listener in listeners))

    # _StartupInterrupted: a SIGTERM in the instant before uvicorn took the signals over.
    with contextlib.suppress(_StartupInterrupted):
        asyncio.run(serve_all())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already stopping; the cleanup is short
    if not engine.stopped:  # uvicorn stopped on its own: still drain what is running
        engine.shutdown(drain=True)
    log.info("engine stopped", socket=str(socket_path))


def main(argv: list[str] | None = None) -> int:
    """``python -m engine_adapter.serving.server --config-json '<json>'``: build the config and `serve`."""
    parser = argparse.ArgumentParser(
        prog="python -m engine_adapter.serving.server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config-json", required=True, help="the EngineConfig as a JSON object")
    parser.add_argument("--log-level", default=os.environ.get("SAGE_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.config_json)
    except json.JSONDecodeError as exc:
        print(f"sage engine: --config-json is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(raw, dict):
        print("sage engine: --config-json must be a JSON object", file=sys.stderr)
        return 2
    from engine_adapter.serving.config import EngineConfig, env_var

    # The API key never travels on the command line (other users can read it there): it comes
    # from the environment the CLI started us with.
    api_key = os.environ.get(env_var("api_key"), "")
    if api_key and "api_key" not in raw:
        raw["api_key"] = api_key
    try:
        config = EngineConfig.from_dict(raw, source="--config-json")
    except (TypeError, ValueError) as exc:
        print(f"sage engine: invalid config: {exc}", file=sys.stderr)
        return 2
    return serve(config, log_level=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
