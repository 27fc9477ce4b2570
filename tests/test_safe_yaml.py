"""`engine_adapter.safe_yaml`: loads as safe_load does, minus anchors and aliases, bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.safe_yaml import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    YAMLInputError,
    load_yaml_file,
    load_yaml_text,
    shorten,
)
from engine_adapter.serving.config import ConfigError, load_yaml
from engine_adapter.sim.cost_model import CostModel, CostModelError

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.floats(allow_nan=False)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(documents)
def test_anchor_free_documents_load_as_safe_load_loads_them(document: object) -> None:
    text = yaml.safe_dump(document)
    assert load_yaml_text(text) == yaml.safe_load(text)


def test_aliases_are_refused_before_they_expand() -> None:
    levels = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    started = time.perf_counter()
    with pytest.raises(YAMLInputError, match=r"line 1, column 5: anchor &a0 is not allowed"):
        load_yaml_text("\n".join(levels))
    assert time.perf_counter() - started < 1.0  # generous: refused while composing, nothing expanded
    with pytest.raises(YAMLInputError, match=r"alias \*x is not allowed"):
        load_yaml_text("a: *x\n")


def test_nesting_and_size_are_bounded(tmp_path: Path) -> None:
    assert load_yaml_text("[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH) is not None
    with pytest.raises(YAMLInputError, match=f"nested more than {MAX_YAML_DEPTH} levels"):
        load_yaml_text("[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1))
    with pytest.raises(YAMLInputError, match="nested"):
        load_yaml_text("a: " + "[" * 100_000)  # never a RecursionError
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * MAX_YAML_BYTES)
    with pytest.raises(YAMLInputError, match=f"at most {MAX_YAML_BYTES}"):
        load_yaml_file(big)


def test_every_yaml_reader_uses_it(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("x: &a [1, 2]\nnum_blocks: *a\n")
    with pytest.raises(ConfigError, match="anchor &a is not allowed"):
        load_yaml(bomb)
    with pytest.raises(CostModelError, match="anchor &a is not allowed"):
        CostModel.from_yaml(bomb)


def test_shorten_cuts_long_values() -> None:
    assert shorten("abc") == "'abc'"
    cut = shorten(["lol"] * 10_000)
    assert len(cut) <= 80 and cut.endswith("(70000 chars)")


def test_config_errors_name_long_values_briefly(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("num_blocks: [" + ", ".join(["lol"] * 10_000) + "]\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert "num_blocks" in str(info.value) and len(str(info.value)) < 250
