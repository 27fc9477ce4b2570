"""Token policy names to their classes, and building a token policy by name.

`TOKEN_POLICIES` is a plain dict from name to the class's import path (``module:Class``), so
that the names are known without importing torch: the engine's config, a request's
`kv_compression` and the control API check a name before (or without) any model. The class is
imported when a policy is built. Third-party policies register through the entry-point group
``sage.token_policies`` (name = ``module:Class``, a `TokenEvictionPolicy` subclass); the group is
read the first time the names are listed or a name is not among the built-ins, and a built-in
name wins over a plugin's.

The errors::

    TokenPolicyError (ValueError)
    ├── UnknownTokenPolicyError   no token policy has this name; lists the names
    └── TokenPolicyParamError     an unknown or refused param; lists the params with defaults

Imports only the standard library (the policy base inside the functions that build a policy,
which import torch).
"""

from __future__ import annotations

import inspect
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy

__all__ = [
    "ENTRY_POINT_GROUP",
    "TOKEN_POLICIES",
    "TokenPolicyError",
    "TokenPolicyParamError",
    "UnknownTokenPolicyError",
    "make_token_policy",
    "parse_token_spec",
    "token_policy_from_spec",
    "token_policy_class",
    "token_policy_names",
    "token_policy_params",
]

ENTRY_POINT_GROUP = "sage.token_policies"

_PRESSES = "engine_adapter.token_eviction.presses"
TOKEN_POLICIES: dict[str, str] = {
    "none": f"{_PRESSES}.none:NoEvictionPolicy",
    "sliding": f"{_PRESSES}.sliding:SlidingWindowPolicy",
    "snapkv": f"{_PRESSES}.snapkv:SnapKVPolicy",
    "h2o": f"{_PRESSES}.h2o:H2OPolicy",
    "tova": f"{_PRESSES}.tova:TOVAPolicy",
    "knorm": f"{_PRESSES}.knorm:KnormPolicy",
    "keydiff": f"{_PRESSES}.keydiff:KeyDiffPolicy",
    "leverage": f"{_PRESSES}.leverage:LeveragePolicy",
    "compactor": f"{_PRESSES}.compactor:CompactorPolicy",
    "expected_attention": f"{_PRESSES}.expected_attention:ExpectedAttentionPolicy",
    "kvzip": f"{_PRESSES}.kvzip:KVzipPolicy",
    "skim": f"{_PRESSES}.skim:SkimPolicy",
    "adakv": f"{_PRESSES}.adakv:AdaKVPolicy",
    "pyramid": f"{_PRESSES}.pyramid:PyramidPolicy",
}
"""The built-in token policies (``--token-eviction``), in the order error messages list them."""

_plugins: dict[str, str] | None = None  # name -> import path of the entry points, once read


class TokenPolicyError(ValueError):
    """A token policy that cannot be built."""


class UnknownTokenPolicyError(TokenPolicyError):
    """No token policy has this name (or an entry point names no `TokenEvictionPolicy`)."""


class TokenPolicyParamError(TokenPolicyError):
    """A param the policy does not take, or a value its constructor refused."""


def _plugin_paths() -> dict[str, str]:
    global _plugins
    if _plugins is None:
        _plugins = {
            ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in TOKEN_POLICIES
        }
    return _plugins


def token_policy_names() -> list[str]:
    """Registered token policy names: the built-ins in registry order, then plugins sorted."""
    return [*TOKEN_POLICIES, *sorted(_plugin_paths())]


def _import_path(name: str) -> str:
    path = TOKEN_POLICIES.get(name) or _plugin_paths().get(name)
    if path is None:
        listing = ", ".join(token_policy_names())
        raise UnknownTokenPolicyError(f"unknown token eviction policy {name!r}; choose one of {listing}")
    return path


def token_policy_class(name: str) -> type[TokenEvictionPolicy]:
    """The class registered as `name`, imported.

    Raises:
        UnknownTokenPolicyError: No such policy, or its entry point names no
            `TokenEvictionPolicy` subclass.
    """
    from engine_adapter.token_eviction.presses.base import TokenEvictionPolicy

    path = _import_path(name)
    module, _, attribute = path.partition(":")
    target: Any = import_module(module)
    for part in filter(None, attribute.split(".")):
        target = getattr(target, part, None)
    if not (isinstance(target, type) and issubclass(target, TokenEvictionPolicy)):
        raise UnknownTokenPolicyError(f"token policy {name!r} ({path}) is not a TokenEvictionPolicy subclass")
    return target


def token_policy_params(cls: type[TokenEvictionPolicy]) -> dict[str, Any]:
    """The named params of a policy's constructor and their defaults (None where it has none)."""
    if cls.__init__ is object.__init__:
        return {}
    return {
        p.name: None if p.default is p.empty else p.default
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _listing(cls: type[TokenEvictionPolicy]) -> str:
    params = token_policy_params(cls)
    if cls.wraps_press:
        params["press"] = cls.default_press
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "none"


def _takes_any_keyword(cls: type[TokenEvictionPolicy]) -> bool:
    if cls.__init__ is object.__init__:
        return False
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


_TYPE_WORDS = {bool: "a bool", int: "an int", float: "a number"}


def _of_the_default_type(value: Any, default: Any) -> bool:
    """Whether `value` has the type of a numeric or bool default (an int will do for a float;
    a bool is no number). Params without such a default are the constructor's to check."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int | float):
        number = int if isinstance(default, int) else int | float
        return isinstance(value, number) and not isinstance(value, bool)
    return True


def _constructor_kwargs(
    name: str, cls: type[TokenEvictionPolicy], window: int | None, params: dict[str, Any]
) -> dict[str, Any]:
    """`params` checked against the constructor, with the engine's window where the policy takes it."""
    known = token_policy_params(cls)
    for pname, value in params.items():
        if pname not in known and not _takes_any_keyword(cls):
            raise TokenPolicyParamError(
                f"token eviction policy {name!r} has no param {pname!r}; params: {_listing(cls)}"
            )
        if not _of_the_default_type(value, known.get(pname)):
            raise TokenPolicyParamError(
                f"token eviction policy {name!r}: param {pname}={value!r} is not "
                f"{_TYPE_WORDS[type(known[pname])]}; params: {_listing(cls)}"
            )
    if window is None or cls.window_param is None:
        return dict(params)
    if cls.window_param in params:
        raise TokenPolicyParamError(
            f"token eviction policy {name!r}: {cls.window_param} is the eviction window ({window}) "
            "the engine gives; leave it out"
        )
    return {cls.window_param: window, **params}


def parse_token_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``name`` or ``name:k=v,k=v`` as the name and its raw params (torch-free; the block
    policies' spec form). A budget wrapper's first item may name its press alone:
    ``adakv:snapkv`` is ``adakv:press=snapkv``.

    Raises:
        TokenPolicyParamError: An item that is not ``k=v`` (but a wrapper's leading press).
        UnknownTokenPolicyError: No token policy has the name.
    """
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    _import_path(name)
    params: dict[str, str] = {}
    for i, item in enumerate(filter(None, (p.strip() for p in rest.split(",")))):
        key, eq, value = item.partition("=")
        if not eq:
            if i == 0 and name in _WRAPPERS:
                key, value = "press", item
            else:
                raise TokenPolicyParamError(f"token policy spec {spec!r}: {item!r} is not k=v")
        params[key.strip()] = value.strip()
    return name, params


_WRAPPERS = frozenset({"adakv", "pyramid"})
"""The budget wrappers: their ``press`` param names the press whose scores they share out."""


def _from_text(value: Any, default: Any) -> Any:
    """A spec's text value as the type of the param's default (others stay text)."""
    if not isinstance(value, str) or default is None or isinstance(default, str):
        return value
    if isinstance(default, bool):
        lowered = value.lower()
        return {"true": True, "1": True, "false": False, "0": False}.get(lowered, value)
    for kind in (int, float) if isinstance(default, int) else (float,):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def token_policy_from_spec(spec: str, *, window: int | None = None) -> TokenEvictionPolicy:
    """The token policy a spec (`parse_token_spec`) names, built and checked (imports torch)."""
    name, raw = parse_token_spec(spec)
    cls = token_policy_class(name)
    defaults = token_policy_params(cls)
    if cls.wraps_press:  # the params the wrapper does not take are its press's
        defaults = {
            **token_policy_params(token_policy_class(raw.get("press", cls.default_press))),
            **defaults,
        }
    params = {k: _from_text(v, defaults.get(k)) for k, v in raw.items()}
    return make_token_policy(name, window=window, **params)


def _make_wrapper(
    name: str, cls: type[TokenEvictionPolicy], window: int | None, params: dict[str, Any]
) -> TokenEvictionPolicy:
    """A budget wrapper: its own params to it, the others to the press it wraps."""
    params = dict(params)
    press = params.pop("press", cls.default_press)
    if not isinstance(press, str) or not press:
        raise TokenPolicyParamError(
            f"token eviction policy {name!r}: press={press!r} is not a press name; params: {_listing(cls)}"
        )
    own_names = set(token_policy_params(cls)) - {"press"}
    own = {k: v for k, v in params.items() if k in own_names}
    try:
        inner = make_token_policy(
            press, window=window, **{k: v for k, v in params.items() if k not in own_names}
        )
    except TokenPolicyParamError as exc:
        raise TokenPolicyParamError(
            f"token eviction policy {name!r} over {exc}; {name}'s params: {_listing(cls)}"
        ) from exc
    kwargs = _constructor_kwargs(name, cls, None, own)
    try:
        wrapper: TokenEvictionPolicy = cls(press=inner, **kwargs)  # type: ignore[call-arg]
        return wrapper
    except (TypeError, ValueError) as exc:
        raise TokenPolicyParamError(
            f"token eviction policy {name!r}: {exc}; params: {_listing(cls)}"
        ) from exc


def make_token_policy(name: str, *, window: int | None = None, **params: Any) -> TokenEvictionPolicy:
    """The token policy registered as `name`, built with its params.

    Args:
        name: A registered name (``--token-eviction``), exactly.
        window: The engine's ``--eviction-window``, given to the policies that have such a
            window (`TokenEvictionPolicy.window_param`: the sliding window); None leaves the
            policy's default.
        **params: The policy's own params, e.g. ``observation_window=32`` for snapkv.

    Raises:
        UnknownTokenPolicyError: Unknown name; the message lists the names.
        TokenPolicyParamError: A param the policy does not take, or a value its constructor
            refused; the message lists the params with their defaults.
    """
    cls = token_policy_class(name)
    if cls.wraps_press:
        return _make_wrapper(name, cls, window, params)
    kwargs = _constructor_kwargs(name, cls, window, params)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        listing = _listing(cls)
        raise TokenPolicyParamError(f"token eviction policy {name!r}: {exc}; params: {listing}") from exc
