"""The layering (docs/architecture.md, "Layers"), checked two ways.

- In fresh interpreters: what importing a layer actually loads (`sys.modules`), through every
  package `__init__` and lazy registry on the way.
- In the sources (AST): which file imports what, so that a failure names the file and line.

The rules:

- `sage_eviction` stands alone: it imports only the standard library and itself, never torch,
  `engine_adapter` or `sage_cli`, not even inside a function. The one exception: the engine
  integrations (`sage_eviction/integrations/`) import their engine (vLLM, SGLang, LMCache)
  inside the functions that patch it, never at import time.
- `engine_adapter.cache` (the cache core) and `engine_adapter.sim` (the simulator) never import
  torch; the cache core imports none of `model`, `serving`, `sim`; the simulator neither `model`
  nor `serving`. `engine_adapter.colocation` (the colocation controller, which both the
  simulator and the engine call) imports none of torch, `model`, `serving`, `sim`.
- `sage_cli` loads neither torch nor `engine_adapter` when its modules are imported and its
  command tree is built (what `sage --help` and the light commands do), with one exception:
  `engine_adapter.paths` (standard library only, where an engine's files live) and so the empty
  package `engine_adapter`; `engine start` and `benchmark` import the engine inside their functions.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sage_eviction

REPO = Path(sage_eviction.__file__).resolve().parent.parent
_CACHE = ("engine_adapter.cache",)
_ABOVE_CACHE = ("engine_adapter.model", "engine_adapter.serving", "engine_adapter.sim")
_ABOVE_SIM = ("engine_adapter.model", "engine_adapter.serving")
_ABOVE_COLOCATION = ("engine_adapter.model", "engine_adapter.serving", "engine_adapter.sim")
_ENGINES = ("vllm", "sglang", "lmcache")  # what sage_eviction/integrations may import, lazily
# What the CLI may load of the engine at import time: exactly these modules, nothing below them;
# in the sources, only as ``from engine_adapter.paths import ...`` (``from engine_adapter import x``
# could name any subpackage).
_CLI_ALLOWED = frozenset({"engine_adapter", "engine_adapter.paths"})
_CLI_ALLOWED_IMPORT = "engine_adapter.paths"


def _modules(package: str) -> list[str]:
    """The dotted names of a package's modules, found on disk (a new module is checked too)."""
    folder = REPO / package.replace(".", "/")
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":  # importing it runs the app
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _sources(package: str) -> list[Path]:
    return sorted((REPO / package.replace(".", "/")).rglob("*.py"))


def _is(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# --------------------------------------------------------------------------------------------
# What importing loads, in fresh interpreters

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
if "sage_eviction" in sys.modules:
    sys.modules["sage_eviction"].available_policies()  # loads the entry-point plugins too
if "sage_cli.app" in sys.modules:
    sys.modules["sage_cli.app"].build_command()  # the whole command tree, as `sage --help` builds it
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(*modules: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


# The modules a user of the library imports.
LIBRARY_ENTRY_MODULES = [
    "sage_eviction",
    "sage_eviction.integrations",
    "sage_eviction.integrations.vllm",
    "sage_eviction.integrations.lmcache",
    "sage_eviction.integrations.sglang",
    "sage_eviction.policies",
    "sage_eviction.registry",
    "sage_eviction.flat",
]

# Each layer (all its modules at once) and what it must never load.
LAYERS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "cache core": (_modules("engine_adapter.cache"), ("torch", *_ABOVE_CACHE)),
    "simulator": (_modules("engine_adapter.sim"), ("torch", *_ABOVE_SIM)),
    "colocation": (_modules("engine_adapter.colocation"), ("torch", *_ABOVE_COLOCATION)),
    "CLI": (_modules("sage_cli"), ("torch", "engine_adapter")),
}


def test_the_layers_have_the_modules_the_checks_expect() -> None:
    # A moved package would leave the checks below with nothing to import, passing vacuously.
    assert "engine_adapter.cache.cache_manager" in LAYERS["cache core"][0]
    assert "engine_adapter.cache.block_allocator" in LAYERS["cache core"][0]
    assert "engine_adapter.sim.simulator" in LAYERS["simulator"][0]
    assert "engine_adapter.sim.benchmark" in LAYERS["simulator"][0]
    assert "engine_adapter.colocation.controller" in LAYERS["colocation"][0]
    assert {"sage_cli.app", "sage_cli.client", "sage_cli.eviction"} <= set(LAYERS["CLI"][0])


@pytest.mark.parametrize("module", LIBRARY_ENTRY_MODULES)
def test_importing_the_library_loads_no_engine_cli_or_torch(module: str) -> None:
    loaded = _loaded_by(module)
    leaked = sorted(m for m in loaded if _is(m, ("torch", "engine_adapter", "sage_cli", *_ENGINES)))
    assert not leaked, f"import {module} loads {leaked}"


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_loads_no_torch_and_no_layer_above_it(layer: str) -> None:
    modules, forbidden = LAYERS[layer]
    allowed = _CLI_ALLOWED if layer == "CLI" else frozenset()
    loaded = _loaded_by(*modules)
    assert set(modules) <= loaded
    leaked = sorted(m for m in loaded if _is(m, forbidden) and m not in allowed)
    assert not leaked, f"importing the {layer} ({', '.join(modules)}) loads {leaked}"


# --------------------------------------------------------------------------------------------
# Which file imports what


_TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(module, line, runs at import) of every absolute import in `tree`.

    An import runs at import time unless it sits in a function or lambda body or under
    ``if TYPE_CHECKING:``.
    """
    found: list[tuple[str, int, bool]] = []

    def visit(nodes: list[ast.AST], at_import: bool) -> None:
        for child in nodes:
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, at_import) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, child.lineno, at_import))
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(list(ast.iter_child_nodes(child)), False)
            elif isinstance(child, ast.If) and ast.unparse(child.test) in _TYPE_CHECKING:
                visit(list(child.body), False)
                visit(list(child.orelse), at_import)
            else:
                visit(list(ast.iter_child_nodes(child)), at_import)

    visit([tree], True)
    return found


def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _ids(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", _sources("sage_eviction"), ids=_ids)
def test_the_library_imports_only_the_standard_library_and_itself(path: Path) -> None:
    integration = path.is_relative_to(REPO / "sage_eviction" / "integrations")
    bad = [
        f"line {line}: imports {module}" + (" at import time" if at_import else "")
        for module, line, at_import in _imports(_parse(path))
        if module.split(".")[0] not in sys.stdlib_module_names
        and not _is(module, ("sage_eviction",))
        and not (integration and not at_import and _is(module, _ENGINES))
    ]
    assert not bad, f"{_ids(path)}: " + "; ".join(bad)


@pytest.mark.parametrize(
    ("path", "forbidden"),
    [pytest.param(p, ("torch", *_ABOVE_CACHE), id=_ids(p)) for p in _sources("engine_adapter.cache")]
    + [pytest.param(p, ("torch", *_ABOVE_SIM), id=_ids(p)) for p in _sources("engine_adapter.sim")]
    + [
        pytest.param(p, ("torch", *_ABOVE_COLOCATION), id=_ids(p))
        for p in _sources("engine_adapter.colocation")
    ],
)
def test_the_cache_core_and_the_simulator_never_import_torch_or_a_layer_above(
    path: Path, forbidden: tuple[str, ...]
) -> None:
    # Not even lazily or for type checking: the layers below know nothing of those above.
    bad = [f"line {line}: imports {m}" for m, line, _ in _imports(_parse(path)) if _is(m, forbidden)]
    assert not bad, f"{_ids(path)}: " + "; ".join(bad)


@pytest.mark.parametrize("path", _sources("sage_cli"), ids=_ids)
def test_the_cli_imports_torch_and_the_engine_only_where_a_command_needs_them(path: Path) -> None:
    bad = [
        f"line {line}: imports {m} at import time"
        for m, line, at_import in _imports(_parse(path))
        if at_import and _is(m, ("torch", "engine_adapter")) and m != _CLI_ALLOWED_IMPORT
    ]
    assert not bad, f"{_ids(path)}: " + "; ".join(bad)


_CLI_GROUPS = ("sage_cli.engine", "sage_cli.eviction", "sage_cli.benchmark")


def _group(module: str) -> str | None:
    return next((g for g in _CLI_GROUPS if _is(module, (g,))), None)


@pytest.mark.parametrize("path", _sources("sage_cli"), ids=_ids)
def test_a_cli_group_imports_no_other_and_the_shared_modules_none(path: Path) -> None:
    # sage_cli/__init__.py: the root app imports the groups; a group imports the shared modules
    # and its own; a shared module imports no group.
    parts = path.relative_to(REPO).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    if module == "sage_cli.app":
        return
    own = _group(module)
    bad = [
        f"line {line}: imports {m}"
        for m, line, _ in _imports(_parse(path))
        if _group(m) is not None and _group(m) != own
    ]
    assert not bad, f"{_ids(path)}: " + "; ".join(bad)


def test_the_ast_scan_sees_every_kind_of_import() -> None:
    tree = ast.parse(
        "import os, torch.nn\n"
        "from engine_adapter.model.kv_pool import Pool\n"
        "from . import base\n"
        "def f():\n"
        "    import torch\n"
        "class C:\n"
        "    import sage_cli\n"
        "if TYPE_CHECKING:\n"
        "    from engine_adapter.serving.config import EngineConfig\n"
        "else:\n"
        "    import json\n"
        "if sys.version_info >= (3, 11):\n"
        "    import tomllib\n"
    )
    assert _imports(tree) == [
        ("os", 1, True),
        ("torch.nn", 1, True),
        ("engine_adapter.model.kv_pool", 2, True),
        ("torch", 5, False),
        ("sage_cli", 7, True),
        ("engine_adapter.serving.config", 9, False),
        ("json", 11, True),
        ("tomllib", 13, True),
    ]


def test_the_rules_catch_a_forbidden_import() -> None:
    # The checks above must be able to fail: a prefix match that is too strict or too loose
    # would pass every file.
    assert _is("engine_adapter.model.kv_pool", _ABOVE_CACHE)
    assert _is("torch", ("torch",)) and _is("torch.nn", ("torch",))
    assert not _is("torchvision", ("torch",))
    assert not _is("engine_adapter.cache.errors", _ABOVE_CACHE)
    assert not _is("engine_adapter.paths", _ABOVE_SIM)
    # The CLI's exception is these two modules exactly, not what lies below them.
    assert "engine_adapter.serving" not in _CLI_ALLOWED and _CLI_ALLOWED_IMPORT in _CLI_ALLOWED


# --------------------------------------------------------------------------------------------
# The same rules as import-linter contracts (pyproject.toml, [tool.importlinter]), which CI runs
# as `lint-imports`; here so that `pytest` fails on a broken contract too. No cycle between
# sibling packages or modules at any depth is one of them (`acyclic_siblings`).


def test_the_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), "import-linter is not installed (it is in the dev extra)"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_import_linter_contracts_catch_a_cycle(tmp_path: Path) -> None:
    # A contract that can never break tests nothing: plant a cycle in a copy of the library.
    copy = tmp_path / "sage_eviction"
    shutil.copytree(REPO / "sage_eviction", copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    errors = copy / "errors.py"  # registry imports errors; now errors imports registry
    errors.write_text(errors.read_text() + "\nfrom sage_eviction import registry\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = sage_eviction\n\n"
        "[importlinter:contract:cycles]\nname = no cycles\ntype = acyclic_siblings\n"
        "ancestors = sage_eviction\n"
    )
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout[-2000:]
