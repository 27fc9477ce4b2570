"""The public traces shipped inside the package, by name: ``mooncake:conversation`` and the like.

The files are package data (``engine_adapter/sim/traces/``, gzipped, each folder with its
upstream licence; ``traces/README.md`` gives their provenance and checksums), so that a clone or
an installed wheel replays them with no network and no other folder: ``sage llm benchmark
--trace mooncake:conversation``. The readers take the ``.gz`` files as they are
(`engine_adapter.sim.trace_file.TraceLines`).

A name is ``FORMAT:KIND``; `is_trace_name` tells a name from a path (a file that exists is a
path, whatever it looks like), `shipped_trace` gives the file.

Standard library only; the CLI imports it inside ``sage llm benchmark`` to check ``--trace``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["SHIPPED_TRACES", "ShippedTrace", "is_trace_name", "shipped_trace", "trace_names"]

_NAME = re.compile(r"^(?P<format>mooncake|azure):(?P<kind>[a-z][a-z0-9_-]*)$")


@dataclass(frozen=True, slots=True)
class ShippedTrace:
    """One shipped trace.

    Attributes:
        name: Its name, ``FORMAT:KIND``.
        trace_format: ``mooncake`` or ``azure``: the reader it needs.
        file: Its path under ``engine_adapter/sim/traces/``.
        licence: The upstream licence (the file beside it in the folder).
        requests: Requests in it.
    """

    name: str
    trace_format: str
    file: str
    licence: str
    requests: int


_MOONCAKE, _AZURE = "mooncake/{}_trace.jsonl.gz", "azure_llm_2023/AzureLLMInferenceTrace_{}.csv.gz"
_APACHE, _CC_BY = "Apache-2.0", "CC-BY-4.0"

SHIPPED_TRACES: dict[str, ShippedTrace] = {
    t.name: t
    for t in (
        ShippedTrace("mooncake:conversation", "mooncake", _MOONCAKE.format("conversation"), _APACHE, 12_031),
        ShippedTrace("mooncake:synthetic", "mooncake", _MOONCAKE.format("synthetic"), _APACHE, 3_993),
        ShippedTrace("azure:code", "azure", _AZURE.format("code"), _CC_BY, 8_819),
        ShippedTrace("azure:conversation", "azure", _AZURE.format("conv"), _CC_BY, 19_366),
    )
}


def trace_names() -> list[str]:
    """The names of the shipped traces."""
    return list(SHIPPED_TRACES)


def is_trace_name(text: str) -> bool:
    """Whether `text` is written as a shipped trace's name (``FORMAT:KIND``) rather than a path;
    the caller checks first that no file of that name exists."""
    return _NAME.match(text) is not None


def shipped_trace(name: str) -> tuple[Path, ShippedTrace]:
    """The file of a shipped trace, and what it is.

    Raises:
        ValueError: An unknown name; the message lists the shipped ones.
        FileNotFoundError: The package was installed without its data.
    """
    trace = SHIPPED_TRACES.get(name)
    if trace is None:
        raise ValueError(f"no trace named {name!r} is shipped; shipped traces: {', '.join(SHIPPED_TRACES)}")
    path = Path(str(resources.files(__package__ or "engine_adapter.sim").joinpath("traces", trace.file)))
    if not path.is_file():
        raise FileNotFoundError(f"the shipped trace {name} is missing from the installed package: {path}")
    return path, trace
