"""The flags of ``sage llm engine start``: how each config key is given on the command line.

`START_FLAGS` is the per-key table next to `EngineConfig`, in the order of the command's help:
each flag's names, metavar, the bounds Click checks, and whether its help shows the key's
default. The help itself is the first paragraph of the key's docstring (`key_help`), the type
of its value the key's type unless the row says otherwise (`flag_kind`).

The CLI may not import the engine when it builds its command tree, so ``python
scripts/gen_cli_docs.py`` writes the CLI's copy of this table, ``sage_cli/engine/start_options.py``,
from these functions; tests/test_start_options.py fails when that copy is stale, and checks that
every key is settable from a flag, the YAML file and the environment but for `NO_FLAG_KEYS`.

Imports: the standard library and `engine_config`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass

from engine_adapter.serving.config import engine_config
from engine_adapter.serving.config.engine_config import EngineConfig

__all__ = [
    "FLAG_KINDS",
    "NO_FLAG_KEYS",
    "START_FLAGS",
    "StartFlag",
    "field_docs",
    "flag_help",
    "flag_kind",
    "flag_label",
    "flag_param",
    "key_help",
]

# How the CLI reads a flag's value: argument (the positional MODEL), text, int, float, switch (an
# on/off flag), file or dir (a path), items (repeated K=V).
FLAG_KINDS = ("argument", "text", "int", "float", "switch", "file", "dir", "items")


@dataclass(frozen=True, slots=True)
class StartFlag:
    """How ``sage llm engine start`` sets one config key.

    Attributes:
        key: The `EngineConfig` key.
        decls: The option's names as Click declares them (``"--name", "-n"``, or
            ``"--log-evictions/--no-log-evictions"`` for an on/off pair); empty for the argument.
        metavar: The value's name in the help.
        kind: One of `FLAG_KINDS` when the key's type does not say it (a size given as text, a
            path); None: from the type.
        show_default: True: the help ends with the key's default; a string: with that text.
        min: The smallest value Click accepts (its own message), for an int.
        max: The largest.
    """

    key: str
    decls: tuple[str, ...]
    metavar: str | None = None
    kind: str | None = None
    show_default: bool | str = False
    min: int | None = None
    max: int | None = None


START_FLAGS: tuple[StartFlag, ...] = (
    # The CLI's default model is SmolLM2 when installed (engine_adapter.model.builtin).
    StartFlag("model", (), "MODEL", "argument", show_default="smollm2-135m when installed, else sage-tiny"),
    StartFlag("engine_kind", ("--engine-kind",), metavar="KIND", show_default=True),
    StartFlag("eviction_policy", ("--eviction-policy",), metavar="NAME", show_default=True),
    StartFlag("policy_params", ("--policy-param",), metavar="K=V"),
    StartFlag(
        "enable_lifetime_prediction",
        ("--enable-lifetime-prediction/--disable-lifetime-prediction",),
        show_default="disabled",
    ),
    StartFlag("log_evictions", ("--log-evictions/--no-log-evictions",), show_default=True),
    StartFlag("explain_evictions", ("--explain/--no-explain",), show_default=True),
    StartFlag("lookup_log", ("--lookup-log",), metavar="PATH", kind="file"),
    StartFlag("ghost_factor", ("--ghost-factor",), metavar="F", show_default=True),
    StartFlag("num_blocks", ("--num-blocks",), metavar="N", min=1),
    StartFlag("kv_cache_memory", ("--kv-cache-memory",), metavar="SIZE", kind="text"),
    StartFlag("gpu_memory_utilization", ("--gpu-memory-utilization",), metavar="F"),
    StartFlag("block_size", ("--block-size",), metavar="N", min=1, show_default=True),
    StartFlag("host_kv_cache", ("--host-kv-cache",), metavar="SIZE", kind="text"),
    StartFlag("host_eviction_policy", ("--host-eviction-policy",), metavar="NAME", show_default=True),
    StartFlag("host_policy_params", ("--host-policy-param",), metavar="K=V"),
    StartFlag("host_write_policy", ("--host-write-policy",), metavar="MODE", show_default=True),
    StartFlag("disk_kv_cache", ("--disk-kv-cache",), metavar="DIR", kind="dir"),
    StartFlag("disk_kv_size", ("--disk-kv-size",), metavar="SIZE", kind="text"),
    StartFlag("prefetch", ("--prefetch/--no-prefetch",), show_default=True),
    StartFlag("device", ("--device",), metavar="DEVICE", show_default=True),
    StartFlag("dtype", ("--dtype",), metavar="DTYPE", show_default=True),
    StartFlag("kv_dtype", ("--kv-dtype",), metavar="DTYPE", show_default=True),
    StartFlag("quantization", ("--quantization",), metavar="MODE", show_default=True),
    StartFlag("packed_weights", ("--packed-weights",), metavar="MODE", show_default=True),
    StartFlag("batch_invariant", ("--batch-invariant",), metavar="MODE", show_default=True),
    StartFlag("compile", ("--compile/--no-compile",), show_default=True),
    StartFlag("threads", ("--threads",), metavar="N", min=1),
    StartFlag("cuda_graphs", ("--cuda-graphs/--no-cuda-graphs",), show_default=True),
    StartFlag("name", ("--name", "-n"), metavar="NAME", show_default=True),
    StartFlag("socket", ("--socket",), metavar="PATH", kind="file"),
    StartFlag("log_dir", ("--log-dir",), metavar="DIR", kind="dir"),
    StartFlag("max_queued_requests", ("--max-queued-requests",), metavar="N", min=1),
    StartFlag("queued_timeout", ("--queued-timeout",), metavar="SECONDS"),
    StartFlag("eviction_threshold", ("--eviction-threshold",), metavar="F"),
    StartFlag("max_pinned_ratio", ("--max-pinned-ratio",), metavar="F", show_default=True),
    StartFlag("max_cache_ttl", ("--max-cache-ttl",), metavar="SECONDS", show_default=True),
    StartFlag("max_retained_fraction", ("--max-retained-fraction",), metavar="F", show_default=True),
    StartFlag(
        "cache_generated_tokens", ("--cache-generated-tokens/--no-cache-generated-tokens",), show_default=True
    ),
    StartFlag("protect_queued", ("--protect-queued",), metavar="FRACTION", show_default=True),
    StartFlag("preemption_order", ("--preemption-order",), metavar="NAME", show_default=True),
    StartFlag("max_num_seqs", ("--max-num-seqs",), metavar="N", min=1, show_default=True),
    StartFlag("max_num_batched_tokens", ("--max-num-batched-tokens",), metavar="N", min=1, show_default=True),
    StartFlag("adaptive_batch", ("--adaptive-batch/--no-adaptive-batch",), show_default=True),
    StartFlag("colocation", ("--colocation",), metavar="MODE", show_default=True),
    StartFlag("colocation_params", ("--colocation-param",), metavar="K=V"),
    StartFlag("embedding_chunk_tokens", ("--embedding-chunk-tokens",), metavar="N", min=1, show_default=True),
    StartFlag("token_eviction", ("--token-eviction",), metavar="NAME", show_default=True),
    StartFlag("compress_on_evict", ("--compress-on-evict",), metavar="PRESS:RATIO"),
    StartFlag("eviction_window", ("--eviction-window",), metavar="N", min=1, show_default=True),
    StartFlag("memory_threshold", ("--memory-threshold",), metavar="MB", min=0, show_default=True),
    StartFlag("seed", ("--seed",), metavar="N", min=0, show_default=True),
    StartFlag("host", ("--host",), metavar="HOST"),
    StartFlag("port", ("--port",), metavar="PORT", min=1, max=65535),
    StartFlag("api_key", ("--api-key",), metavar="KEY"),
    StartFlag("ssl_certfile", ("--ssl-certfile",), metavar="PEM", kind="file"),
    StartFlag("ssl_keyfile", ("--ssl-keyfile",), metavar="PEM", kind="file"),
    StartFlag("insecure_no_api_key", ("--insecure-no-api-key",)),
    StartFlag("kv_events_endpoint", ("--kv-events-endpoint",), metavar="ENDPOINT"),
    StartFlag("kv_events_replay_endpoint", ("--kv-events-replay-endpoint",), metavar="ENDPOINT"),
)

# Set in the YAML file or as SAGE_<KEY> only: the HTTP limits, the SLO defaults (tenant_slos is a
# mapping), and how much a compressed sequence keeps.
NO_FLAG_KEYS = (
    "token_target_ratio",
    "max_body_bytes",
    "header_timeout",
    "body_timeout",
    "keep_alive_timeout",
    "max_connections",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_deadline_ms",
    "tenant_slos",
)

_BY_KEY = {flag.key: flag for flag in START_FLAGS}


def flag_label(key: str) -> str:
    """How messages name the flag of `key`: its first long name (``--explain`` for
    ``explain_evictions``), else ``--`` and the key in kebab-case."""
    flag = _BY_KEY.get(key)
    if flag is not None and flag.decls:
        return flag.decls[0].split("/")[0]
    return "--" + key.replace("_", "-")


def flag_param(flag: StartFlag) -> str:
    """The command's parameter name of `flag`: its first long name in snake_case (``explain``,
    ``policy_param``), the key for the argument."""
    if not flag.decls:
        return flag.key
    return flag.decls[0].split("/")[0].removeprefix("--").replace("-", "_")


def flag_kind(flag: StartFlag) -> str:
    """One of `FLAG_KINDS`: the row's, else from the key's type."""
    if flag.kind is not None:
        return flag.kind
    hint = typing.get_type_hints(EngineConfig)[flag.key]
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = [t for t in typing.get_args(hint) if t is not type(None)] if optional else [hint]
    if len(options) == 1:
        python_type = typing.get_origin(options[0]) or options[0]
        kinds = {bool: "switch", int: "int", float: "float", str: "text", dict: "items"}
        if python_type in kinds:
            return kinds[python_type]
    raise TypeError(f"{flag.key}: no flag kind for {hint}; give one in its START_FLAGS row")


def field_docs() -> dict[str, str]:
    """Each key's docstring (the string under its field in `EngineConfig`), cleaned."""
    module = ast.parse(inspect.getsource(engine_config))
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == EngineConfig.__name__]
    docs: dict[str, str] = {}
    for field_node, after in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field_node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def key_help(key: str) -> str:
    """The first paragraph of the key's docstring, on one line.

    Raises:
        KeyError: The key has no docstring.
    """
    first = field_docs()[key].split("\n\n")[0]
    return " ".join(first.split())


def flag_help(flag: StartFlag) -> str:
    """The help of `flag`: its key's, and the default when the row shows it."""
    text = key_help(flag.key)
    if flag.show_default is False:
        return text
    if isinstance(flag.show_default, str):
        return f"{text} (default: {flag.show_default})"
    default = {f.name: f.default for f in dataclasses.fields(EngineConfig)}[flag.key]
    return f"{text} (default: {_as_shown(default)})"


def _as_shown(default: object) -> str:
    """A default as the help shows it: yes/no, 0.5, 0 (not 0.0), lru."""
    if isinstance(default, bool):
        return "yes" if default else "no"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)
