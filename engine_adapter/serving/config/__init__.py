"""The engine's configuration: one dataclass, from flags, the environment, a YAML file, defaults.

    engine_config.py  `EngineConfig`: each key, its default, its docstring and its parser
                      (`PARSERS`); `parse_layer` checks the keys one source sets
    flags.py          `START_FLAGS`: how ``sage llm engine start`` spells each key's flag (the help
                      is the key's docstring); the keys without one
    layers.py         `resolve_config`: flags > ``SAGE_<KEY>`` > the YAML file > defaults
    values.py         the parsers of values, `ConfigError`
    colocation.py     SLOs, the colocation mode and its params (`colocation_params`,
                      `colocation_switches`)

Pure Python (no torch): ``sage llm engine start`` builds an `EngineConfig` and hands it to
``engine_adapter.serving.server.serve(config)``, or as JSON to ``python -m
engine_adapter.serving.server --config-json '...'``.

Every key is also an environment variable: ``eviction_policy`` is ``SAGE_EVICTION_POLICY``,
``policy_params`` is ``SAGE_POLICY_PARAMS="k=v,k=v"``, booleans take true/false/1/0/yes/no/on/off,
sizes take ``2GiB``. YAML keys may be written ``eviction_policy`` or ``eviction-policy``.

Paths (`engine_adapter.paths`): ``$SAGE_HOME`` (default ``~/.sage``), the socket
``$SAGE_HOME/run/<name>.sock``, the logs ``$SAGE_HOME/logs/<name>/`` (``evictions.jsonl``,
``engine.log``).

Imports: the standard library, `engine_adapter.paths`, `engine_adapter.safe_yaml`,
`engine_adapter.cache.sizes`; `engine_adapter.colocation`, `engine_adapter.token_eviction` and
`sage_eviction` only inside the functions that check their keys.
"""

from __future__ import annotations

from engine_adapter.serving.config.colocation import (
    SLO_KEYS,
    SWITCH_PARAMS,
    SYSTEM_PARAM,
    colocation_params,
    colocation_switches,
)
from engine_adapter.serving.config.engine_config import (
    DEFAULT_MAX_BODY_BYTES,
    ENV_PREFIX,
    SIZING_KEYS,
    EngineConfig,
    config_keys,
    env_var,
    parse_layer,
)
from engine_adapter.serving.config.flags import NO_FLAG_KEYS, START_FLAGS, StartFlag
from engine_adapter.serving.config.layers import CONFIG_ENV, load_env, load_yaml, resolve_config
from engine_adapter.serving.config.values import ENGINE_KINDS, ConfigError

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "ENGINE_KINDS",
    "ENV_PREFIX",
    "NO_FLAG_KEYS",
    "SIZING_KEYS",
    "SLO_KEYS",
    "START_FLAGS",
    "SWITCH_PARAMS",
    "SYSTEM_PARAM",
    "ConfigError",
    "EngineConfig",
    "StartFlag",
    "colocation_params",
    "colocation_switches",
    "config_keys",
    "env_var",
    "load_env",
    "load_yaml",
    "parse_layer",
    "resolve_config",
]
