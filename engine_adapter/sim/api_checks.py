"""The library's arguments checked in the library's words: `simulate`'s policies, capacities and
options, with errors that name the Python argument (``capacity_ratios=``), not the CLI's flag.

`policy_specs` turns what a notebook passes (a comma-separated string, specs, policy classes
and instances) into the specs the sweep runs, registering the classes for the session
(`sage_eviction.register_policy`: the one registry). Imports `sage_eviction` and the benchmark's
options record only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import fields
from numbers import Integral, Real
from typing import Any

from engine_adapter.sim.benchmark import BenchmarkError, SimBenchmarkOptions
from sage_eviction.base import EvictionPolicy
from sage_eviction.policies import POLICIES
from sage_eviction.registry import is_session_policy, policy_params, register_policy, split_specs

__all__ = ["check_capacities", "check_options", "policy_specs"]

# What `simulate` takes as its own arguments, and the options it passes by other names.
_OWN = ("trace", "policies", "capacities", "capacity_ratios", "cache_model", "jobs")
_RENAMED = {"capacity_blocks": "capacities", "capacity_ratio": "capacity_ratios", "capacity": None}


def check_options(options: dict[str, Any]) -> None:
    """`simulate`'s ``**options``: each a field of `SimBenchmarkOptions`.

    Raises:
        TypeError: An unknown option; the message names the nearest (``capacity`` ->
            ``capacities`` or ``capacity_ratios``).
    """
    own = ("policies", "capacity_blocks", *_OWN)
    known = [field.name for field in fields(SimBenchmarkOptions) if field.name not in own]
    for name in options:
        if name in known:
            continue
        if name in _RENAMED:
            hint = _RENAMED[name] or "capacities (blocks) or capacity_ratios (shares of the distinct blocks)"
        else:
            close = difflib.get_close_matches(name, [*known, *_OWN], n=2)
            hint = " or ".join(close)
        guess = f"; did you mean {hint}?" if hint else f"; options: {', '.join(sorted(known))}"
        raise TypeError(f"simulate() got an unexpected keyword argument {name!r}{guess}")


def _numbers(value: object, name: str, example: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list, e.g. {name}={example}, not {value!r}")
    items = list(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, Real):
            raise TypeError(f"{name} must hold numbers, e.g. {name}={example}; got {item!r}")
    return items


def check_capacities(
    capacities: object, capacity_ratios: object
) -> tuple[list[int] | None, list[float] | None]:
    """`simulate`'s cache sizes: block counts or fractions of the distinct blocks, not both.

    Raises:
        TypeError: Not a list of numbers (``capacities=1000``).
        BenchmarkError: Both given; a fraction among the block counts (it points to
            `capacity_ratios`); a count below 1; a ratio outside (0, 1].
    """
    if capacities is not None and capacity_ratios is not None:
        raise BenchmarkError(
            "give capacities (cache sizes in blocks) or capacity_ratios (shares of the distinct blocks), "
            "not both"
        )
    blocks: list[int] | None = None
    if capacities is not None:
        values = _numbers(capacities, "capacities", "[1000, 2000]")
        for value in values:
            if not isinstance(value, Integral) and not float(value).is_integer():
                hint = f"; for a share of the distinct blocks give capacity_ratios=[{value!r}]"
                raise BenchmarkError(
                    f"capacities=[{value!r}]: a cache size is a whole number of blocks"
                    + (hint if 0 < value < 1 else "")
                )
            if value < 1:
                raise BenchmarkError(f"capacities=[{value!r}]: a cache holds at least 1 block")
        blocks = [int(value) for value in values]
    ratios: list[float] | None = None
    if capacity_ratios is not None:
        values = _numbers(capacity_ratios, "capacity_ratios", "[0.05, 0.1]")
        for value in values:
            if not 0.0 < value <= 1.0:
                raise BenchmarkError(
                    f"capacity_ratios=[{value!r}]: a fraction of the distinct blocks is in (0, 1]"
                    + ("; for a size in blocks give capacities" if value > 1 else "")
                )
        ratios = [float(value) for value in values]
    return blocks, ratios


def _instance_spec(policy: EvictionPolicy) -> str:
    """An instance as its class's spec with the params it was built with (read back from the
    attributes named after its constructor's params, as every built-in keeps them)."""
    cls = type(policy)
    name = _class_spec(cls)
    params: list[str] = []
    for pname, param in policy_params(cls).items():
        if pname == "capacity":
            continue  # each row's cache gives its own
        if not hasattr(policy, pname):
            raise TypeError(
                f"{cls.__qualname__} instance: its param {pname!r} is not readable as an attribute; "
                f"pass the class or a spec ({name}:{pname}=...) instead"
            )
        value = getattr(policy, pname)
        if value != param.default:
            params.append(f"{pname}={'none' if value is None else value}")
    return f"{name}:{','.join(params)}" if params else name


def _class_spec(cls: type[EvictionPolicy]) -> str:
    """A class's registry name: a built-in's or a plugin's, or registered now for the session."""
    own = cls.__dict__.get("name")
    if own and POLICIES.get(own) is cls:
        return str(own)
    return register_policy(cls).name


def policy_specs(policies: object, jobs: int | None = 1, ray_address: str | None = None) -> list[str]:
    """`simulate`'s `policies` as specs: a comma-separated string split (``"lru,arc"``), each
    string item split the same way, classes and instances named (and registered).

    Raises:
        TypeError: Something that is none of these.
        ValueError: A class whose name a built-in policy has (`register_policy`).
        BenchmarkError: No policy, or a class of the session with worker processes or Ray
            (they know the policies of installed packages only).
    """
    one = isinstance(policies, str | type | EvictionPolicy) or not isinstance(policies, Iterable)
    items: list[object] = [policies] if one else list(policies)  # type: ignore[call-overload]
    specs: list[str] = []
    for item in items:
        if isinstance(item, str):
            specs.extend(split_specs(item))
        elif isinstance(item, type) and issubclass(item, EvictionPolicy):
            specs.append(_class_spec(item))
        elif isinstance(item, EvictionPolicy):
            specs.append(_instance_spec(item))
        else:
            raise TypeError(
                "policies holds policy specs (\"lru\", \"slru:protected_threshold=3\"), EvictionPolicy "
                f"subclasses or instances, not {item!r}"
            )
    if not specs:
        raise BenchmarkError("policies is empty: give at least one, e.g. policies=['lru']")
    local = [spec for spec in specs if is_session_policy(spec.split(":", 1)[0])]
    if local and (jobs != 1 or ray_address is not None):
        raise BenchmarkError(
            f"policy {local[0]!r} is registered in this session only: run it with jobs=1 (worker "
            "processes and Ray know the policies of installed packages)"
        )
    return list(dict.fromkeys(specs))
