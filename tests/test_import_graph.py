"""The layering (docs/architecture.md, "Layers"): `sage_eviction` stands alone (no torch)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sage_eviction

PACKAGE_DIR = Path(sage_eviction.__file__).resolve().parent
FORBIDDEN = ("torch", "engine_adapter", "sage_cli")
# The modules a user of the library imports.
ENTRY_MODULES = ["sage_eviction", "sage_eviction.policies", "sage_eviction.registry", "sage_eviction.flat"]
# The torch-free layers of the engine, and the layers each must not load: the cache core, and
# the simulator over it (docs/architecture.md, "Layers").
_ABOVE_CACHE = ("engine_adapter.model", "engine_adapter.serving", "engine_adapter.sim")
TORCH_FREE = {
    "engine_adapter.cache.cache_manager": _ABOVE_CACHE,
    "engine_adapter.cache.events": _ABOVE_CACHE,
    "engine_adapter.sim.simulator": ("engine_adapter.model", "engine_adapter.serving"),
    "engine_adapter.sim.benchmark": ("engine_adapter.model", "engine_adapter.serving"),
}

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import sage_eviction
sage_eviction.available_policies()  # loads the entry-point plugins too
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(*modules: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE_DIR.parent,
        timeout=120,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_importing_the_library_loads_no_engine_cli_or_torch(module: str) -> None:
    loaded = _loaded_by(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert not leaked, f"import {module} loads {leaked}"


@pytest.mark.parametrize("module", sorted(TORCH_FREE))
def test_the_torch_free_layers_load_no_torch_and_no_layer_above(module: str) -> None:
    loaded = _loaded_by(module)
    leaked = sorted(m for m in loaded if m == "torch" or m.startswith(TORCH_FREE[module]))
    assert not leaked, f"import {module} loads {leaked}"


def _imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(module, line, at module level) of every import in `tree`."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top_level) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, child.lineno, top_level))
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, top_level and not nested)

    visit(tree, True)
    return found


SOURCES = sorted(PACKAGE_DIR.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_sources_import_no_engine_or_cli_and_no_torch_at_module_level(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = []
    for module, line, top_level in _imports(tree):
        root = module.split(".")[0]
        if root in ("engine_adapter", "sage_cli"):
            bad.append(f"line {line}: imports {module}")
        elif root == "torch" and top_level:
            bad.append(f"line {line}: imports torch at module level")
    assert not bad, f"{path.name}: " + "; ".join(bad)


def test_the_ast_scan_sees_every_kind_of_import() -> None:
    tree = ast.parse(
        "import os, torch.nn\n"
        "from engine_adapter.model.kv_pool import Pool\n"
        "from . import base\n"
        "def f():\n"
        "    import torch\n"
        "class C:\n"
        "    import sage_cli\n"
    )
    assert _imports(tree) == [
        ("os", 1, True),
        ("torch.nn", 1, True),
        ("engine_adapter.model.kv_pool", 2, True),
        ("torch", 5, False),
        ("sage_cli", 7, True),
    ]
