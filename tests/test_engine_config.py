"""`engine_adapter.serving.config`: YAML keys, unknown keys, precedence flags > env > file > defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine_adapter import paths as engine_paths
from engine_adapter.serving.config import (
    ConfigError,
    EngineConfig,
    config_keys,
    env_var,
    load_env,
    load_yaml,
    resolve_config,
)
from sage_eviction import OfflinePolicyError, PolicyParamError, UnknownPolicyError


@pytest.fixture(autouse=True)
def sage_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SAGE_HOME and an environment with no SAGE_* settings."""
    import os

    for key in list(os.environ):
        if key.startswith("SAGE_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("SAGE_HOME", str(home))
    return home


def write(tmp_path: Path, text: str, name: str = "engine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults and the dataclass ------------------------------------------------------------------


def test_defaults(sage_home: Path) -> None:
    config = EngineConfig()
    assert config.model == "sage-tiny"
    assert config.engine_kind == "llm"
    assert config.eviction_policy == "lru"
    assert config.policy_params == {}
    assert (config.num_blocks, config.kv_cache_memory, config.gpu_memory_utilization) == (None, None, None)
    assert config.block_size == 16
    assert config.device == "auto"
    assert config.name == "default"
    assert config.socket == str(sage_home / "run" / "default.sock")
    assert config.pid_path == sage_home / "run" / "default.pid"
    assert config.log_dir == str(sage_home / "logs" / "default")
    assert config.eviction_log_path == sage_home / "logs" / "default" / "evictions.jsonl"
    assert config.engine_log_path == sage_home / "logs" / "default" / "engine.log"


def test_the_config_paths_are_those_of_engine_adapter_paths(sage_home: Path) -> None:
    config = EngineConfig(name="blue")
    assert engine_paths.sage_home() == sage_home
    assert engine_paths.run_dir() == sage_home / "run"
    assert config.socket_path == engine_paths.default_socket("blue") == sage_home / "run" / "blue.sock"
    assert config.pid_path == engine_paths.pid_path(config.socket_path) == sage_home / "run" / "blue.pid"
    assert Path(config.log_dir) == engine_paths.default_log_dir("blue")
    assert config.eviction_log_path == engine_paths.eviction_log_path(Path(config.log_dir))
    assert config.engine_log_path == engine_paths.engine_log_path(Path(config.log_dir))


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        *[(name, True) for name in ("a", "blue-1.x_y", "9", "x" * 64)],
        *[(name, False) for name in ("", ".hidden", "a/b", "x" * 65, "é", "-a")],
    ],
)
def test_engine_names(name: str, valid: bool) -> None:
    assert engine_paths.is_engine_name(name) is valid
    if valid:
        assert engine_paths.validate_name(name) == name
    else:
        with pytest.raises(ValueError, match="is not valid"):
            engine_paths.validate_name(name)


def test_every_key_is_an_env_var_and_a_flag() -> None:
    keys = config_keys()
    assert keys == [f.name for f in dataclasses.fields(EngineConfig)]
    assert env_var("eviction_policy") == "SAGE_EVICTION_POLICY"


def test_construction_checks_values() -> None:
    with pytest.raises(ConfigError, match="num_blocks: 0 is below the minimum 1"):
        EngineConfig(num_blocks=0)
    with pytest.raises(ConfigError, match="exclusive"):
        EngineConfig(num_blocks=8, kv_cache_memory=1 << 20)


def test_json_round_trip() -> None:
    config = EngineConfig(
        model="sage-tiny",
        eviction_policy="slru",
        policy_params={"protected_threshold": 3},
        num_blocks=64,
        log_evictions=True,
        queued_timeout=2.5,
        name="x",
    )
    assert EngineConfig.from_json(config.to_json()) == config


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"--config-json: unknown key 'num_block'; did you mean 'num_blocks'\?"
    ):
        EngineConfig.from_dict({"num_block": 3}, source="--config-json")
    with pytest.raises(ConfigError, match="not JSON"):
        EngineConfig.from_json("{")


def test_socket_path_too_long() -> None:
    with pytest.raises(ConfigError, match="a Unix socket path holds at most"):
        EngineConfig(socket="/tmp/" + "x" * 200 + ".sock")


# -- YAML ------------------------------------------------------------------------------------


def test_yaml_keys_snake_and_kebab(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        model: sage-tiny
        eviction-policy: SLRU
        policy_params: {protected_threshold: 3}
        log_evictions: true
        kv-cache-memory: 2GiB
        block_size: 32
        device: cuda:1
        max_queued_requests: 10
        queued_timeout: 1.5
        eviction_threshold: 0.9
        max_pinned_ratio: 0.25
        seed: 7
        """.replace("\n        ", "\n"),
    )
    values = load_yaml(path)
    assert values == {
        "model": "sage-tiny",
        "eviction_policy": "slru",
        "policy_params": {"protected_threshold": 3},
        "log_evictions": True,
        "kv_cache_memory": 2 * 1024**3,
        "block_size": 32,
        "device": "cuda:1",
        "max_queued_requests": 10,
        "queued_timeout": 1.5,
        "eviction_threshold": 0.9,
        "max_pinned_ratio": 0.25,
        "seed": 7,
    }


def test_yaml_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "eviction_policy: lru\nnum_block: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'num_block'; did you mean 'num_blocks'\?"):
        load_yaml(path)
    path = write(tmp_path, "colour: blue\n")
    with pytest.raises(ConfigError, match=r"unknown key 'colour'; known keys: model, "):
        load_yaml(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_blocks: -1\n", "num_blocks: -1 is below the minimum 1"),
        ("num_blocks: many\n", "num_blocks: 'many' is not an integer"),
        ("num_blocks: true\n", "num_blocks: True is not an integer"),
        ("block_size: 0\n", "block_size: 0 is below the minimum 1"),
        ("device: tpu\n", "device: 'tpu' is not a device"),
        ("gpu_memory_utilization: 1.5\n", r"gpu_memory_utilization: 1.5 is not in \(0, 1\]"),
        ("eviction_threshold: 0\n", r"eviction_threshold: 0 is not in \(0, 1\]"),
        ("kv_cache_memory: 2XB\n", "kv_cache_memory: size '2XB': unknown unit 'XB'"),
        ("kv_cache_memory: 0\n", "kv_cache_memory: 0 is not a positive size"),
        ("log_evictions: maybe\n", "log_evictions: 'maybe' is not a boolean"),
        ("engine_kind: embedding\n", "engine kind 'embedding' is not supported; supported: llm"),
        ("name: a/b\n", "name: 'a/b' is not an engine name"),
        ("policy_params: [1, 2]\n", "policy_params: 1 is not of the form k=v"),
        ("policy_params: {a: [1]}\n", r"policy_params.a: \[1\] is not a string, number or boolean"),
        ("num_blocks: 4\nkv_cache_memory: 1GiB\n", "num_blocks and kv_cache_memory are exclusive"),
        ("model: ''\n", "model: '' is not a non-empty string"),
    ],
)
def test_yaml_bad_values_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_yaml(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_yaml_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.yaml: No such file"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"is not valid YAML: line 2, column 1: "):
        load_yaml(write(tmp_path, "a: [\n"))
    with pytest.raises(ConfigError, match="the top level is not a mapping"):
        load_yaml(write(tmp_path, "- a\n- b\n"))
    assert load_yaml(write(tmp_path, "# nothing\n")) == {}


def test_yaml_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    path = write(folder, "socket: run/e.sock\nlog_dir: logs\n")
    assert load_yaml(path) == {"socket": str(folder / "run" / "e.sock"), "log_dir": str(folder / "logs")}


# -- sizes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("512MB", 512 * 10**6),
        ("1.5G", 1_500_000_000),
        ("4096", 4096),
        (4096, 4096),
        ("1 kib", 1024),
    ],
)
def test_size_strings(raw: object, size: int) -> None:
    assert resolve_config({"kv_cache_memory": raw}, environ={}).kv_cache_memory == size


def test_size_errors_name_the_source() -> None:
    with pytest.raises(ConfigError, match="--kv-cache-memory: size '2 lots'"):
        resolve_config({"kv_cache_memory": "2 lots"}, environ={})
    with pytest.raises(ConfigError, match="environment: SAGE_KV_CACHE_MEMORY: size 'x'"):
        resolve_config({}, environ={"SAGE_KV_CACHE_MEMORY": "x"})


# -- precedence: flags > environment > file > defaults ----------------------------------------------


def test_precedence_per_key(tmp_path: Path) -> None:
    path = write(tmp_path, "eviction_policy: arc\nblock_size: 8\nseed: 3\ndevice: cpu\n")
    env = {"SAGE_EVICTION_POLICY": "lfu", "SAGE_BLOCK_SIZE": "32"}
    flags = {"eviction_policy": "fifo", "device": None}  # None: not given
    config = resolve_config(flags, config_file=path, environ=env)
    assert config.eviction_policy == "fifo"  # flag over env over file
    assert config.block_size == 32  # env over file
    assert config.seed == 3  # file over default
    assert config.device == "cpu"  # file; the flag was not given
    assert config.max_num_seqs == EngineConfig().max_num_seqs  # default
    assert resolve_config({}, config_file=path, environ=env).eviction_policy == "lfu"
    assert resolve_config({}, config_file=path, environ={}).eviction_policy == "arc"
    assert resolve_config({}, environ={}).eviction_policy == "lru"


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 11\n")
    assert resolve_config({}, environ={"SAGE_CONFIG": str(path)}).seed == 11
    other = write(tmp_path, "seed: 12\n", "other.yaml")
    assert resolve_config({}, config_file=other, environ={"SAGE_CONFIG": str(path)}).seed == 12


def test_environment_values() -> None:
    env = {
        "SAGE_LOG_EVICTIONS": "yes",
        "SAGE_POLICY_PARAMS": "protected_threshold=3, protected_ratio=0.5",
        "SAGE_EVICTION_POLICY": "slru",
        "SAGE_GPU_MEMORY_UTILIZATION": "0.8",
        "SAGE_NAME": "blue",
        "SAGE_QUEUED_TIMEOUT": "",  # empty: not set
    }
    values = load_env(env)
    assert values["log_evictions"] is True
    assert values["policy_params"] == {"protected_threshold": "3", "protected_ratio": "0.5"}
    assert "queued_timeout" not in values
    config = resolve_config({}, environ=env)
    assert config.name == "blue"
    assert config.gpu_memory_utilization == 0.8
    with pytest.raises(ConfigError, match="environment: SAGE_LOG_EVICTIONS: 'maybe' is not a boolean"):
        load_env({"SAGE_LOG_EVICTIONS": "maybe"})


def test_pool_size_is_chosen_as_a_whole(tmp_path: Path) -> None:
    path = write(tmp_path, "num_blocks: 64\n")
    config = resolve_config({}, config_file=path, environ={"SAGE_KV_CACHE_MEMORY": "1GiB"})
    assert (config.num_blocks, config.kv_cache_memory) == (None, 1024**3)
    config = resolve_config({"gpu_memory_utilization": 0.5}, config_file=path, environ={})
    assert (config.num_blocks, config.gpu_memory_utilization) == (None, 0.5)
    with pytest.raises(ConfigError, match="--num-blocks and --kv-cache-memory are exclusive"):
        resolve_config({"num_blocks": 4, "kv_cache_memory": "1GiB"}, environ={})


def test_policy_params_follow_the_policy(tmp_path: Path) -> None:
    path = write(
        tmp_path, "eviction_policy: slru\npolicy_params: {protected_threshold: 3, protected_ratio: 0.5}\n"
    )
    # A flag that changes the policy drops the file's params (they were for slru).
    assert resolve_config({"eviction_policy": "lru"}, config_file=path, environ={}).policy_params == {}
    # Params without a new policy add to (and override) the file's.
    config = resolve_config({"policy_params": ["protected_threshold=5"]}, config_file=path, environ={})
    assert config.eviction_policy == "slru"
    assert config.policy_params == {"protected_threshold": "5", "protected_ratio": 0.5}
    with pytest.raises(ConfigError, match="--policy-param: 'x' is not of the form k=v"):
        resolve_config({"policy_params": ["x"]}, environ={})


def test_name_follows_an_explicit_socket(tmp_path: Path) -> None:
    config = resolve_config({"socket": str(tmp_path / "blue.sock")}, environ={})
    assert config.name == "blue"
    assert config.socket == str(tmp_path / "blue.sock")
    assert config.pid_path == tmp_path / "blue.pid"
    named = resolve_config({"socket": str(tmp_path / "blue.sock"), "name": "red"}, environ={})
    assert (named.name, named.socket) == ("red", str(tmp_path / "blue.sock"))
    assert resolve_config({"name": "red"}, environ={}).socket.endswith("/run/red.sock")


# -- the policy, checked against sage_eviction --------------------------------------------------------


def test_check_policy() -> None:
    EngineConfig(eviction_policy="lru").check_policy()
    EngineConfig(eviction_policy="slru", policy_params={"protected_threshold": "3"}).check_policy()
    EngineConfig(eviction_policy="arc", num_blocks=64).check_policy()  # needs a capacity
    with pytest.raises(UnknownPolicyError, match=r"available: .*lru"):
        EngineConfig(eviction_policy="nope").check_policy()
    with pytest.raises(PolicyParamError, match="no param 'x'"):
        EngineConfig(eviction_policy="lru", policy_params={"x": "1"}).check_policy()
    with pytest.raises(PolicyParamError):
        EngineConfig(eviction_policy="slru", policy_params={"protected_threshold": "many"}).check_policy()
    with pytest.raises(OfflinePolicyError, match="needs the future"):
        EngineConfig(eviction_policy="belady").check_policy()
