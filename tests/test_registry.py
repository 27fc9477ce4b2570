"""Names to policies: specs with params, clear errors, aliases and entry-point plugins."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sage_eviction import (
    ENTRY_POINT_GROUP,
    EvictionPolicy,
    PolicyConfigError,
    PolicyParamError,
    UnknownPolicyError,
    available_policies,
    create_policy,
    get_policy_class,
    policy_params,
)
from sage_eviction import registry as registry_module
from sage_eviction.policies import POLICIES
from sage_eviction.registry import ALIASES, parse_policy_spec


def _require(name: str) -> None:
    if name not in POLICIES:
        pytest.skip(f"policy {name!r} is not registered yet")


# ---- building from a spec ------------------------------------------------------------------


def test_spec_with_params() -> None:
    _require("slru")
    policy = create_policy("slru:protected_threshold=3")
    assert isinstance(policy, get_policy_class("slru"))
    assert policy_params(type(policy))["protected_threshold"].type is int


def test_capacity_keyword() -> None:
    _require("arc")
    policy = create_policy("arc", capacity=1000)
    assert isinstance(policy, get_policy_class("arc"))
    assert policy.capacity == 1000


def test_names_are_case_and_space_insensitive() -> None:
    assert type(create_policy(" LRU ")) is get_policy_class("lru")


def test_parse_policy_spec() -> None:
    assert parse_policy_spec("slru") == ("slru", {})
    assert parse_policy_spec("slru: protected_threshold = 3 , x=y,") == (
        "slru",
        {"protected_threshold": "3", "x": "y"},
    )
    with pytest.raises(PolicyParamError, match="'oops' is not of the form k=v"):
        parse_policy_spec("slru:oops")


def test_every_policy_builds_with_defaults_and_knows_its_name(policy_name: str) -> None:
    cls = get_policy_class(policy_name)
    assert cls.name == policy_name
    assert cls.paper, f"{cls.__name__} names no paper"
    params = policy_params(cls)
    assert "capacity" in params
    policy = create_policy(policy_name, capacity=128)
    assert isinstance(policy, cls)
    assert policy.capacity == 128
    if not cls.needs_capacity:
        assert create_policy(policy_name).capacity is None


def test_a_policy_that_needs_capacity_says_so() -> None:
    needing = [n for n in available_policies() if get_policy_class(n).needs_capacity]
    if not needing:
        pytest.skip("no registered policy needs a capacity")
    for name in needing:
        with pytest.raises(PolicyConfigError, match="capacity"):
            create_policy(name)


# ---- errors --------------------------------------------------------------------------------


def test_unknown_name_lists_the_available_policies() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        create_policy("no-such-policy")
    message = str(info.value)
    assert "'no-such-policy'" in message
    for name in available_policies():
        assert name in message
    assert isinstance(info.value, ValueError)  # config errors are ValueErrors


def test_unknown_param_names_it_and_lists_params_with_defaults() -> None:
    with pytest.raises(PolicyParamError) as info:
        create_policy("lru:bogus=1")
    message = str(info.value)
    assert "'bogus'" in message
    assert "capacity=None" in message


def test_unknown_param_of_a_policy_with_params() -> None:
    _require("slru")
    with pytest.raises(PolicyParamError) as info:
        create_policy("slru", protected_treshold=3)  # sic
    message = str(info.value)
    assert "'protected_treshold'" in message
    for spec in policy_params(get_policy_class("slru")).values():
        assert spec.describe() in message


@pytest.mark.parametrize("value", ["three", "3.5", "true"])
def test_ill_typed_param_names_it_and_lists_params(value: str) -> None:
    _require("slru")
    with pytest.raises(PolicyParamError) as info:
        create_policy(f"slru:protected_threshold={value}")
    message = str(info.value)
    assert "protected_threshold" in message
    assert repr(value) in message
    for spec in policy_params(get_policy_class("slru")).values():
        assert spec.describe() in message


@pytest.mark.parametrize("value", ["abc", "0", "-4", True])
def test_bad_capacity_is_a_param_error(value: object) -> None:
    with pytest.raises(PolicyParamError) as info:
        create_policy("lru", capacity=value)  # type: ignore[arg-type]
    assert "capacity" in str(info.value)
    assert "params: capacity=None" in str(info.value)


# ---- aliases -------------------------------------------------------------------------------


def test_qos_aware_is_priority() -> None:
    _require("priority")
    assert get_policy_class("qos_aware") is get_policy_class("priority")
    assert type(create_policy("qos_aware")) is get_policy_class("priority")
    assert type(create_policy("QOS_AWARE")) is get_policy_class("priority")


@pytest.mark.parametrize(("alias", "target"), sorted(ALIASES.items()))
def test_every_alias_points_at_a_policy_name(alias: str, target: str) -> None:
    assert alias not in POLICIES, f"alias {alias!r} shadows a policy"
    _require(target)
    assert get_policy_class(alias) is POLICIES[target]


def test_available_policies() -> None:
    names = available_policies()
    assert names == sorted(names)
    assert set(names) >= set(POLICIES)
    online = available_policies(include_offline=False)
    assert set(online) == {n for n in names if not get_policy_class(n).offline}
    if "belady" in POLICIES:
        assert "belady" in names
        assert "belady" not in online


# ---- entry-point plugins -------------------------------------------------------------------

PLUGIN_NAME = "sagetestplugin"
PLUGIN_MODULE = "sage_test_plugin_policy"


@pytest.fixture
def plugin_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real installed distribution on sys.path whose entry point registers `PLUGIN_NAME`."""
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            from sage_eviction.policies.lru import LRUPolicy

            class NewestFirstLRU(LRUPolicy):
                '''LRU under another name, with one param.'''

                name = "{PLUGIN_NAME}"
                paper = "a test plugin"

                def __init__(self, capacity: int | None = None, boost: float = 1.5) -> None:
                    super().__init__(capacity)
                    self.boost = boost

            NOT_A_POLICY = 42
            """
        )
    )
    dist_info = tmp_path / "sage_test_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sage-test-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_MODULE}:NewestFirstLRU\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # also invalidates importlib's caches
    monkeypatch.setattr(registry_module, "_plugins_loaded", False)
    try:
        yield dist_info
    finally:
        POLICIES.pop(PLUGIN_NAME, None)
        sys.modules.pop(PLUGIN_MODULE, None)
    # monkeypatch restores `_plugins_loaded` and sys.path after this


def test_entry_point_plugin_is_found(plugin_distribution: Path) -> None:
    assert PLUGIN_NAME not in POLICIES
    policy = create_policy(f"{PLUGIN_NAME}:boost=2")
    assert type(policy).__name__ == "NewestFirstLRU"
    assert isinstance(policy, EvictionPolicy)
    assert policy.boost == 2.0  # type: ignore[attr-defined]
    overridden = create_policy(f"{PLUGIN_NAME}:boost=2", boost="3.25")  # keywords win, strings coerced
    assert overridden.boost == 3.25  # type: ignore[attr-defined]
    assert PLUGIN_NAME in available_policies()
    assert PLUGIN_NAME in available_policies(include_offline=False)
    with pytest.raises(PolicyParamError, match=r"boost=1\.5"):
        create_policy(PLUGIN_NAME, bost=1)


def test_entry_point_plugin_listed_before_any_lookup(plugin_distribution: Path) -> None:
    assert PLUGIN_NAME in available_policies()
    assert get_policy_class(PLUGIN_NAME).__name__ == "NewestFirstLRU"


def test_entry_point_that_is_not_a_policy_is_an_error(plugin_distribution: Path) -> None:
    (plugin_distribution / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {PLUGIN_MODULE}:NOT_A_POLICY\n"
    )
    with pytest.raises(UnknownPolicyError, match="not an EvictionPolicy subclass"):
        available_policies()


def test_plugin_registration_was_undone() -> None:
    """Runs after the plugin tests in file order: nothing of the plugin is left behind."""
    assert PLUGIN_NAME not in POLICIES
    assert PLUGIN_NAME not in available_policies()


# ---- one resolver ----------------------------------------------------------------------------


def test_resolve_policy_converts_once_for_every_caller() -> None:
    from engine_adapter.cache.block_allocator import BlockAllocator
    from engine_adapter.cache.cache_manager import CacheManager
    from sage_eviction import resolve_policy

    resolved = resolve_policy("slru:protected_threshold=3", 64, protected_ratio="0.5")
    assert resolved.params == {"protected_threshold": 3, "protected_ratio": 0.5}
    assert resolved.capacity == 64
    policy = resolved.build()
    assert type(policy) is get_policy_class("slru") and policy.capacity == 64
    # The cache reports exactly what the resolver read, and builds the policy with its own size.
    manager = CacheManager(
        BlockAllocator(16, 4), policy="slru:protected_threshold=3", policy_params={"protected_ratio": "0.5"}
    )
    assert manager.policy_params == resolved.params and manager.policy.capacity == 16


def test_capacity_is_the_caches_when_a_cache_gives_it() -> None:
    from sage_eviction import resolve_policy

    with pytest.raises(PolicyParamError, match="'capacity' is the cache's size"):
        resolve_policy("arc:capacity=5", 64)
    with pytest.raises(PolicyParamError, match="'capacity' is the cache's size"):
        resolve_policy("arc", 64, capacity=5)
    alone = resolve_policy("arc:capacity=5")  # a library user sizes the policy itself
    assert alone.capacity == 5 and alone.params == {}
