"""``sage llm eviction quota``: per-salt quotas of cached device and host blocks (issue 51).

    quota set SALT --device-blocks N --host-blocks M   set (or replace) a salt's quota
    quota show [SALT]                                  one salt's quota and use, or all of them
    quota delete SALT                                  drop a salt's quota

The salt is the requests' isolation key (their ``cache_salt``, or their tenant when the engine
isolates tenants). Each command talks to the engine through `sage_cli.client` (``PUT/GET/DELETE
/v1/cache/quotas/{salt}``), prints a table or, with ``--json``, the engine's answer. No torch,
no `engine_adapter`: these answer as fast as ``stats``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from sage_cli.errors import CLIUsageError
from sage_cli.options import ApiKeyOpt, JsonOpt, NameOpt, SocketOpt, UrlOpt, client_for
from sage_cli.output import Output

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["app", "quota_lines", "quota_table"]

app = typer.Typer(
    name="quota",
    help="Per-salt quotas of cached device and host blocks.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

SaltArg = Annotated[str, typer.Argument(metavar="SALT", help="The salt (a request's cache_salt).")]


@app.command("set")
def set_quota(
    salt: SaltArg,
    device_blocks: Annotated[
        int | None,
        typer.Option(
            "--device-blocks",
            min=0,
            metavar="N",
            show_default=False,
            help="Most cached device blocks the salt may hold (default: uncapped).",
        ),
    ] = None,
    host_blocks: Annotated[
        int | None,
        typer.Option(
            "--host-blocks",
            min=0,
            metavar="N",
            show_default=False,
            help="Most host-only blocks the salt may hold (default: uncapped).",
        ),
    ] = None,
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set (or replace) the quota of SALT.

    At its quota, each block the salt newly caches first evicts one of its own evictable blocks
    (in policy order, demoted to host as usual), never another salt's; with nothing of its own
    evictable the block is not cached. Past its host quota, its own oldest host blocks are
    dropped. No request is ever refused or preempted for a quota.
    """
    if device_blocks is None and host_blocks is None:
        raise CLIUsageError("give --device-blocks N, --host-blocks N or both")
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.set_quota(salt, device_blocks, host_blocks)
    out.result(answer, lambda: quota_table([answer]), wide=True)


@app.command("show")
def show_quota(
    salt: Annotated[
        str | None, typer.Argument(metavar="[SALT]", help="One salt (default: every salt with a quota).")
    ] = None,
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the quota of SALT, or of every salt, with what each holds now."""
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.quota(salt) if salt is not None else client.quotas()
    rows = [answer] if salt is not None else list(answer.get("quotas") or [])
    out.result(answer, lambda: quota_table(rows), wide=True)


@app.command("delete")
def delete_quota(
    salt: SaltArg,
    socket: SocketOpt = None,
    name: NameOpt = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Drop the quota of SALT (what it holds stays cached)."""
    out = Output(json_out)
    with client_for(socket, name, url=url, api_key=api_key) as client:
        answer = client.delete_quota(salt)
    out.result(answer, lambda: f"Quota of {salt!r} deleted.")


def _cap(used: Any, cap: Any) -> str:
    return f"{used} / {'-' if cap is None else cap}"


def quota_table(views: list[dict[str, Any]]) -> Table | str:
    """The quotas: per salt, use / cap on device and host, and what each quota did so far."""
    if not views:
        return "No salt has a quota."
    from rich.table import Table

    table = Table(title="Per-salt quotas", title_justify="left")
    for column in ("Salt", "Device (used / cap)", "Host (used / cap)", "Own evictions", "Not cached",
                   "Promotions cut", "Host drops"):  # fmt: skip
        table.add_column(column, no_wrap=True, justify="left" if column == "Salt" else "right")
    for view in views:
        table.add_row(
            str(view.get("salt")),
            _cap(view.get("device_blocks_used"), view.get("device_blocks")),
            _cap(view.get("host_blocks_used"), view.get("host_blocks")),
            str(view.get("device_evictions", 0)),
            str(view.get("not_cached_blocks", 0)),
            str(view.get("promotions_cut", 0)),
            str(view.get("host_drops", 0)),
        )
    table.caption = "- : uncapped. Blocks of the salt the cache saw since its quota was set."
    table.caption_justify = "left"
    return table


STATS_SALTS = 5  # salts named in the stats block; `quota show` lists them all


def quota_lines(stats: dict[str, Any]) -> list[str]:
    """The lines of ``stats`` for the salts with a quota (none without): each salt's use / cap
    and what its quota did, the first `STATS_SALTS` of them."""
    views = stats.get("salt_quotas")
    if not isinstance(views, list) or not views:
        return []
    lines = [f"  Salt Quotas: {len(views)}"]
    for view in views[:STATS_SALTS]:
        device = _cap(view.get("device_blocks_used"), view.get("device_blocks"))
        lines.append(
            f"    {view.get('salt')}: device {device}, "
            f"host {_cap(view.get('host_blocks_used'), view.get('host_blocks'))} (own evictions "
            f"{view.get('device_evictions', 0)}, not cached {view.get('not_cached_blocks', 0)}, "
            f"host drops {view.get('host_drops', 0)})"
        )
    if len(views) > STATS_SALTS:
        lines.append(f"    and {len(views) - STATS_SALTS} more (sage llm eviction quota show)")
    return lines
