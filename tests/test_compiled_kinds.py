"""The one table of compiled kinds (`sage_eviction.compiled_kinds`, issue 50, item 6): every
compiled home's own table of policies equals what it says, so a kind registered in one home and
not in the table (or the other way round) fails here."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.sim import radix_run
from engine_adapter.sim.cache_models import RadixBelady
from sage_eviction import native
from sage_eviction.compiled_kinds import (
    C_CODES,
    C_KINDS,
    COMPILED_KINDS,
    HOMES,
    NO_ORDER,
    c_codes,
    compiled_in,
)
from sage_eviction.policies import POLICIES

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_kinds  # noqa: E402 - scripts/gen_kinds.py, the dispatch's generator


def _core() -> Any:
    core = native.load(native.CORE)
    if core is None:
        pytest.skip("the compiled core is not built here")
    return core


def test_every_listed_kind_is_a_built_in_policy() -> None:
    assert set(COMPILED_KINDS) <= set(POLICIES)
    assert all(any(getattr(kind, home) for home in HOMES) for kind in COMPILED_KINDS.values())


def test_the_engines_compiled_operations_run_exactly_the_ops_kinds() -> None:
    assert _core().compiled_policies() == sorted(compiled_in("ops"))


def test_the_flat_state_runs_exactly_the_flat_kinds() -> None:
    assert _core().flat_state_policies() == sorted(compiled_in("flat"))


def test_the_radix_loop_runs_exactly_the_radix_kinds_each_with_its_codes() -> None:
    assert radix_run.compiled_policies() == compiled_in("radix")
    assert set(radix_run._CODES) == set(compiled_in("radix"))
    for name in compiled_in("radix"):
        cls = RadixBelady if name == "belady" else POLICIES[name]
        assert radix_run.policy_kind(cls) == radix_run._CODES[name]
    assert radix_run.policy_kind(POLICIES["belady"]) is None  # the radix model's Belady only


def test_an_unknown_home_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compiled home 'gpu'"):
        compiled_in("gpu")  # type: ignore[arg-type]


def test_the_generated_dispatch_is_the_table() -> None:
    """sage_eviction/_kinds.pxi is what scripts/gen_kinds.py makes of `C_KINDS` now."""
    assert gen_kinds.OUT.read_text() == gen_kinds.render(), f"stale: run {gen_kinds.REGENERATE}"


def test_every_kind_has_its_file_and_every_code_its_kind() -> None:
    names = {kind.name for kind in C_KINDS}
    assert len(names) == len(C_KINDS) and len({kind.code for kind in C_KINDS}) == len(C_KINDS)
    assert NO_ORDER not in {kind.code for kind in C_KINDS}
    for kind in C_KINDS:
        text = (ROOT / "sage_eviction" / f"_kind_{kind.file}.pxi").read_text()
        hooks = ["init", "free", "insert", "access", "evictable", "pop"] + ["prepare"] * kind.prepare
        for hook in hooks:
            assert f" _{kind.prefix}_{hook}(Nodes* t" in text, (kind.name, hook)
        assert kind.serve is None or f" {kind.serve}(Nodes* t" in text
    assert {kind for kind, _ in C_CODES.values()} <= names
    assert set(C_CODES) == set(compiled_in("radix")) | (set(compiled_in("flat")) - {"belady"})
    for name in C_CODES:
        assert c_codes(name)[0] in {kind.code for kind in C_KINDS}


def test_the_generator_says_when_the_file_is_stale(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "_kinds.pxi"
    stale.write_text(gen_kinds.render().replace("P_ARC = 5", "P_ARC = 6"))
    monkeypatch.setattr(gen_kinds, "OUT", stale)
    assert gen_kinds.main(["--check"]) == 1
    assert gen_kinds.main([]) == 0 and gen_kinds.main(["--check"]) == 0
