"""The one table of compiled kinds (`sage_eviction.compiled_kinds`, issue 50, item 6): every
compiled home's own table of policies equals what it says, so a kind registered in one home and
not in the table (or the other way round) fails here."""

from __future__ import annotations

from typing import Any

import pytest

from engine_adapter.sim import radix_run
from engine_adapter.sim.cache_models import RadixBelady
from sage_eviction import native
from sage_eviction.compiled_kinds import COMPILED_KINDS, HOMES, compiled_in
from sage_eviction.policies import POLICIES


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
