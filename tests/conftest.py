"""Shared fixtures: the registered policies, how to build one, and the hypothesis profiles.

Profiles (`HYPOTHESIS_PROFILE=...`): `ci` (the default: 100 examples, no deadline, since CI
machines are slow and shared), `dev` (20 examples: the quick loop, `pytest -m "not slow"`, takes
it unless told otherwise) and `thorough` (1000 examples).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from sage_eviction import EvictionPolicy, available_policies, create_policy, get_policy_class, native

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """The quick loop (`pytest -m "not slow"`) draws the `dev` profile's fewer examples, unless
    HYPOTHESIS_PROFILE says otherwise; the full run keeps `ci`'s."""
    if "not slow" in (config.option.markexpr or "") and "HYPOTHESIS_PROFILE" not in os.environ:
        settings.load_profile("dev")


COMPILED_CORE_MISSING = (
    "the compiled core is not built (python setup.py build_ext --inplace) or SAGE_PURE_PYTHON is set"
)


def compiled_core_built() -> bool:
    """Whether the policies' compiled core (sage_eviction/_core.pyx) loads here."""
    return native.load(native.CORE) is not None


@pytest.fixture(params=["compiled", "pure-python"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each implementation of the policies in turn: policies built during the test use the
    compiled core, then the pure-Python reference (the compiled run skips where it is not
    built)."""
    if request.param == "compiled":
        if not compiled_core_built():
            pytest.skip(COMPILED_CORE_MISSING)
        yield "compiled"
    else:
        with native.pure_python():
            yield "pure-python"


CAPACITY = 64  # blocks, for the policies that need a capacity

ONLINE_POLICIES = available_policies(include_offline=False)
OFFLINE_POLICIES = sorted(set(available_policies()) - set(ONLINE_POLICIES))


def build_policy(name: str, capacity: int = CAPACITY, **params: Any) -> EvictionPolicy:
    """`create_policy(name)` with `capacity` given only to the policies that need one."""
    needs = get_policy_class(name).needs_capacity
    return create_policy(name, capacity=capacity if needs else None, **params)


def policy_capacity(name: str, capacity: int = CAPACITY) -> int | None:
    """The capacity `build_policy` passes to `name`: `capacity` or None."""
    return capacity if get_policy_class(name).needs_capacity else None


@pytest.fixture(params=ONLINE_POLICIES)
def policy_name(request: pytest.FixtureRequest) -> str:
    """Each registered online policy in turn."""
    name: str = request.param
    return name


@pytest.fixture
def policy(policy_name: str) -> EvictionPolicy:
    """A fresh, empty instance of each registered online policy."""
    return build_policy(policy_name)
