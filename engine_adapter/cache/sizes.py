"""Parse memory sizes: ``"2GiB"``, ``"512MiB"``, ``"1.5G"``, ``"4096"`` or a plain int of bytes.

Imports nothing of the cache."""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """A size in bytes from an int or a string with an optional unit.

    Decimal units (``k``, ``M``, ``GB``) are powers of 1000, binary ones (``KiB``, ``MiB``,
    ``GiB``, ``TiB``) powers of 1024; the unit is case-insensitive.

    Raises:
        ValueError: Not a size, negative, or an unknown unit; the message names the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value!r} is negative")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ValueError(f"size {value!r} is not a non-negative number of bytes")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"size {value!r} is not a number of bytes or a string like '2GiB'")
    match = _PATTERN.match(value)
    if match is None:
        raise ValueError(f"size {value!r} is not of the form <number>[unit], e.g. '2GiB' or '512MiB'")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"size {value!r}: unknown unit {unit!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return int(float(number) * factor)


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps the number >= 1, e.g. ``'1.5 GiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024.0:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024.0
    return f"{size:.1f} TiB"
