"""`__all__` says what the package exports, no more and no less (httpx's test_exported_members)."""

from __future__ import annotations
import __future__

import importlib
import pkgutil
import types

import pytest

import sage_eviction
import sage_eviction.policies


def _public_names(module: types.ModuleType) -> set[str]:
    """Names a user sees on `module`: not private, not a submodule, not `from __future__`."""
    names = set()
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType | __future__._Feature):
            continue
        names.add(name)
    return names


def _submodules() -> list[str]:
    return sorted(
        info.name for info in pkgutil.walk_packages(sage_eviction.__path__, prefix="sage_eviction.")
    )


def test_all_equals_the_public_names() -> None:
    exported = set(sage_eviction.__all__)
    assert len(exported) == len(sage_eviction.__all__), "__all__ lists a name twice"
    assert exported == _public_names(sage_eviction) | {"__version__"}


def test_every_exported_name_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from sage_eviction import *", namespace)
    missing = set(sage_eviction.__all__) - set(namespace)
    assert not missing
    for name in sage_eviction.__all__:
        assert getattr(sage_eviction, name) is namespace[name]


@pytest.mark.parametrize("module_name", _submodules())
def test_submodule_all_names_exist(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        pytest.skip(f"{module_name} has no __all__")
    assert len(set(exported)) == len(exported), f"{module_name}.__all__ lists a name twice"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names what it does not define: {missing}"


def test_every_registered_policy_class_is_exported_by_the_policies_package() -> None:
    exported = set(sage_eviction.policies.__all__)
    for name, cls in sage_eviction.policies.POLICIES.items():
        assert cls.__name__ in exported, f"policy {name!r} ({cls.__name__}) missing from policies.__all__"
        assert cls.name == name, f"POLICIES[{name!r}] is a class named {cls.name!r}"
