"""``sage llm engine``: start, stop and inspect an engine.

    start.py          start: the config from flags, SAGE_<KEY>, the YAML file and defaults; the
                      engine in the foreground or detached (`sage_cli.spawn`)
    start_options.py  start's options, one per config key: generated from
                      ``engine_adapter.serving.config`` by ``python scripts/gen_cli_docs.py``
    config_flags.py   `ConfigFlag` (a row of that table), its Typer parameter, and back to keys
    stop.py           stop: drain, then wait until the socket and pid file are gone
    status.py         status: ``GET /v1/engine`` for people

``start`` imports `engine_adapter` inside its function only; ``stop`` and ``status`` talk to the
engine over its socket (`sage_cli.client`). `app` is the group.
"""

from __future__ import annotations

import typer

from sage_cli.engine import start, status, stop
from sage_cli.help_panels import panelled

__all__ = ["app"]

app = typer.Typer(
    name="engine",
    help="Start, stop and inspect an LLM engine with a pluggable KV-cache eviction policy.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.command("status")(status.status)
app.command("stop")(stop.stop)
app.command("start", cls=panelled("Start", start.START_PANELS))(start.start)
