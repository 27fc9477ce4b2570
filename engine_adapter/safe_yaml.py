"""YAML from users' files, read so that a hostile file cannot blow up memory or the stack.

PyYAML's ``safe_load`` already refuses arbitrary Python objects, but it still expands aliases:
ten levels of ``&a [*b, *b, ...]`` (a "billion laughs") make a few hundred bytes into billions of
list items, and a deeply nested flow sequence exhausts the recursion limit. sage's YAML files
(engine configs, cost models, benchmark settings) are small mappings that never need an alias,
so the loader here refuses anchors and aliases outright, bounds the file size and the nesting
depth, and reports every failure as one `YAMLInputError` line with the line and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "YAMLInputError",
    "load_yaml_file",
    "load_yaml_text",
    "shorten",
]

MAX_YAML_BYTES = 1 << 20
"""A config or cost model is a few hundred bytes; a megabyte is far beyond any real one."""

MAX_YAML_DEPTH = 32
"""Nesting depth of collections; sage's files go three levels deep (``policy_params: {k: [v]}``)."""


class YAMLInputError(ValueError):
    """A YAML file or text that cannot be read safely; the message is one line."""


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to `limit` characters, so that an error names a value, not dumps it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    suffix = f"... ({len(text)} chars)"
    return text[: max(limit - len(suffix), 1)] + suffix


def _refuse(problem: str, event: Any) -> None:
    raise yaml.composer.ComposerError(None, None, problem, event.start_mark)


class _NoAliasLoader(yaml.SafeLoader):
    """A SafeLoader that refuses anchors and aliases and bounds the nesting depth while composing.

    The checks sit in the composer, before any node is constructed, so nothing is ever expanded.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            _refuse(f"alias *{event.anchor} is not allowed (sage's YAML files take no anchors)", event)
        if getattr(event, "anchor", None) is not None:
            _refuse(f"anchor &{event.anchor} is not allowed (sage's YAML files take no anchors)", event)
        nests = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if nests:
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                _refuse(f"nested more than {MAX_YAML_DEPTH} levels deep", event)
        try:
            return super().compose_node(parent, index)
        finally:
            if nests:
                self._depth -= 1


def load_yaml_text(text: str) -> Any:
    """The document in `text`, loaded safely (see the module docstring).

    Raises:
        YAMLInputError: Not valid YAML, an anchor or alias, or nested too deep; the message
            carries the line and column.
    """
    if len(text) > MAX_YAML_BYTES:
        raise YAMLInputError(f"{len(text)} characters; a YAML file here holds at most {MAX_YAML_BYTES}")
    loader = _NoAliasLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YAMLInputError(f"{at}{problem}") from None
    except RecursionError:  # a scanner or parser path the depth check does not reach
        raise YAMLInputError(f"nested too deeply (the limit is {MAX_YAML_DEPTH} levels)") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path) -> Any:
    """The document in the file at `path`, loaded safely; the size is checked before reading.

    Raises:
        YAMLInputError: See `load_yaml_text`; also a file over `MAX_YAML_BYTES`.
        OSError, UnicodeDecodeError: The file cannot be read as UTF-8 text.
    """
    file = Path(path).expanduser()
    size = file.stat().st_size
    if size > MAX_YAML_BYTES:
        raise YAMLInputError(f"{size} bytes; a YAML file here holds at most {MAX_YAML_BYTES}")
    return load_yaml_text(file.read_text(encoding="utf-8"))
