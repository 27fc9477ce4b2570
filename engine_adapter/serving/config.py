"""The engine's configuration: one dataclass, from flags, the environment, a YAML file, defaults.

Pure Python (no torch): ``sage llm engine start`` builds an `EngineConfig` and hands it to
``engine_adapter.serving.server.serve(config)``, or as JSON to ``python -m engine_adapter.serving.server
--config-json '...'``.

Precedence, first wins::

    flags of `sage llm engine start`  >  SAGE_<KEY> environment variables
        >  the YAML file (--config FILE or $SAGE_CONFIG)  >  the defaults below

Every key is also an environment variable: ``eviction_policy`` is ``SAGE_EVICTION_POLICY``,
``policy_params`` is ``SAGE_POLICY_PARAMS="k=v,k=v"``, booleans take true/false/1/0/yes/no/on/off,
sizes take ``2GiB``. YAML keys may be written ``eviction_policy`` or ``eviction-policy``.

Two groups are chosen as a whole, from the highest source that sets any of their keys:
the pool size (``num_blocks`` | ``kv_cache_memory`` | ``gpu_memory_utilization``, at most one
per source; none means the engine sizes the pool itself), and the policy (``policy_params``
of sources below the one that picked ``eviction_policy`` are dropped: they were meant for
another policy). When only ``socket`` is set, ``name`` is the socket's stem.

Paths (`engine_adapter.paths`): ``$SAGE_HOME`` (default ``~/.sage``), the socket
``$SAGE_HOME/run/<name>.sock``, the logs ``$SAGE_HOME/logs/<name>/`` (``evictions.jsonl``,
``engine.log``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_adapter import paths
from engine_adapter.cache.sizes import parse_bytes
from engine_adapter.paths import DEFAULT_NAME, default_log_dir, default_socket, is_engine_name, sage_home
from engine_adapter.safe_yaml import shorten

if TYPE_CHECKING:
    from engine_adapter.colocation import ColocationParams

__all__ = [
    "CONFIG_ENV",
    "ENGINE_KINDS",
    "ENV_PREFIX",
    "SIZING_KEYS",
    "ConfigError",
    "EngineConfig",
    "colocation_params",
    "colocation_switches",
    "config_keys",
    "default_log_dir",
    "default_socket",
    "env_var",
    "load_env",
    "load_yaml",
    "parse_layer",
    "resolve_config",
    "sage_home",
]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
ENV_PREFIX = "SAGE_"
CONFIG_ENV = "SAGE_CONFIG"
ENGINE_KINDS = ("llm",)
SIZING_KEYS = ("num_blocks", "kv_cache_memory", "gpu_memory_utilization")
# sun_path holds 108 bytes on Linux and 104 on the BSDs and macOS, the final NUL included.
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103

_DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


class ConfigError(ValueError):
    """A config value, key or file that cannot be used; the message names it and its source."""


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``sage llm engine start`` decides; the keys are its flags in snake_case.

    Attributes:
        model: ``sage-tiny`` (built in, no download), or a local Hugging Face folder.
        engine_kind: ``llm``.
        eviction_policy: A registry name of `sage_eviction` (online policies only).
        policy_params: Params of the policy; values as given (the registry coerces strings).
        enable_lifetime_prediction: Feed predicted remaining lifetimes to the policy.
        log_evictions: Write eviction events to ``<log_dir>/evictions.jsonl``.
        explain_evictions: Each eviction event says why its victim went: its ranking values,
            the next candidates it was preferred to, the blocks skipped (O(n) per victim).
        num_blocks: Pool size in blocks.
        kv_cache_memory: Pool size in bytes (``"2GiB"`` accepted).
        gpu_memory_utilization: Pool size as the fraction of device memory, in (0, 1].
        block_size: Tokens per KV block.
        device: ``auto`` (cuda when present, else cpu), ``cpu``, ``cuda`` or ``cuda:N``.
        name: The engine's name; picks its socket and log folder.
        socket: The control socket; ``$SAGE_HOME/run/<name>.sock`` when empty.
        log_dir: The log folder; ``$SAGE_HOME/logs/<name>`` when empty.
        max_queued_requests: Waiting requests beyond this drop the lowest priority; None: no cap.
        queued_timeout: Seconds a request may wait before it is aborted; None: no limit.
        eviction_threshold: Evict in the background down to this used fraction; None: only on demand.
        max_pinned_ratio: At most this fraction of the pool may be pinned.
        protect_queued: At most this fraction of the pool may be held protected from eviction
            for waiting requests' cached prefixes until they run; 0: no protection.
        max_num_seqs: Running sequences per step.
        max_num_batched_tokens: Tokens per step (prefill chunks and decodes).
        adaptive_batch: Halve the running batch when the re-prefill rate over a window passes
            0.3, grow it back to `max_num_seqs` when evictions are rare (the module spec's
            SchedulerOptimizer; engine_adapter.cache.adaptive_batch).
        token_eviction: Token-level policy (spec 002, engine_adapter.token_eviction): none,
            sliding, snapkv, h2o or tova; compresses running sequences under memory pressure.
        eviction_window: Tokens the sliding policy keeps after its sinks (the spec's 1024).
        memory_threshold: Compress when less than this many MB are available (the least of the
            pool's free and reclaimable blocks and the device's memory; the spec's 256).
        token_target_ratio: Fraction of its tokens a sequence keeps when pressure compresses it.
        seed: Seed of sampling for requests that give none (sampled requests are then reproducible).
        max_body_bytes: Largest request body (``"16MiB"`` accepted); beyond it a 413.
        header_timeout: Seconds a client has to send a request's headers (from its connection
            or its previous answer); then a 408 and the connection is closed.
        body_timeout: Seconds a client has to send the body once the headers are in; then a 408.
        keep_alive_timeout: Seconds an idle keep-alive connection stays open.
        max_connections: Open connections beyond this get a 503 at once and are closed.
        host: Also serve the API over TCP on this address (the socket stays); empty: no TCP.
        port: The TCP port; with `host`.
        api_key: The key every TCP request must send as ``Authorization: Bearer KEY`` (all
            but ``/health``); never written by `to_dict` (pass it as ``$SAGE_API_KEY``).
        ssl_certfile: PEM certificate: serve TCP over TLS (with `ssl_keyfile`).
        ssl_keyfile: PEM private key of `ssl_certfile`.
        insecure_no_api_key: Allow TCP without an API key (anyone who reaches the port may use it).
        slo_ttft_ms: Default time-to-first-token SLO of completions and chats (a request's
            ``slo_ttft_ms`` overrides it); it sets the deadline the ``slo`` policy sees.
        slo_tpot_ms: Default time-per-output-token SLO (a request's ``slo_tpot_ms`` overrides it).
        slo_deadline_ms: Default deadline of an embedding request (its ``slo_deadline_ms``).
        tenant_slos: Per-tenant defaults over the three above: ``{tenant: {ttft_ms, tpot_ms,
            deadline_ms}}`` (YAML), or ``"a:ttft_ms=500,tpot_ms=50;b:deadline_ms=200"``.
        embedding_chunk_tokens: Tokens of embedding work one engine step takes beside the LLM's
            decodes (chunks, as chunked prefill, so embedding batches never stall a decode step).
        colocation: ``off`` (default: the engine behaves as without embeddings' coordination),
            ``dynamic`` (spec 004: admission control, SLO-driven quotas, SLO-aware preemption) or
            ``static:F`` (the same with a fixed LLM share F of the pool).
        colocation_params: The colocation constants (``ColocationParams`` fields, k=v).
    """

    model: str = "sage-tiny"
    engine_kind: str = "llm"
    eviction_policy: str = "lru"
    policy_params: dict[str, Any] = field(default_factory=dict)
    enable_lifetime_prediction: bool = False
    log_evictions: bool = False
    explain_evictions: bool = False
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int = 16
    device: str = "auto"
    name: str = DEFAULT_NAME
    socket: str = ""
    log_dir: str = ""
    max_queued_requests: int | None = None
    queued_timeout: float | None = None
    eviction_threshold: float | None = None
    max_pinned_ratio: float = 0.5
    protect_queued: float = 0.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    adaptive_batch: bool = False
    token_eviction: str = "none"
    eviction_window: int = 1024
    memory_threshold: int = 256
    token_target_ratio: float = 0.5
    seed: int = 0
    # HTTP limits (docs/architecture.md, "Control API"): defaults fit a local engine.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 512
    # TCP for remote clients, beside the socket.
    host: str = ""
    port: int | None = None
    api_key: str = field(default="", repr=False)
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    insecure_no_api_key: bool = False
    # SLOs (spec 004) and LLM + embedding colocation.
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 200.0
    slo_deadline_ms: float = 2000.0
    tenant_slos: dict[str, dict[str, float]] = field(default_factory=dict)
    embedding_chunk_tokens: int = 128
    colocation: str = "off"
    colocation_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Check every value (a config built in code gets the same checks as one from a file),
        # then fill the paths that default from the name.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            object.__setattr__(self, f.name, _CONVERTERS[f.name](value, f.name))
        sizing = [k for k in SIZING_KEYS if getattr(self, k) is not None]
        if len(sizing) > 1:
            raise ConfigError(f"{' and '.join(sizing)} are exclusive: size the pool one way")
        if not self.socket:
            object.__setattr__(self, "socket", str(default_socket(self.name)))
        if not self.log_dir:
            object.__setattr__(self, "log_dir", str(default_log_dir(self.name)))
        length = len(os.fsencode(self.socket))
        if length > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket path {shorten(self.socket)} is {length} bytes; a Unix socket path holds at most "
                f"{MAX_SOCKET_PATH}: pass a shorter --socket or set a shorter SAGE_HOME"
            )
        self._check_tcp()
        try:
            colocation_params(self.colocation_params)
            colocation_switches(self.colocation_params)
        except ValueError as exc:
            raise ConfigError(f"colocation_params: {exc}") from None

    def _check_tcp(self) -> None:
        """TCP needs a host and a port together, an API key unless waived, and TLS files in pairs."""
        if bool(self.host) != (self.port is not None):
            raise ConfigError("host and port go together: give both to serve over TCP, or neither")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ConfigError("ssl_certfile and ssl_keyfile go together: give both for TLS")
        if self.ssl_certfile and not self.host:
            raise ConfigError("ssl_certfile is for TCP: give host and port too")
        if self.host and not self.api_key and not self.insecure_no_api_key:
            raise ConfigError(
                "refusing to listen on TCP without an API key: give --api-key (or $SAGE_API_KEY), "
                "or say --insecure-no-api-key"
            )

    @property
    def serves_tcp(self) -> bool:
        return bool(self.host)

    # -- paths ------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        return Path(self.socket)

    @property
    def pid_path(self) -> Path:
        """``<name>.pid`` next to the socket (the stem of the socket's file name)."""
        return paths.pid_path(self.socket_path)

    @property
    def eviction_log_path(self) -> Path:
        return paths.eviction_log_path(Path(self.log_dir))

    @property
    def engine_log_path(self) -> Path:
        return paths.engine_log_path(Path(self.log_dir))

    # -- serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every key but the API key (this goes on command lines and in logs)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "api_key"}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> EngineConfig:
        """A config from a complete or partial mapping of keys; unknown keys are errors.

        Raises:
            ConfigError: An unknown key or a bad value; the message names it and `source`.
        """
        return cls(**parse_layer(values, source=source))

    @classmethod
    def from_json(cls, text: str) -> EngineConfig:
        """The inverse of `to_json` (``python -m engine_adapter.serving.server --config-json``)."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ConfigError("--config-json is not a JSON object")
        return cls.from_dict(values, source="--config-json")

    # -- checks that need the policy library ----------------------------------------------------

    def slos_for(self, tenant: str | None) -> dict[str, float]:
        """The SLO defaults of `tenant`: its ``tenant_slos`` entry over the engine's defaults."""
        slos = {"ttft_ms": self.slo_ttft_ms, "tpot_ms": self.slo_tpot_ms, "deadline_ms": self.slo_deadline_ms}
        if tenant is not None:
            slos.update(self.tenant_slos.get(tenant, {}))
        return slos

    def check_policy(self) -> None:
        """Check the policy name and params against `sage_eviction` (pure Python, no engine).

        Raises:
            sage_eviction.UnknownPolicyError: Unknown name; the message lists the policies.
            sage_eviction.PolicyParamError: Unknown or ill-typed param; lists the params.
            sage_eviction.OfflinePolicyError: An offline policy (it needs the future: simulation
                only); lists the online ones.
        """
        from sage_eviction import resolve_policy

        # The cache resolves the spec the same way with the pool's size, known only at start.
        resolve_policy(self.eviction_policy, self.num_blocks or 1, online=True, **self.policy_params)


def config_keys() -> list[str]:
    """The keys of `EngineConfig`, in order."""
    return [f.name for f in dataclasses.fields(EngineConfig)]


def env_var(key: str) -> str:
    """The environment variable of a config key: ``eviction_policy`` -> ``SAGE_EVICTION_POLICY``."""
    return ENV_PREFIX + key.upper()


# -- value converters: (value, where) -> value; strings (env, flags) and YAML types alike -------


def _fail(where: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{where}: {shorten(value)} is not {expected}")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, value, "a non-empty string")
    return value.strip()


def _model(value: Any, where: str) -> str:
    return _text(value, where)


def _engine_kind(value: Any, where: str) -> str:
    kind = _text(value, where).lower()
    if kind not in ENGINE_KINDS:
        raise ConfigError(
            f"{where}: engine kind {shorten(value)} is not supported; supported: {', '.join(ENGINE_KINDS)}"
        )
    return kind


def _policy(value: Any, where: str) -> str:
    return _text(value, where).lower()


def _token_policy(value: Any, where: str) -> str:
    from engine_adapter.token_eviction import TOKEN_POLICY_NAMES

    name = _text(value, where).lower()
    if name not in TOKEN_POLICY_NAMES:
        raise ConfigError(
            f"{where}: token eviction policy {shorten(value)} is not one of {', '.join(TOKEN_POLICY_NAMES)}"
        )
    return name


def _device(value: Any, where: str) -> str:
    device = _text(value, where).lower()
    if not _DEVICE.match(device):
        raise _fail(where, value, "a device: auto, cpu, cuda or cuda:N")
    return device


def _name(value: Any, where: str) -> str:
    name = _text(value, where)
    if not is_engine_name(name):
        raise _fail(where, value, "an engine name: up to 64 letters, digits, '.', '_' or '-'")
    return name


def _path(value: Any, where: str) -> str:
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        raise _fail(where, value, "a path")
    if not value:
        return ""
    return os.path.abspath(os.path.expanduser(value))


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
    raise _fail(where, value, "a boolean (true/false, 1/0, yes/no, on/off)")


def _int(minimum: int) -> Callable[[Any, str], int]:
    def convert(value: Any, where: str) -> int:
        if isinstance(value, bool):
            raise _fail(where, value, "an integer")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise _fail(where, value, "an integer") from None
        if not isinstance(value, int):
            raise _fail(where, value, "an integer")
        if value < minimum:
            raise ConfigError(f"{where}: {value} is below the minimum {minimum}")
        return value

    return convert


def _float(low: float, high: float | None, *, low_open: bool) -> Callable[[Any, str], float]:
    def convert(value: Any, where: str) -> float:
        if isinstance(value, bool):
            raise _fail(where, value, "a number")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise _fail(where, value, "a number") from None
        if not isinstance(value, int | float) or value != value:
            raise _fail(where, value, "a number")
        x = float(value)
        below = x <= low if low_open else x < low
        if below or (high is not None and x > high):
            bracket = "(" if low_open else "["
            upper = f"{high:g}]" if high is not None else "inf)"
            raise ConfigError(f"{where}: {shorten(value)} is not in {bracket}{low:g}, {upper}")
        return x

    return convert


def _size(value: Any, where: str) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise _fail(where, value, "a whole number of bytes")
    try:
        size = parse_bytes(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if size <= 0:
        raise ConfigError(f"{where}: {shorten(value)} is not a positive size")
    return size


def _host(value: Any, where: str) -> str:
    if not isinstance(value, str) or any(c.isspace() or c in "/[]" for c in value.strip()):
        raise _fail(where, value, "a host name or IP address")
    return value.strip()


def _port(value: Any, where: str) -> int:
    port = _int(1)(value, where)
    if port > 65535:
        raise ConfigError(f"{where}: {port} is not a TCP port (1..65535)")
    return port


def _secret(value: Any, where: str) -> str:
    # Never echo the value: it is a credential.
    if not isinstance(value, str) or any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{where}: not a usable API key (printable, no spaces)")
    if value and len(value) < 16:
        raise ConfigError(f"{where}: an API key of {len(value)} characters is too short (16 at least)")
    return value


def _params(value: Any, where: str) -> dict[str, Any]:
    """A mapping (YAML, JSON), a list of ``k=v`` (repeated flags) or ``"k=v,k=v"`` (env)."""
    if isinstance(value, str):
        value = [item for item in (p.strip() for p in value.split(",")) if item]
    if isinstance(value, list | tuple):
        params: dict[str, Any] = {}
        for item in value:
            key, eq, raw = str(item).partition("=")
            if not eq or not key.strip():
                raise _fail(where, item, "of the form k=v")
            if key.strip() in params:
                raise ConfigError(f"{where}: param {shorten(key.strip())} is given twice")
            params[key.strip()] = raw.strip()
        return params
    if isinstance(value, Mapping):
        params = {}
        for key, raw in value.items():
            if not isinstance(key, str) or not key:
                raise _fail(where, key, "a param name")
            if raw is not None and not isinstance(raw, str | int | float | bool):
                raise _fail(f"{where}.{key}", raw, "a string, number or boolean")
            params[key] = raw
        return params
    raise _fail(where, value, "a mapping of params, or k=v items")


SLO_KEYS = ("ttft_ms", "tpot_ms", "deadline_ms")
_COLOCATION = re.compile(r"^(off|dynamic|static:(0(\.[0-9]+)?|1(\.0*)?|\.[0-9]+))$")


def _slo_ms(value: Any, where: str) -> float:
    ms = _float(0.0, 86_400_000.0, low_open=True)(value, where)
    return ms


def _tenant_slos(value: Any, where: str) -> dict[str, dict[str, float]]:
    """``{tenant: {ttft_ms, tpot_ms, deadline_ms}}``, or ``"a:ttft_ms=500,tpot_ms=50;b:..."``."""
    if isinstance(value, str):
        parsed: dict[str, Any] = {}
        for part in (p.strip() for p in value.split(";")):
            if not part:
                continue
            tenant, colon, rest = part.partition(":")
            if not colon or not tenant.strip():
                raise _fail(where, part, "of the form TENANT:ttft_ms=MS,tpot_ms=MS,deadline_ms=MS")
            parsed[tenant.strip()] = _params(rest, f"{where}.{tenant.strip()}")
        value = parsed
    if not isinstance(value, Mapping):
        raise _fail(where, value, "a mapping of tenants to their SLOs")
    out: dict[str, dict[str, float]] = {}
    for tenant, slos in value.items():
        if not isinstance(tenant, str) or not tenant:
            raise _fail(where, tenant, "a tenant name")
        if not isinstance(slos, Mapping):
            raise _fail(f"{where}.{tenant}", slos, "a mapping of ttft_ms, tpot_ms, deadline_ms")
        unknown = sorted(set(map(str, slos)) - set(SLO_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{tenant}: unknown SLO {unknown[0]!r}; known: {', '.join(SLO_KEYS)}")
        out[tenant] = {str(k): _slo_ms(v, f"{where}.{tenant}.{k}") for k, v in slos.items()}
    return out


SYSTEM_PARAM = "system"  # ``colocation_params: system=spec`` runs the spec's algorithms as written
# Engine switches beside the controller's constants: ``admission=false`` admits every request on
# arrival and sheds nothing; ``slo_preemption=false`` leaves preemption to the eviction policy.
# Both false with ``static:F`` is a plain static partition (the simulator's static baselines).
SWITCH_PARAMS = ("admission", "slo_preemption")


def colocation_switches(raw: Mapping[str, Any]) -> dict[str, bool]:
    """The engine switches of `SWITCH_PARAMS` in ``k=v`` config params (True when absent).

    Raises:
        ValueError: A value that is not a boolean.
    """
    switches = {}
    for name in SWITCH_PARAMS:
        try:
            switches[name] = _bool(raw.get(name, True), f"colocation param {name}")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return switches


def colocation_params(raw: Mapping[str, Any]) -> tuple[ColocationParams, str]:
    """`ColocationParams` and the system (``sage`` or ``spec``) from ``k=v`` config params
    (`SWITCH_PARAMS` are checked by `colocation_switches`).

    Values may be strings (flags, environment): each is converted to its field's type;
    ``priority_weights`` takes ``1/2/4``.

    Raises:
        ValueError: An unknown name (the message lists the known ones) or a bad value.
    """
    from engine_adapter.colocation import ColocationParams  # pure Python; only when asked

    known = ColocationParams.names()
    values: dict[str, Any] = {}
    system = "sage"
    defaults = ColocationParams()
    for name, value in raw.items():
        if name == SYSTEM_PARAM:
            system = str(value)
            if system not in ("sage", "spec"):
                raise ValueError(f"colocation param system={value!r}: must be sage or spec")
            continue
        if name in SWITCH_PARAMS:
            continue
        if name not in known:
            listed = ", ".join((*known, SYSTEM_PARAM, *SWITCH_PARAMS))
            raise ValueError(f"unknown colocation param {name!r}; known: {listed}")
        default = getattr(defaults, name)
        try:
            if isinstance(default, tuple):
                parts = value if isinstance(value, list | tuple) else str(value).replace("/", " ").split()
                values[name] = tuple(float(p) for p in parts)
            elif isinstance(default, int) and not isinstance(default, bool):
                values[name] = int(value)
            else:
                values[name] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"colocation param {name}={value!r}: not a {type(default).__name__}") from None
    return ColocationParams(**values), system


def _colocation(value: Any, where: str) -> str:
    mode = _text(value, where).lower()
    if (
        not _COLOCATION.match(mode)
        or mode in ("static:0", "static:1")
        or (mode.startswith("static:") and not 0.0 < float(mode.split(":", 1)[1]) < 1.0)
    ):
        raise _fail(where, value, "off, dynamic or static:F with F in (0, 1)")
    return mode


_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "model": _model,
    "engine_kind": _engine_kind,
    "eviction_policy": _policy,
    "policy_params": _params,
    "enable_lifetime_prediction": _bool,
    "log_evictions": _bool,
    "explain_evictions": _bool,
    "num_blocks": _int(1),
    "kv_cache_memory": _size,
    "gpu_memory_utilization": _float(0.0, 1.0, low_open=True),
    "block_size": _int(1),
    "device": _device,
    "name": _name,
    "socket": _path,
    "log_dir": _path,
    "max_queued_requests": _int(1),
    "queued_timeout": _float(0.0, None, low_open=True),
    "eviction_threshold": _float(0.0, 1.0, low_open=True),
    "max_pinned_ratio": _float(0.0, 1.0, low_open=False),
    "protect_queued": _float(0.0, 1.0, low_open=False),
    "max_num_seqs": _int(1),
    "max_num_batched_tokens": _int(1),
    "adaptive_batch": _bool,
    "token_eviction": _token_policy,
    "eviction_window": _int(1),
    "memory_threshold": _int(0),
    "token_target_ratio": _float(0.0, 0.99, low_open=True),
    "seed": _int(0),
    "max_body_bytes": _size,
    "header_timeout": _float(0.0, None, low_open=True),
    "body_timeout": _float(0.0, None, low_open=True),
    "keep_alive_timeout": _float(0.0, None, low_open=True),
    "max_connections": _int(1),
    "host": _host,
    "port": _port,
    "api_key": _secret,
    "ssl_certfile": _path,
    "ssl_keyfile": _path,
    "insecure_no_api_key": _bool,
    "slo_ttft_ms": _slo_ms,
    "slo_tpot_ms": _slo_ms,
    "slo_deadline_ms": _slo_ms,
    "tenant_slos": _tenant_slos,
    "embedding_chunk_tokens": _int(1),
    "colocation": _colocation,
    "colocation_params": _params,
}
assert set(_CONVERTERS) == {f.name for f in dataclasses.fields(EngineConfig)}, "a key without a converter"


# -- sources --------------------------------------------------------------------------------------


def parse_layer(
    values: Mapping[str, Any],
    *,
    source: str,
    key_label: Callable[[str], str] | None = None,
    base_dir: Path | None = None,
) -> dict[str, Any]:
    """Check and convert the keys one source sets; None values count as not set.

    Args:
        values: Keys (``snake_case`` or ``kebab-case``) to raw values.
        source: Where they come from, for messages: ``"config file x.yaml"``, ``"environment"``;
            empty for flags (their labels say it).
        key_label: How to name a key in messages (``--num-blocks``, ``SAGE_NUM_BLOCKS``).
        base_dir: Relative paths (``socket``, ``log_dir``) are relative to it (a config file's
            folder), else to the current directory.

    Raises:
        ConfigError: An unknown key (with the closest known one), a bad value, or more than one
            way to size the pool.
    """
    keys = config_keys()
    parsed: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key not in _CONVERTERS:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(keys)}"
            raise ConfigError(f"{source or 'config'}: unknown key {shorten(raw_key)}{hint}")
        if value is None:
            continue
        label = key_label(key) if key_label else key
        where = f"{source}: {label}" if source else label
        if key in ("socket", "log_dir") and base_dir is not None and isinstance(value, str | Path):
            value = str(base_dir / Path(value).expanduser()) if str(value) else ""
        parsed[key] = _CONVERTERS[key](value, where)
    sizing = [k for k in SIZING_KEYS if k in parsed]
    if len(sizing) > 1:
        labels = [key_label(k) if key_label else k for k in sizing]
        prefix = f"{source}: " if source else ""
        raise ConfigError(f"{prefix}{' and '.join(labels)} are exclusive: size the pool one way")
    return parsed


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The keys a YAML config file sets, checked and converted (a partial config).

    Raises:
        ConfigError: The file cannot be read or parsed, is not a mapping, has an unknown key
            (named) or a bad value (named with the key).
    """
    from engine_adapter.safe_yaml import YAMLInputError, load_yaml_file

    file = Path(path).expanduser()
    source = f"config file {path!s}"
    try:
        values = load_yaml_file(file)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read {source}: {reason}") from None
    except YAMLInputError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: the top level is not a mapping of keys")
    return parse_layer(values, source=source, base_dir=file.resolve().parent)


def load_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The keys set by ``SAGE_<KEY>`` variables, checked and converted (empty ones are unset)."""
    env = os.environ if environ is None else environ
    values = {key: env[env_var(key)] for key in config_keys() if env.get(env_var(key), "").strip()}
    return parse_layer(values, source="environment", key_label=env_var)


def _flag(key: str) -> str:
    """The flag of ``sage llm engine start`` that sets `key`."""
    if key in ("policy_params", "colocation_params"):
        return "--" + key.removesuffix("s").replace("_", "-")
    return "--" + key.replace("_", "-")


def resolve_config(
    flags: Mapping[str, Any] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> EngineConfig:
    """The config from flags > environment > file > `defaults` > the config's own defaults.

    Args:
        flags: The flags the user gave (None values count as not given), keyed like the config.
        config_file: The ``--config`` file; ``$SAGE_CONFIG`` when None.
        environ: The environment; ``os.environ`` when None.
        defaults: Defaults of the caller's own (the CLI serves the real model when installed).

    Raises:
        ConfigError: See `parse_layer` and `load_yaml`.
    """
    env = os.environ if environ is None else environ
    if config_file is None and env.get(CONFIG_ENV, "").strip():
        config_file = env[CONFIG_ENV]
    layers = [
        parse_layer(flags or {}, source="", key_label=_flag),
        load_env(env),
        load_yaml(config_file) if config_file is not None else {},
        parse_layer(defaults or {}, source="defaults", key_label=_flag),
    ]  # first wins
    merged: dict[str, Any] = {}
    for key in config_keys():
        if key in SIZING_KEYS or key == "policy_params":
            continue
        for layer in layers:
            if key in layer:
                merged[key] = layer[key]
                break
    # The pool size: all of it from the first source that sets any of it.
    for layer in layers:
        sizing = {k: layer[k] for k in SIZING_KEYS if k in layer}
        if sizing:
            merged.update(sizing)
            break
    # Policy params: from the source that picked the policy and the ones above it.
    picked = next((i for i, layer in enumerate(layers) if "eviction_policy" in layer), len(layers))
    params: dict[str, Any] = {}
    for layer in reversed(layers[: picked + 1]):
        params.update(layer.get("policy_params", {}))
    merged["policy_params"] = params
    if "socket" in merged and "name" not in merged:
        stem = Path(merged["socket"]).stem
        merged["name"] = stem if is_engine_name(stem) else DEFAULT_NAME
    return EngineConfig(**merged)
