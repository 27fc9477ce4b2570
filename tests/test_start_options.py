"""The options of ``sage llm engine start`` are the engine's config keys, declared once.

`EngineConfig` (its fields' docstrings) and `START_FLAGS` in ``engine_adapter.serving.config`` are
the declaration; ``sage_cli/engine/start_options.py`` is generated from them (the CLI may not import
the engine to build its command tree). These tests regenerate it, and check that every key is
settable from a flag, the YAML file and the environment, and every option of the command is a
key, but for the exceptions named here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.serving.config import (
    CONFIG_ENV,
    NO_FLAG_KEYS,
    START_FLAGS,
    config_keys,
    env_var,
    load_env,
    load_yaml,
    resolve_config,
)
from engine_adapter.serving.config.engine_config import PARSERS
from engine_adapter.serving.config.flags import field_docs, flag_kind, flag_param, key_help
from sage_cli.engine.config_flags import config_values
from sage_cli.engine.start_options import START_OPTIONS

ROOT = Path(__file__).resolve().parent.parent

# The options of start that are no config key: the YAML file itself (also $SAGE_CONFIG), and how
# this one command runs the engine.
CLI_ONLY = {"config_file": "--config", "detach": "--detach", "timeout": "--timeout", "json_out": "--json"}
# The keys with no flag: set in the YAML file or as SAGE_<KEY> (the HTTP limits, the SLO defaults,
# what a compressed sequence keeps).
YAML_AND_ENV_ONLY = {
    "token_target_ratio",
    "max_body_bytes",
    "header_timeout",
    "body_timeout",
    "keep_alive_timeout",
    "max_connections",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_deadline_ms",
    "tenant_slos",
}
KEY = "k" * 16
TCP = {"host": "127.0.0.1", "port": "8123", "api_key": KEY}
TLS = {**TCP, "ssl_certfile": "/tmp/sage-c.pem", "ssl_keyfile": "/tmp/sage-k.pem"}

# key -> (the value as text, what the config holds, the other keys it needs)
SAMPLES: dict[str, tuple[str, Any, dict[str, str]]] = {
    "model": ("my-model", "my-model", {}),
    "engine_kind": ("LLM", "llm", {}),
    "eviction_policy": ("ARC", "arc", {}),
    "policy_params": ("protected_threshold=3", {"protected_threshold": "3"}, {}),
    "enable_lifetime_prediction": ("true", True, {}),
    "log_evictions": ("yes", True, {}),
    "explain_evictions": ("on", True, {}),
    "lookup_log": ("/tmp/sage-t/lookups.jsonl", "/tmp/sage-t/lookups.jsonl", {}),
    "ghost_factor": ("3", 3.0, {}),
    "num_blocks": ("64", 64, {}),
    "kv_cache_memory": ("2MiB", 2 * 2**20, {}),
    "gpu_memory_utilization": ("0.5", 0.5, {}),
    "block_size": ("32", 32, {}),
    "host_kv_cache": ("1GiB", 2**30, {}),
    "host_eviction_policy": ("ARC", "arc", {}),
    "host_policy_params": ("capacity=4", {"capacity": "4"}, {}),
    "host_write_policy": ("write_through", "write_through", {}),
    "disk_kv_cache": ("/tmp/sage-t/kv", "/tmp/sage-t/kv", {"host_kv_cache": "1GiB", "disk_kv_size": "2GiB"}),
    "disk_kv_size": ("2GiB", 2 * 2**30, {"host_kv_cache": "1GiB", "disk_kv_cache": "/tmp/sage-t/kv"}),
    "device": ("CPU", "cpu", {}),
    "dtype": ("BFloat16", "bfloat16", {}),
    "kv_dtype": ("float16", "float16", {}),
    "quantization": ("INT8", "int8", {}),
    "packed_weights": ("ON", "on", {}),
    "batch_invariant": ("OFF", "off", {}),
    "compile": ("yes", True, {}),
    "threads": ("3", 3, {}),
    "cuda_graphs": ("yes", True, {}),
    "name": ("blue", "blue", {}),
    "socket": ("/tmp/sage-t/x.sock", "/tmp/sage-t/x.sock", {}),
    "log_dir": ("/tmp/sage-t/logs", "/tmp/sage-t/logs", {}),
    "max_queued_requests": ("5", 5, {}),
    "queued_timeout": ("2.5", 2.5, {}),
    "eviction_threshold": ("0.9", 0.9, {}),
    "max_pinned_ratio": ("0.25", 0.25, {}),
    "max_cache_ttl": ("3600", 3600.0, {}),
    "max_retained_fraction": ("0.5", 0.5, {}),
    "cache_generated_tokens": ("yes", True, {}),
    "protect_queued": ("0.1", 0.1, {}),
    "preemption_order": ("LRU", "lru", {}),
    "max_num_seqs": ("8", 8, {}),
    "max_num_batched_tokens": ("512", 512, {}),
    "adaptive_batch": ("1", True, {}),
    "prefetch": ("false", False, {}),
    "token_eviction": ("sliding", "sliding", {}),
    "compress_on_evict": ("KNorm:0.75", "knorm:0.75", {}),
    "eviction_window": ("64", 64, {}),
    "memory_threshold": ("128", 128, {}),
    "token_target_ratio": ("0.25", 0.25, {}),
    "seed": ("7", 7, {}),
    "max_body_bytes": ("1MiB", 2**20, {}),
    "header_timeout": ("3", 3.0, {}),
    "body_timeout": ("4", 4.0, {}),
    "keep_alive_timeout": ("2", 2.0, {}),
    "max_connections": ("16", 16, {}),
    "host": ("127.0.0.1", "127.0.0.1", TCP),
    "port": ("8123", 8123, TCP),
    "api_key": (KEY, KEY, {}),
    "ssl_certfile": ("/tmp/sage-c.pem", "/tmp/sage-c.pem", TLS),
    "ssl_keyfile": ("/tmp/sage-k.pem", "/tmp/sage-k.pem", TLS),
    "insecure_no_api_key": ("true", True, {}),
    "kv_events_endpoint": ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557", {}),
    "kv_events_replay_endpoint": (
        "tcp://127.0.0.1:5558",
        "tcp://127.0.0.1:5558",
        {"kv_events_endpoint": "tcp://127.0.0.1:5557"},
    ),
    "slo_ttft_ms": ("500", 500.0, {}),
    "slo_tpot_ms": ("50", 50.0, {}),
    "slo_deadline_ms": ("300", 300.0, {}),
    "tenant_slos": ("a:ttft_ms=500", {"a": {"ttft_ms": 500.0}}, {}),
    "embedding_chunk_tokens": ("64", 64, {}),
    "colocation": ("dynamic", "dynamic", {}),
    "colocation_params": ("safety_ratio=0.2", {"safety_ratio": "0.2"}, {}),
}


@pytest.fixture(autouse=True)
def sage_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SAGE_HOME", str(home))
    return home


def test_the_generated_table_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_start_options.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_each_row_is_the_keys_flag_and_docstring() -> None:
    assert [o.key for o in START_OPTIONS] == [f.key for f in START_FLAGS]
    for option, flag in zip(START_OPTIONS, START_FLAGS, strict=True):
        assert (option.param, option.kind, option.decls) == (flag_param(flag), flag_kind(flag), flag.decls)
        assert option.help.startswith(key_help(flag.key))
    assert set(field_docs()) == set(config_keys())  # every key is documented


def test_every_key_has_a_parser_and_a_flag_but_the_named_ones() -> None:
    keys = set(config_keys())
    assert set(PARSERS) == keys
    assert set(SAMPLES) == keys  # a new key needs a sample here: it is then checked everywhere
    assert set(NO_FLAG_KEYS) == YAML_AND_ENV_ONLY
    assert {f.key for f in START_FLAGS} == keys - YAML_AND_ENV_ONLY
    assert len(START_FLAGS) == len({f.key for f in START_FLAGS})


def _start_command() -> Any:
    from sage_cli.app import build_command

    return build_command().commands["llm"].commands["engine"].commands["start"]


def test_every_option_of_start_is_a_key_but_the_named_ones() -> None:
    params = {p.name: p for p in _start_command().params}
    by_param = {o.param: o.key for o in START_OPTIONS}
    assert set(params) == set(by_param) | set(CLI_ONLY)
    for name, flag in CLI_ONLY.items():
        assert flag in params[name].opts
    assert not {o.key for o in START_OPTIONS} & YAML_AND_ENV_ONLY


def _cli_args(key: str, text: str) -> list[str]:
    (option,) = [o for o in START_OPTIONS if o.key == key]
    if option.kind == "argument":
        return [text]
    on, _, off = option.decls[0].partition("/")
    if option.kind == "switch":  # a switch that is on by default is sampled by its off form
        return [off if text in ("false", "0", "no", "off") else on]
    return [on, text]


def _flags(values: dict[str, str]) -> dict[str, Any]:
    """What the start command makes of these keys given as its flags."""
    args = [arg for key, text in values.items() for arg in _cli_args(key, text)]
    ctx = _start_command().make_context("start", args)
    return config_values(START_OPTIONS, ctx.params)


@pytest.mark.parametrize("key", config_keys())
def test_every_key_is_settable_from_the_yaml_file_and_the_environment(key: str, tmp_path: Path) -> None:
    text, expected, companions = SAMPLES[key]
    values = {**companions, key: text}
    file = tmp_path / "engine.yaml"
    file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()), encoding="utf-8")
    assert load_yaml(file)[key] == expected
    assert getattr(resolve_config(config_file=file, environ={}), key) == expected
    environ = {env_var(k): v for k, v in values.items()}
    assert load_env(environ)[key] == expected
    assert getattr(resolve_config(environ=environ), key) == expected
    # the file named by $SAGE_CONFIG, as --config names it
    assert getattr(resolve_config(environ={CONFIG_ENV: str(file)}), key) == expected


@pytest.mark.parametrize("key", [k for k in config_keys() if k not in YAML_AND_ENV_ONLY])
def test_every_key_with_a_flag_is_settable_from_it(key: str) -> None:
    text, expected, companions = SAMPLES[key]
    flags = _flags({**companions, key: text})
    assert getattr(resolve_config(flags, environ={}), key) == expected
    given = {k for k, v in flags.items() if v is not None}
    assert given == {key, *companions}  # no flag sets another key
