"""Policy names to classes, and building a policy from `name` or `name:k=v,k=v`.

`POLICIES` is a plain dict filled in `sage_eviction.policies`; third-party policies register
through the entry-point group `sage_eviction.policies` (name = "module:Class") and are loaded
the first time a name is not found or the list is asked for; a class defined in a notebook or
script registers for the session with `register_policy` (the same dict: one registry).
`split_policy_specs` reads a comma-separated list of specs (``lru,slru:k=v,k2=v2``) and
`policy_label` names a spec's row or column the same way everywhere (params kept).
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from collections.abc import Hashable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import OfflinePolicyError, PolicyLoadError, PolicyParamError, UnknownPolicyError
from sage_eviction.policies import POLICIES
from sage_eviction.types import EntryMeta

__all__ = [
    "ALIASES",
    "ENTRY_POINT_GROUP",
    "ParamSpec",
    "available_policies",
    "ResolvedPolicy",
    "create_policy",
    "describe_policies",
    "get_policy_class",
    "is_session_policy",
    "parse_policy_spec",
    "policy_label",
    "policy_params",
    "register_policy",
    "resolve_policy",
    "split_policy_specs",
    "split_specs",
]
# This module is the one place a policy spec is read and checked: the engine's config, the
# control API's hot swap, the CLI and the integrations all resolve names here (`online=True`
# where the future is not known), so a name is accepted or refused with the same message.

ENTRY_POINT_GROUP = "sage_eviction.policies"
"""The entry-point group a package registers its policies under (docs/howto.md)."""
ALIASES = {"qos_aware": "priority", "qos": "priority", "s3-fifo": "s3fifo", "opt": "belady", "min": "belady"}

_plugins_loaded = False
_session_names: set[str] = set()  # the names `register_policy` added (a notebook may redefine them)


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One constructor param of a policy."""

    name: str
    type: type
    default: Any
    optional: bool  # None is accepted

    def describe(self) -> str:
        return f"{self.name}={self.default!r}"


# Plugins whose entry point failed to load: name -> why (a lookup of the name says it).
_UNLOADABLE: dict[str, str] = {}


def _load_plugins(*, rescan: bool = False) -> None:
    """Register the entry points' policies, once; `rescan`: look again (a plugin installed since,
    into a process that had looked: an engine), with the import system's caches cleared so that
    its new module is found. One that fails to load is set aside with why, not raised: the
    other policies stay usable, and looking it up is a `PolicyLoadError`."""
    global _plugins_loaded
    if _plugins_loaded and not rescan:
        return
    _plugins_loaded = True
    if rescan:
        importlib.invalidate_caches()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in POLICIES:
            continue
        try:
            cls = ep.load()
        except Exception as exc:  # a plugin's import may fail in any way: say how, per name
            _UNLOADABLE[ep.name] = f"{type(exc).__name__}: {exc}"
            continue
        if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
            raise UnknownPolicyError(
                f"entry point {ep.name!r} ({ep.value}) is not an EvictionPolicy subclass"
            )
        _UNLOADABLE.pop(ep.name, None)
        POLICIES[ep.name] = cls


def register_policy(cls: type[EvictionPolicy], name: str | None = None) -> type[EvictionPolicy]:
    """Register a policy class for this process (a notebook's or a script's own class), beside
    the built-ins and the entry-point plugins, so that its name works wherever a spec does.

    Registering a class again under the same name replaces the earlier one (a notebook cell run
    twice defines a new class); a built-in's or a plugin's name is refused. The registration
    lives as long as the process: a package's entry point is what makes a policy known to an
    engine, a worker process or Ray.

    Args:
        cls: An `EvictionPolicy` subclass.
        name: Its registry name (default: the ``name`` the class sets itself, else its class name
            in lower case); set as ``cls.name``, what rows, stats and logs show.

    Returns:
        `cls`, so that it can decorate the class.

    Raises:
        TypeError: `cls` is not an `EvictionPolicy` subclass.
        ValueError: No name, a name that differs from ``cls.name``, or one taken by a built-in
            or a plugin.
    """
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise TypeError(f"register_policy takes an EvictionPolicy subclass, not {cls!r}")
    own = str(cls.__dict__.get("name") or "")  # a subclass inherits its base's name: not its own
    key = (name if name is not None else own or cls.__name__).strip().lower()
    if not key or not key.replace("_", "").replace("-", "").isalnum():
        raise ValueError(
            f"policy class {cls.__qualname__}: {key!r} is not a policy name (letters, digits, '_', '-'); "
            "set `name = \"...\"` on the class or give register_policy(cls, name=...)"
        )
    if own and own != key:
        raise ValueError(f"policy class {cls.__qualname__} is named {own!r}, not {key!r}")
    _load_plugins()
    if POLICIES.get(key) is cls and key not in _session_names:
        return cls  # a built-in or a plugin, registered already
    if key in ALIASES or (key in POLICIES and key not in _session_names):
        raise ValueError(
            f"policy name {key!r} is a built-in or plugin policy's; name the class another way "
            "(`name = \"...\"` on it, or register_policy(cls, name=...))"
        )
    cls.name = key
    POLICIES[key] = cls
    _session_names.add(key)
    return cls


def is_session_policy(name: str) -> bool:
    """Whether `name` was registered by `register_policy` in this process (not a package's)."""
    return name.strip().lower() in _session_names


def available_policies(*, include_offline: bool = True) -> list[str]:
    """Registered policy names, built-in and plugins, sorted."""
    _load_plugins()
    return sorted(n for n, c in POLICIES.items() if include_offline or not c.offline)


def get_policy_class(name: str, *, online: bool = False) -> type[EvictionPolicy]:
    """The class registered as `name` (or one of its aliases).

    Args:
        name: A registry name or alias, any case.
        online: Refuse offline policies (they need the future: simulation only), as an engine
            must; the messages then list the online policies.

    Raises:
        UnknownPolicyError: No such policy; the message lists the ones that exist.
        PolicyLoadError: A plugin's policy whose module cannot be loaded; the message says why.
        OfflinePolicyError: `online` and the policy is offline; the message lists the online ones.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    cls = POLICIES.get(key)
    if cls is None:
        _load_plugins()
        cls = POLICIES.get(key)
    if cls is None:  # installed since the registry looked?
        _load_plugins(rescan=True)
        cls = POLICIES.get(key)
    if cls is None and key in _UNLOADABLE:
        raise PolicyLoadError(f"policy {key!r} could not be loaded: {_UNLOADABLE[key]}")
    if cls is None:
        listing = ", ".join(available_policies(include_offline=not online))
        raise UnknownPolicyError(f"unknown eviction policy {name!r}; available: {listing}")
    if online and cls.offline:
        listing = ", ".join(available_policies(include_offline=False))
        raise OfflinePolicyError(
            f"eviction policy {cls.name!r} needs the future and runs only in simulation "
            f"(sage llm benchmark --mode sim); online policies: {listing}"
        )
    return cls


def policy_params(cls: type[EvictionPolicy]) -> dict[str, ParamSpec]:
    """The params of a policy's constructor, with their types and defaults."""
    hints = typing.get_type_hints(cls.__init__)
    specs: dict[str, ParamSpec] = {}
    for pname, param in inspect.signature(cls.__init__).parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(pname, str)
        optional = False
        args = typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
            optional = True
            hint = next(a for a in args if a is not type(None))
        if not isinstance(hint, type):
            hint = object
        default = None if param.default is inspect.Parameter.empty else param.default
        specs[pname] = ParamSpec(pname, hint, default, optional)
    return specs


def policy_idea(cls: type) -> str:
    """A policy's idea in one line: the first paragraph of its class docstring (the README's
    policy table and ``sage llm eviction policies`` show it)."""
    first = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def describe_policies(*, include_offline: bool) -> list[dict[str, Any]]:
    """Each registered policy as the control API's ``GET /v1/eviction/policies`` lists it (and
    ``sage llm eviction policies`` with no engine): name, strategy, its idea, paper, whether it is
    offline, its params with their defaults (``capacity`` aside: the cache gives it)."""
    listing = []
    for name in available_policies(include_offline=include_offline):
        cls = get_policy_class(name)
        params = {k: p.default for k, p in policy_params(cls).items() if k != "capacity"}
        listing.append(
            {
                "name": name,
                "strategy": cls.strategy.name,
                "idea": policy_idea(cls),
                "paper": cls.paper,
                "offline": cls.offline,
                "params": params,
            }
        )
    return listing


def _coerce(policy: str, spec: ParamSpec, value: Any, all_specs: dict[str, ParamSpec]) -> Any:
    def fail() -> PolicyParamError:
        listing = ", ".join(s.describe() for s in all_specs.values())
        return PolicyParamError(
            f"policy {policy!r}: param {spec.name}={value!r} is not a valid "
            f"{spec.type.__name__}; params: {listing}"
        )

    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        if spec.optional:
            return None
        raise fail()
    target = spec.type
    if target is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise fail()
    if target is int:
        if isinstance(value, bool):
            raise fail()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise fail() from None
        raise fail()
    if target is float:
        if isinstance(value, bool):
            raise fail()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise fail() from None
        raise fail()
    if target is str:
        if isinstance(value, str):
            return value
        raise fail()
    return value


def parse_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split `name:k=v,k=v` into the name and raw string params.

    Raises:
        PolicyParamError: A param is not of the form k=v.
    """
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise PolicyParamError(f"policy spec {spec!r}: {item!r} is not of the form k=v")
        params[k.strip()] = v.strip()
    return name.strip(), params


def split_specs(text: str) -> list[str]:
    """``a,b:k=v,k2=v2,c`` -> ``["a", "b:k=v,k2=v2", "c"]``: a comma-separated list of specs,
    where an item ``k=v`` with no name continues the spec before it; empty items are skipped,
    nothing is checked (policies and the fleet's routers share this grammar)."""
    specs: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item and specs:
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def policy_label(spec: str) -> str:
    """A spec's name as a row shows it: the registry name (aliases resolved, lower case) and,
    when the spec has params, ``:k=v,...`` as given, so two rows of one policy with different
    params are told apart (``slru:protected_threshold=3``).

    Raises:
        UnknownPolicyError: Unknown name.
        PolicyParamError: A param not of the form k=v.
    """
    name, params = parse_policy_spec(spec)
    cls = get_policy_class(name)
    if not params:
        return cls.name
    return f"{cls.name}:" + ",".join(f"{key}={value}" for key, value in params.items())


def split_policy_specs(text: str, *, online: bool = False) -> list[str]:
    """A comma-separated list of policy specs (``lru,slru:protected_threshold=3,arc``) as checked
    labels (`policy_label`), duplicates dropped.

    Raises:
        UnknownPolicyError: Unknown name (the message lists the ones that exist).
        OfflinePolicyError: `online` and an offline policy.
        PolicyParamError: A param the policy does not take, or of the wrong type.
    """
    labels: list[str] = []
    for spec in split_specs(text):
        resolve_policy(spec, online=online)  # the same check an engine or a row makes
        label = policy_label(spec)
        if label not in labels:
            labels.append(label)
    return labels


@dataclass(frozen=True, slots=True)
class ResolvedPolicy:
    """A policy spec checked and converted, ready to build: the one way specs are read.

    Attributes:
        cls: The policy class.
        params: The chosen params, converted to their declared types (never `capacity`): what a
            cache reports as the policy's params.
        capacity: The cache size passed to the constructor, or None.
    """

    cls: type[EvictionPolicy]
    params: dict[str, Any]
    capacity: int | None

    @property
    def kwargs(self) -> dict[str, Any]:
        """The constructor's keyword arguments."""
        return dict(self.params) if self.capacity is None else {**self.params, "capacity": self.capacity}

    def build(
        self, columns: tuple[list[Hashable], list[EntryMeta], list[bool]] | None = None
    ) -> EvictionPolicy:
        """A new instance: empty, or holding the entries of a hot swap (`entry_columns()`).

        Raises:
            PolicyParamError: The constructor refused the values; the message lists the params.
        """
        try:
            if columns is None:
                return self.cls(**self.kwargs)
            return self.cls.from_entry_columns(*columns, **self.kwargs)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, PolicyParamError):
                raise
            listing = ", ".join(s.describe() for s in policy_params(self.cls).values())
            raise PolicyParamError(f"policy {self.cls.name!r}: {exc}; params: {listing}") from exc


def resolve_policy(
    spec: str, capacity: int | None = None, /, *, online: bool = False, **params: Any
) -> ResolvedPolicy:
    """Read `name` or `name:k=v,...` plus keyword params into a `ResolvedPolicy`.

    Values are converted by the param's annotation the same way wherever they come from (a spec
    string, a YAML file, JSON): ``"3"`` is 3 for an int; ``true``/``yes``/``on``/``1`` and their
    opposites for a bool; ``none``/``null`` for an optional param.

    Args:
        spec: Registry name, optionally with params, e.g. `"slru:protected_threshold=3"`.
        capacity: The cache's size in blocks, when a cache builds the policy: it is then the
            cache's to give, and a `capacity` param is an error. Positional only, so that a
            `capacity` among user params reaches the check rather than colliding with it.
        online: Refuse offline policies, as an engine must (`get_policy_class`). No policy
            takes a param of this name.
        **params: More params; they override the ones in `spec`.

    Raises:
        UnknownPolicyError: Unknown name.
        OfflinePolicyError: `online` and the policy needs the future.
        PolicyParamError: Unknown or ill-typed param, or `capacity` given twice; the message lists
            the params with defaults.
    """
    name, raw = parse_policy_spec(spec)
    cls = get_policy_class(name, online=online)
    merged: dict[str, Any] = {**raw, **params}
    specs = policy_params(cls)
    if capacity is not None and "capacity" in merged:
        raise PolicyParamError(
            f"policy {cls.name!r}: 'capacity' is the cache's size ({capacity} blocks), which the cache "
            "gives; leave it out"
        )
    converted: dict[str, Any] = {}
    for pname, value in merged.items():
        pspec = specs.get(pname)
        if pspec is None:
            listing = ", ".join(s.describe() for s in specs.values()) or "none"
            raise PolicyParamError(f"policy {cls.name!r} has no param {pname!r}; params: {listing}")
        converted[pname] = _coerce(cls.name, pspec, value, specs)
    if capacity is None:
        capacity = converted.pop("capacity", None)
    elif "capacity" in specs:  # the cache's size is checked like any param
        capacity = _coerce(cls.name, specs["capacity"], capacity, specs)
    return ResolvedPolicy(cls, converted, capacity)


def create_policy(spec: str, capacity: int | None = None, **params: Any) -> EvictionPolicy:
    """Build a policy from `name` or `name:k=v,...`, plus keyword params (`resolve_policy`).

    Args:
        spec: Registry name, optionally with params, e.g. `"slru:protected_threshold=3"`.
        capacity: Cache size in blocks, for the policies that need it.
        **params: More params; they override the ones in `spec`.

    Raises:
        UnknownPolicyError: Unknown name.
        PolicyParamError: Unknown or ill-typed param; the message lists the params with defaults.
    """
    return resolve_policy(spec, capacity, **params).build()
