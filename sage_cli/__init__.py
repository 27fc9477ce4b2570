"""sage_cli: the ``sage`` command line, a client of the engine's control API.

Layout (one module per command group, as in huggingface_hub's Typer-era ``hf`` CLI)::

    app.py        the root app ``sage``, the group ``llm`` and ``main()``
    engine.py     sage llm engine start | stop | status
    eviction.py   sage llm eviction stats | logs | set-policy | policies
    benchmark.py  sage llm benchmark
    options.py    options shared as Annotated aliases (SocketOpt, NameOpt, PolicyOpt, JsonOpt)
    output.py     the one output sink: text, a Rich table, or --json
    errors.py     exceptions to a one-line message and an exit code
    client.py     the control client (httpx over a Unix socket) and its exception tree
    paths.py      $SAGE_HOME, sockets, pid files and logs

Importing this package imports nothing else.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
