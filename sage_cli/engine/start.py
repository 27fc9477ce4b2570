"""``sage llm engine start``: an engine in the foreground, or in the background with ``--detach``.

Its options are the config's keys, one declaration each in ``engine_adapter.serving.config``,
read here from the generated table `sage_cli.engine.start_options` (`config_flags` makes them
Typer options), and four of its own: ``--config``, ``--detach``, ``--timeout``, ``--json``. The
command loads `engine_adapter` (and through it torch) inside its function only. The server
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

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.engine.config_flags import config_values, parameter
from sage_cli.engine.start_options import START_OPTIONS
from sage_cli.errors import CLIError, CLIUsageError
from sage_cli.options import with_parameters
from sage_cli.output import Output

if TYPE_CHECKING:
    from engine_adapter.serving.config import EngineConfig
    from sage_cli.client import ControlClient

__all__ = ["START_PANELS", "start"]


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
        ConfigError: A bad or offline setting, or a CUDA device this torch cannot reach.
            PolicyConfigError: an unknown policy or param.
            Both exit as usage errors.
    """
    from engine_adapter.model.builtin import default_model_name
    from engine_adapter.serving.config import resolve_config
    from engine_adapter.serving.config.values import check_device

    config = resolve_config(flags, config_file=config_file, defaults={"model": default_model_name()})
    config.check_policy()
    check_device(config.device)
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


ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE.yaml",
        dir_okay=False,
        show_default=False,
        help="YAML file of settings (keys as these flags, snake_case); "
        "flags and SAGE_* variables override it.",
    ),
]
DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach", "-d", help="Run the engine in the background; print its socket once it answers."
    ),
]
StartTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.0,
        metavar="SECONDS",
        help="With --detach: how long to wait for the engine to answer.",
    ),
]
DetachJsonOpt = Annotated[
    bool,
    typer.Option("--json", help="With --detach: print the engine's name, pid, socket and log as JSON."),
]


def _panels(**titles: str) -> dict[str, str]:
    """Parameter name -> panel title, from each title's space-separated parameter names."""
    return {name: title for title, names in titles.items() for name in names.split()}


# The panels of `engine start --help` (sage_cli.help_panels), by parameter; tests/test_help_panels.py
# fails when an option is in none, so a new config key is placed here.
START_PANELS = _panels(
    **{
        "Starting": "name socket log_dir config_file detach timeout json_out",
        "Eviction policy": "eviction_policy policy_param enable_lifetime_prediction ghost_factor "
        "eviction_threshold max_pinned_ratio protect_queued preemption_order eviction_window "
        "memory_threshold",
        "Eviction log and explanations": "log_evictions explain lookup_log",
        "Prompt-cache contract (lifetimes, writes)": "max_cache_ttl max_retained_fraction "
        "cache_generated_tokens",
        "KV cache size": "num_blocks kv_cache_memory gpu_memory_utilization block_size",
        "KV tiers (host memory, disk)": "host_kv_cache host_eviction_policy host_policy_param "
        "host_write_policy disk_kv_cache disk_kv_size prefetch",
        "Model and device": "engine_kind device dtype kv_dtype quantization packed_weights batch_invariant "
        "compile threads cuda_graphs seed",
        "Scheduling and batching": "max_queued_requests queued_timeout max_num_seqs max_num_batched_tokens "
        "adaptive_batch colocation colocation_param embedding_chunk_tokens",
        "Token-level eviction": "token_eviction compress_on_evict",
        "Serving over TCP": "host port api_key ssl_certfile ssl_keyfile insecure_no_api_key",
        "KV cache events": "kv_events_endpoint kv_events_replay_endpoint",
    }
)


def _keyword(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


# The options of start alone, and where they sit among the config's in the help: the config file
# and --detach after --device, the wait and --json at the end.
_OWN_OPTIONS: dict[str | None, tuple[inspect.Parameter, ...]] = {
    "device": (_keyword("config_file", None, ConfigFileOpt), _keyword("detach", False, DetachOpt)),
    None: (_keyword("timeout", 120.0, StartTimeoutOpt), _keyword("json_out", False, DetachJsonOpt)),
}


def _parameters() -> list[inspect.Parameter]:
    """MODEL and one option per config key (`START_OPTIONS`), with the command's own between."""
    params: list[inspect.Parameter] = []
    for flag in START_OPTIONS:
        params.append(parameter(flag))
        params.extend(_OWN_OPTIONS.get(flag.key, ()))
    return [*params, *_OWN_OPTIONS[None]]


@with_parameters(_parameters())
def start(
    *, config_file: Path | None, detach: bool, timeout: float, json_out: bool, **config_options: Any
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
    config = _resolve_start_config(config_values(START_OPTIONS, config_options), config_file)
    _refuse_a_live_engine(config)
    if detach:
        _start_in_background(config, timeout, Output(json_out))
    else:
        _serve_in_foreground(config)
