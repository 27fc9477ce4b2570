"""Where a config comes from: flags, ``SAGE_<KEY>`` variables, a YAML file, defaults, layered.

Precedence, first wins::

    flags of `sage llm engine start`  >  SAGE_<KEY> environment variables
        >  the YAML file (--config FILE or $SAGE_CONFIG)  >  the defaults

Two groups are chosen as a whole, from the highest source that sets any of their keys: the pool
size (``num_blocks`` | ``kv_cache_memory`` | ``gpu_memory_utilization``, at most one per source;
none means the engine sizes the pool itself), and each policy (``policy_params`` of sources below
the one that picked ``eviction_policy`` are dropped: they were meant for another policy; the same
for ``host_policy_params`` and ``host_eviction_policy``). When
only ``socket`` is set, ``name`` is the socket's stem.

Imports: the standard library, `engine_adapter.paths`, `engine_adapter.safe_yaml` (when a file is
read) and the config's own modules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine_adapter.paths import DEFAULT_NAME, is_engine_name
from engine_adapter.serving.config.engine_config import (
    SIZING_KEYS,
    EngineConfig,
    config_keys,
    env_var,
    parse_layer,
)
from engine_adapter.serving.config.flags import flag_label
from engine_adapter.serving.config.values import ConfigError

__all__ = ["CONFIG_ENV", "load_env", "load_yaml", "resolve_config"]

CONFIG_ENV = "SAGE_CONFIG"
# Each policy key and the key of its params: params go with the policy they were given for.
POLICY_PARAMS = {"eviction_policy": "policy_params", "host_eviction_policy": "host_policy_params"}


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
        parse_layer(flags or {}, source="", key_label=flag_label),
        load_env(env),
        load_yaml(config_file) if config_file is not None else {},
        parse_layer(defaults or {}, source="defaults", key_label=flag_label),
    ]  # first wins
    merged: dict[str, Any] = {}
    for key in config_keys():
        if key in SIZING_KEYS or key in POLICY_PARAMS.values():
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
    # Policy params: from the source that picked the policy and the ones above it (the device
    # pool's and the host tier's alike).
    for policy_key, params_key in POLICY_PARAMS.items():
        picked = next((i for i, layer in enumerate(layers) if policy_key in layer), len(layers))
        params: dict[str, Any] = {}
        for layer in reversed(layers[: picked + 1]):
            params.update(layer.get(params_key, {}))
        merged[params_key] = params
    if "socket" in merged and "name" not in merged:
        stem = Path(merged["socket"]).stem
        merged["name"] = stem if is_engine_name(stem) else DEFAULT_NAME
    return EngineConfig(**merged)
