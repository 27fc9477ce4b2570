"""Each package's docstring names every module and subpackage in it (the house rule: a newcomer
finds the file for each idea from the package's own page), so a new file cannot land unlisted."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(
    init.parent
    for top in ("sage_eviction", "engine_adapter", "sage_cli")
    for init in (ROOT / top).glob("**/__init__.py")
)
# Entry points that are not ideas of their own.
NOT_LISTED = {"__init__.py", "__main__.py"}


def unlisted(package: Path) -> list[str]:
    """The modules (``x.py``) and subpackages (``x/``) of `package` its docstring does not name."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    modules = [p.name for p in sorted(package.glob("*.py")) if p.name not in NOT_LISTED]
    subpackages = [p.name for p in sorted(package.iterdir()) if (p / "__init__.py").exists()]
    return [m for m in modules if not named(m, doc)] + [f"{s}/" for s in subpackages if not named(s, doc)]


def named(name: str, doc: str) -> bool:
    """`name` (``x.py`` or ``x``) stands in `doc` as ``x.py`` or as the word ``x``."""
    stem = name.removesuffix(".py")
    return name in doc or re.search(rf"(?<![\w.]){re.escape(stem)}(?![\w])", doc) is not None


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_named_in_its_package_docstring(package: Path) -> None:
    assert not unlisted(package), f"{package.relative_to(ROOT)}/__init__.py does not name {unlisted(package)}"


def test_an_unlisted_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""Listed: a.py."""\n', encoding="utf-8")
    (tmp_path / "a.py").write_text("", encoding="utf-8")
    (tmp_path / "b.py").write_text("", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("", encoding="utf-8")
    assert unlisted(tmp_path) == ["b.py", "sub/"]
