"""The KV tiers' engine options (issue 30): their checks, their layering, and the tiers the engine's
parts build from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.model.disk_store import DiskKVStore
from engine_adapter.model.host_pool import HostKVPool
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.serving.config import ConfigError, EngineConfig, resolve_config
from engine_adapter.serving.engine_parts import kv_tiers, load_parts
from sage_eviction import PolicyParamError, UnknownPolicyError


@pytest.fixture(autouse=True)
def sage_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SAGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_tiers_are_off_by_default() -> None:
    config = EngineConfig()
    assert (config.host_kv_cache, config.disk_kv_cache, config.disk_kv_size) == (None, "", None)
    assert (config.host_eviction_policy, config.host_write_policy) == ("lru", "write_back")
    pool = PagedKVPool(num_layers=1, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=2, device="cpu")
    tiers = kv_tiers(config, pool)
    assert (tiers.host, tiers.disk, tiers.host_blocks, tiers.disk_blocks) == (None, None, 0, 0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"host_kv_cache": "8 lots"}, "host_kv_cache: size '8 lots': unknown unit 'lots'"),
        ({"host_kv_cache": "0"}, "host_kv_cache: '0' is not a positive size"),
        ({"disk_kv_size": "-1GiB"}, "disk_kv_size: size '-1GiB' is not of the form"),
        ({"host_write_policy": "sometimes"}, "not a host write policy: write_back, write_through"),
        ({"host_policy_params": ["capacity"]}, "host_policy_params: 'capacity' is not of the form k=v"),
        ({"host_kv_cache": "1GiB", "disk_kv_size": "1GiB"}, "disk_kv_size needs disk_kv_cache"),
        ({"host_kv_cache": "1GiB", "disk_kv_cache": "/tmp/x"}, "disk_kv_cache needs disk_kv_size"),
        ({"disk_kv_cache": "/tmp/x", "disk_kv_size": "1GiB"}, "disk_kv_cache needs host_kv_cache"),
    ],
)
def test_bad_tier_options_are_one_line_errors(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        EngineConfig.from_dict(values)
    assert "\n" not in str(info.value)


def test_the_host_policy_is_checked_against_the_registry() -> None:
    with pytest.raises(UnknownPolicyError, match="host tier: unknown eviction policy 'nope'; available: arc"):
        EngineConfig(host_eviction_policy="nope").check_policy()
    with pytest.raises(PolicyParamError, match="host tier: policy 'lru' has no param 'zz'"):
        EngineConfig(host_policy_params={"zz": 1}).check_policy()
    EngineConfig(host_eviction_policy="arc", host_policy_params={}).check_policy()


def test_host_policy_params_follow_the_host_policy(tmp_path: Path) -> None:
    # Params from a source below the one that picked the host policy were meant for another one.
    file = tmp_path / "engine.yaml"
    file.write_text("host_eviction_policy: slru\nhost_policy_params: {protected_ratio: 0.5}\n")
    env = {"SAGE_HOST_EVICTION_POLICY": "lru"}
    assert resolve_config(config_file=file, environ=env).host_policy_params == {}
    assert resolve_config(config_file=file, environ={}).host_policy_params == {"protected_ratio": 0.5}
    # the device policy's params are not touched by the host policy's choice
    both = resolve_config({"policy_params": ["a=1"]}, config_file=file, environ=env)
    assert both.policy_params == {"a": "1"}


def test_tier_sizes_become_blocks_of_the_pool(tmp_path: Path) -> None:
    pool = PagedKVPool(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, num_blocks=4, device="cpu")
    assert pool.bytes_per_block == 512
    config = EngineConfig(
        host_kv_cache=10 * 512 + 511, disk_kv_cache=str(tmp_path / "kv"), disk_kv_size="100KiB"
    )
    tiers = kv_tiers(config, pool)
    assert isinstance(tiers.host, HostKVPool) and isinstance(tiers.disk, DiskKVStore)
    assert (tiers.host_blocks, tiers.disk_blocks) == (10, 200)
    assert tiers.host.dtype == pool.dtype and tiers.host.block_shape == (4, 2, 4)
    assert not tiers.host.pinned  # a CPU pool: no pinned memory, no copy stream
    assert (tmp_path / "kv").is_dir()
    with pytest.raises(ConfigError, match=r"host_kv_cache: .* holds no block of 512 bytes"):
        kv_tiers(EngineConfig(host_kv_cache=511), pool)


def test_an_unusable_disk_folder_is_a_config_error(tmp_path: Path) -> None:
    pool = PagedKVPool(num_layers=1, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=2, device="cpu")
    (tmp_path / "file").write_text("")
    config = EngineConfig(
        host_kv_cache="1MiB", disk_kv_cache=str(tmp_path / "file" / "kv"), disk_kv_size="1MiB"
    )
    with pytest.raises(ConfigError, match=r"disk_kv_cache: disk KV cache folder .*file/kv"):
        kv_tiers(config, pool)


@pytest.mark.slow  # loads sage-tiny and warms it up: ~4 s on 2 cores
def test_the_engine_thread_builds_the_tiers_beside_the_pool(tmp_path: Path) -> None:
    config = EngineConfig(
        model="sage-tiny",
        device="cpu",
        num_blocks=8,
        host_kv_cache="1MiB",
        disk_kv_cache=str(tmp_path / "kv"),
        disk_kv_size="2MiB",
    )
    parts = load_parts(config)
    per_block = parts.pool.bytes_per_block
    assert parts.tiers.host_blocks == 2**20 // per_block
    assert parts.tiers.disk_blocks == 2 * 2**20 // per_block
    assert parts.tiers.host is not None and parts.tiers.host.dtype == parts.pool.dtype
