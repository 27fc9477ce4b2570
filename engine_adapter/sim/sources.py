"""Workloads by name, for the CLI: one entry point over the trace readers and the generators.

`load(source, path=..., **params)` reads a Mooncake or Azure trace, or generates a synthetic
workload or a preset, converting CLI strings by each builder's annotations.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from engine_adapter.sim.azure_trace import read_azure
from engine_adapter.sim.mooncake_trace import read_mooncake
from engine_adapter.sim.prefix_model import PrefixModel
from engine_adapter.sim.synthetic import (
    PRESETS,
    _annotations,
    _reject_unknown,
    preset,
    synthetic,
    synthetic_params,
)
from engine_adapter.sim.workloads import Workload, WorkloadError

__all__ = ["SOURCES", "load"]


SOURCES = ("mooncake", "azure", "synthetic")


def _coerce(what: str, name: str, value: Any, annotation: str) -> Any:
    """A CLI string turned into the type its annotation names; other values pass unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "None" in annotation and text.lower() in ("none", "null", ""):
        return None
    try:
        if annotation.startswith(("int", "float")):
            number = float(text) if annotation.startswith("float") else int(text)
            return number
        if "[float" in annotation:  # a list of weights: "0.5/0.3/0.2" (a comma may separate params)
            return tuple(float(item) for item in re.split(r"[/;\s]+", text) if item)
    except ValueError:
        raise WorkloadError(f"{what}: param {name}={value!r} is not a valid {annotation}") from None
    return value


def _checked_params(what: str, accepted: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
    _reject_unknown(accepted, params, what)
    return {name: _coerce(what, name, value, accepted[name]) for name, value in params.items()}


def load(source: str, *, path: str | Path | None = None, **params: Any) -> Workload:
    """A workload by source name, for the CLI.

    String values (as a CLI reads them) are converted to the param's type: numbers, ``none``
    for an optional param, and weights as ``0.5/0.3/0.2``.

    Args:
        source: `"mooncake"`, `"azure"`, `"synthetic"` or a preset name (`PRESETS`). A path
            ending in `.jsonl` or `.csv` (or either `.gz`) stands for `mooncake` or `azure` with
            that path.
        path: The trace file of `mooncake` and `azure`.
        **params: The source's keyword params; for `azure`, `limit` and the `PrefixModel`
            fields.

    Raises:
        WorkloadError: An unknown source or param, a missing path, or a bad trace.
    """
    if path is None and source.removesuffix(".gz").endswith((".jsonl", ".csv")):
        source, path = ("mooncake" if source.removesuffix(".gz").endswith(".jsonl") else "azure"), source
    if source in ("mooncake", "azure"):
        if path is None:
            raise WorkloadError(f"the {source} source needs a trace file path")
        if source == "mooncake":
            return read_mooncake(path, **_checked_params("mooncake", _annotations(read_mooncake), params))
        model_fields = {f.name: str(f.type) for f in fields(PrefixModel)}
        checked = _checked_params("azure", {"limit": "int | None", **model_fields}, params)
        limit = checked.pop("limit", None)
        return read_azure(path, prefix_model=PrefixModel(**checked), limit=limit)
    if path is not None:
        raise WorkloadError(f"the {source} source reads no file (got path {str(path)!r})")
    if source == "synthetic":
        return synthetic(**_checked_params("synthetic", synthetic_params(), params))
    if source in PRESETS:
        return preset(source, **_checked_params(f"preset {source!r}", _annotations(PRESETS[source]), params))
    known = ", ".join([*SOURCES, *sorted(PRESETS)])
    raise WorkloadError(f"unknown workload source {source!r}; sources: {known}")
