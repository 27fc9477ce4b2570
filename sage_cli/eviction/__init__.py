"""``sage llm eviction``: inspect and change the eviction policy of a running engine.

    commands.py      the commands: stats, logs, set-policy, set-token-policy, policies, explain,
                     tree, top (each talks to the engine through `sage_cli.client`; ``policies``
                     needs none)
    render.py        the statistics block, eviction log lines, a swap, the policies table
    explanations.py  why a block left: one line per victim, or a past eviction in full, and the
                     engine runs a log file's records come from
    views.py         the prefix tree (Rich, Graphviz) and the frames of ``top``
    log_file.py      an eviction log file read with no engine (tail, follow, rotations)
    log_tail.py      ``logs --tail N``: the last N printed lines, never a cut eviction
    lookups.py       ``explain --lookup``: the lookup log read, each lookup beside its eviction
    receipts_view.py ``explain --request``: a request's cache receipt; the stats' prompt-cache lines
    ages_view.py     the regret, thrashing and age lines of ``stats`` and ``top``
    installed.py     the policies installed here, from the registry (``policies``)
    quota.py         ``quota set|show|delete``: per-salt quotas of cached blocks (a sub-group)

The rendering modules are pure functions of the engine's JSON; none of these modules imports
torch or `engine_adapter` (beyond `engine_adapter.paths`), and only `installed` imports
`sage_eviction`, inside its function. `app` is the group.
"""

from __future__ import annotations

import typer

from sage_cli.eviction import commands, quota

__all__ = ["app"]

app = typer.Typer(
    name="eviction",
    help="Inspect and change the eviction policy of a running engine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.command("stats")(commands.stats)
app.command("logs")(commands.logs)
app.command("set-policy")(commands.set_policy)
app.command("set-token-policy")(commands.set_token_policy)
app.command("policies")(commands.policies)
app.command("explain")(commands.explain)
app.command("tree")(commands.tree)
app.command("top")(commands.top)
app.add_typer(quota.app, name="quota")
