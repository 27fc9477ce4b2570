"""Extras a test module imports when a test first uses them, not when pytest collects the file.

pytest imports every test module to collect it, the quick loop's (`pytest -m "not slow"`)
included, so a module-level ``import transformers`` is paid by a run that deselects every test
that uses it: transformers with kvpress cost about 5 s of the quick loop's collection, the
official ``anthropic`` and ``openai`` clients 2 s more. ``transformers = lazy("transformers")`` is
a stand-in that imports the module on its first attribute access, inside the test (or fixture)
that needs it, with ``pytest.importorskip``: missing, the test skips, and under
``SAGE_REQUIRE_ALL=1`` (CI) that skip is a failure (tests/conftest.py), as a module-level
``importorskip`` was. Annotations naming the module (``anthropic.Anthropic``) are strings under
``from __future__ import annotations`` and never touch it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

__all__ = ["lazy"]


class _Lazy:
    """A module imported on first use (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        # pytest's collection probes every module-level name for its own attributes (fixture and
        # test markers, ``__test__``): private and dunder names are never the module's API here,
        # so they answer "absent" rather than import it.
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy {self._name}: {'imported' if self._module else 'not imported yet'}>"


def lazy(name: str) -> Any:
    """A stand-in for the module `name`, imported with `pytest.importorskip` on first use."""
    return _Lazy(name)
