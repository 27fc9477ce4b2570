"""sage_cli: the ``sage`` command line, a client of the engine's control API.

Layout (a package per command group, as in huggingface_hub's Typer-era ``hf`` CLI)::

    app.py        the root app ``sage``, the group ``llm`` and ``main()``
    engine/       sage llm engine start | stop | status; start's options are the engine config's
                  keys (engine/start_options.py, generated from ``engine_adapter.serving.config``)
    eviction/     sage llm eviction stats | logs | set-policy | set-token-policy | policies |
                  explain | tree | top, what they print apart from the commands
    benchmark/    sage llm benchmark: its options, its checks, a module per mode
    options.py    options shared as Annotated aliases (SocketOpt, NameOpt, PolicyOpt, JsonOpt),
                  and commands whose options are declared elsewhere (`with_parameters`)
    help_panels.py  long helps grouped into panels (Typer's rich_help_panel) by parameter name
    output.py     the one output sink: text, a Rich table, or --json
    errors.py     exceptions to a one-line message and an exit code
    client.py     the control client (httpx over the Unix socket, or TCP) and its exception tree
    records.py    typed records of the control API's answers (the client's typed methods)
    sse.py        the one reader of event streams (the engine's and vLLM's streamed completions)
    spawn.py      an engine process in the background (--detach, the benchmark's temporary engines)
    paths.py      which engine a command talks to: --socket, --name, $SAGE_SOCKET, $SAGE_NAME
    _params.py    option values converted without pydantic (the light commands' start-up time)

What may import what: the shared modules (options, output, errors, client, sse, spawn, paths,
_params) import no command package; a command package imports the shared modules and its own
modules, never another group; ``app`` imports the groups. Of the engine, only
`engine_adapter.paths` (standard library only: where an engine's files live) loads when the
command tree is built; ``engine start`` and ``benchmark`` import `engine_adapter` inside their
functions (tests/test_import_graph.py checks both).

Importing this package imports nothing else.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
