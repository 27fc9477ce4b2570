"""A policy plugin that cannot be imported (issue 48, item 11): its lookup is a `PolicyLoadError`
that says why, a 400 at the engine (tests/test_fresh_engine.py), and it breaks no other lookup;
a plugin installed after the registry looked is found when it is first named."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sage_eviction import ENTRY_POINT_GROUP, PolicyConfigError, PolicyLoadError, get_policy_class
from sage_eviction import registry as registry_module
from sage_eviction.policies import POLICIES


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry_module, "_plugins_loaded", False)
    monkeypatch.setattr(registry_module, "_UNLOADABLE", {})
    try:
        yield tmp_path
    finally:
        POLICIES.pop("h48late", None)
        sys.modules.pop("h48late_policy", None)


def _install(site: Path, lines: str) -> None:
    dist = site / "h48-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: h48\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def test_a_broken_plugin_is_a_load_error_and_breaks_no_other(site: Path) -> None:
    _install(site, "h48broken = no_such_module_h48:Policy\n")
    assert get_policy_class("lru").name == "lru"
    with pytest.raises(PolicyLoadError, match=r"policy 'h48broken' could not be loaded: ModuleNotFoundError"):
        get_policy_class("h48broken")
    assert issubclass(PolicyLoadError, PolicyConfigError)  # what the engine answers with a 400


def test_a_plugin_installed_after_the_registry_looked_is_found(site: Path) -> None:
    registry_module.available_policies()  # the registry has looked: nothing there yet
    (site / "h48late_policy.py").write_text(
        "from sage_eviction.policies.lru import LRUPolicy\n\n\n"
        "class Late(LRUPolicy):\n    '''LRU, installed late.'''\n\n    name = 'h48late'\n"
    )
    _install(site, "h48late = h48late_policy:Late\n")
    assert get_policy_class("h48late").__name__ == "Late"
